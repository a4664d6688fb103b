"""What transformers does on a tiny grouped-query Llama, as JSON: run in a fresh interpreter by test_import_isolation.

``python import_probe.py plain``: transformers alone. ``... imported``: after ``import hf_diversed``.
``... after-call``: after ``import hf_diversed`` and one DIVERSED ``generate`` (whose patches must be gone).
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging


def tiny(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        initializer_range=0.2,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def main(mode: str) -> dict:
    torch.set_num_threads(1)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(f"{record.levelname}: {record.getMessage()}")
    hf_logging.get_logger("transformers").addHandler(handler)
    target, draft = tiny(0), tiny(1)
    prompt = torch.tensor([[0, 5, 9, 5, 9, 5, 7, 3, 5, 9]])
    if mode != "plain":
        import hf_diversed  # noqa: F401

    if mode == "after-call":
        torch.manual_seed(0)
        target.generate(prompt, assistant_model=draft, diversed_verifier="static:0.5", do_sample=True, max_new_tokens=6)
        records.clear()  # the DIVERSED call's own log lines are not under test, and the once-only ones may recur
        hf_logging.warning_once.cache_clear()
        hf_logging.info_once.cache_clear()

    out: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:  # the failure names Dynamo's reason, so two different failures compare unequal too
            compiled = torch.compile(target.forward, fullgraph=True, backend="eager")
            with torch.no_grad():
                logits = compiled(prompt).logits
            out["compile_fullgraph"] = logits[0, -1].argsort()[-5:].tolist()
        except Exception as error:  # noqa: BLE001
            out["compile_fullgraph"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        torch._dynamo.reset()

        def tokens(seed: int = 0, **kwargs) -> list[int]:
            torch.manual_seed(seed)
            return target.generate(prompt, max_new_tokens=12, **kwargs)[0].tolist()

        out["greedy"] = tokens(do_sample=False)
        out["sample"] = tokens(do_sample=True, temperature=1.0)
        out["beam"] = tokens(do_sample=False, num_beams=3)
        out["prompt_lookup"] = tokens(do_sample=False, prompt_lookup_num_tokens=3)
        out["assisted_greedy"] = tokens(do_sample=False, assistant_model=draft)
        out["assisted_sample"] = tokens(do_sample=True, assistant_model=draft)
        out["static_cache"] = tokens(do_sample=False, cache_implementation="static")
    out["log"] = records
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
