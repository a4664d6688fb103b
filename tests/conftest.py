"""Tiny random causal LMs built from configs (seconds on CPU), shared by the tests.

``HF_DIVERSED_TEST_DEVICE=cuda`` builds them, and the prompts, on that device instead, so the same
specification runs on an accelerator.
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import hf_diversed  # noqa: F401  (patches generate)

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (real weights, long runs, every rule of a law test whose default run checks one) run only
    with ``RUN_SLOW=1``, as in transformers; ``.ci/run`` runs them after the default command."""
    if os.environ.get("RUN_SLOW", "").lower() in ("1", "true", "yes", "on"):
        return
    skip = pytest.mark.skip(reason="slow: set RUN_SLOW=1 to run it (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


DEVICE = torch.device(os.environ.get("HF_DIVERSED_TEST_DEVICE", "cpu"))
torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on the accelerator too

VOCAB = 128
EOS = 1


def _common(hidden: int, layers: int) -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=EOS,
        pad_token_id=2,
        initializer_range=0.2,  # peaked distributions, so drafts are sometimes accepted
    )


def build_tiny(family: str, hidden: int, layers: int, seed: int, device: torch.device = DEVICE) -> torch.nn.Module:
    """A tiny random causal LM of ``family`` ('llama', 'qwen3', 'gemma3'), the same weights on every device."""
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**_common(hidden, layers)))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=hidden // 4, **_common(hidden, layers)))
    elif family == "gemma3":
        config = Gemma3TextConfig(head_dim=hidden // 4, sliding_window=16, **_common(hidden, layers))
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(family)
    model.generation_config.assistant_confidence_threshold = 0.0  # draft full blocks
    model.generation_config.num_assistant_tokens = 4
    return model.to(device).eval()


def build_pair(family: str = "llama") -> tuple[torch.nn.Module, torch.nn.Module]:
    """(target, draft): the draft is a copy of the target with perturbed weights, so they agree often."""
    target = build_tiny(family, hidden=64, layers=2, seed=0)
    draft = build_tiny(family, hidden=64, layers=2, seed=0, device=torch.device("cpu"))
    torch.manual_seed(1)
    with torch.no_grad():  # drawn on the CPU: the same draft whatever the test device
        for param in draft.parameters():
            param.add_(0.05 * param.std() * torch.randn_like(param) if param.numel() > 1 else 0)
    return target, draft.to(DEVICE)


@pytest.fixture(scope="session")
def llama_pair():
    return build_pair("llama")


@pytest.fixture(scope="session")
def small_draft_pair():
    """Target and draft of different widths (64 vs 32), as in real pairs."""
    return build_tiny("llama", hidden=64, layers=2, seed=0), build_tiny("llama", hidden=32, layers=1, seed=3)


def require_data_dir():
    """The real data folder (``../shared/data`` or ``$HF_DIVERSED_DATA_DIR``), or skip where a machine has none.

    Under CI (``$CI`` set) a missing folder fails instead: CI has the data, and a skip there would hide the tests."""
    from hf_diversed.evaluation.tasks import default_data_dir

    try:
        found = default_data_dir()
    except FileNotFoundError as err:
        found, reason = None, str(err)
    else:
        reason = "no local data folder (../shared/data or $HF_DIVERSED_DATA_DIR)"
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must see the data folder: {reason}")
        pytest.skip(f"{reason}: these tests check the local copy's rows")
    return found


def prompts(n: int, length: int = 6, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (1, length + i), generator=g).to(DEVICE) for i in range(n)]


# A real tokenizer with a chat template, for tests of the task pipelines (bench, distillation).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer (any text encodes) trained in memory, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def chat_model(tokenizer, seed: int, noise: float = 0.0) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    if noise:
        torch.manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(noise * param.std() * torch.randn_like(param) if param.numel() > 1 else 0)
    return model.to(DEVICE)
