"""vLLM's engine with the plugin on the CPU backend, in a process of its own: on Model Runner V2, or with tensor
parallelism.

``python tests/vllm_engine.py CASE.json OUT.json``: builds ``LLM`` on the case's tiny pair as ``test_vllm.py`` builds
its engine, with ``"runner": "v2"`` on Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``; its Triton kernels in
Triton's interpreter, ``mrv2_harness.setup``, everything else vLLM's own CPU path), ``"tensor_parallel_size"``
workers (one core each) and ``"speculative"`` added to its speculative config; runs each call's requests (one vLLM
call per entry of ``calls``, as ``test_vllm._generate`` does) and each refusal, and writes the tokens, the
first-position acceptance counters and the drafted tokens. ``wrong="target"`` makes the plugin keep the target's
hidden states on Model Runner V2 one row early (a drafted row's head then reads the next row's, which has seen the
drafted token: a deliberately wrong capture that the law test must catch).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main(case: dict) -> dict:
    from test_vllm import _generate, _params, _spec_counters, speculative_config
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from hf_diversed.integrations.vllm import _mrv2

    if case.get("wrong") == "target":
        keep = _mrv2.HeadInputs.keep

        def late(self, which, hidden, states, cols):
            return keep(self, which, hidden, states, cols - 1 if which == "target" else cols)

        _mrv2.HeadInputs.keep = late
    llm = LLM(
        model=case["target"], dtype="float32", enforce_eager=True, max_model_len=256, seed=0, max_num_seqs=256,
        speculative_config={**speculative_config(case["draft"]), **case.get("speculative", {})},
        disable_log_stats=False, tensor_parallel_size=case.get("tensor_parallel_size", 1),
    )  # fmt: skip
    assert llm.llm_engine.vllm_config.use_v2_model_runner == (case.get("runner") == "v2")
    out: dict = {"calls": [], "refusals": []}
    for call in case["calls"]:
        rules = [tuple(r) if isinstance(r, list) else r for r in call["rules"]]
        before = _spec_counters(llm).get("vllm:spec_decode_num_draft_tokens", 0)
        outputs, drafts, first = _generate(llm, case["prompt"], rules, seed0=call["seed0"])
        draft_tokens = _spec_counters(llm)["vllm:spec_decode_num_draft_tokens"] - before
        out["calls"].append({"outputs": outputs, "drafts": drafts, "first": first, "draft_tokens": draft_tokens})
    for spec in case.get("refusals", []):
        try:
            llm.generate([TokensPrompt(prompt_token_ids=case["prompt"])], _params(spec, seed=0), use_tqdm=False)
            out["refusals"].append(None)
        except ValueError as err:
            out["refusals"].append(str(err))
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    case = json.loads(Path(sys.argv[1]).read_text())
    tp = case.get("tensor_parallel_size", 1)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(core % (os.cpu_count() or 1)) for core in range(tp))
    if case.get("runner") == "v2":
        import mrv2_harness

        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        mrv2_harness.setup("cpu")
    Path(sys.argv[2]).write_text(json.dumps(main(case)))
