"""Decoding methods compared by the demo and the benchmark, and one timed generation of each."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..generation.stats import DiversedStats
from ..generation.verification import parse_rule, parse_token_class_spec
from ..modeling.modeling_diversed_head import DiversedHead


@dataclass(frozen=True)
class Method:
    """A decoding method: ``"ar"`` (target alone), ``"native-exact"`` / ``"native-static:W"`` (transformers'
    own assisted generation), any :func:`~hf_diversed.generation.verification.parse_rule` spec (hf_diversed's loop),
    or ``"diversed"`` with a head."""

    spec: str

    def __post_init__(self):
        if self.spec in ("ar", "native-exact") or self.spec.startswith("native-static:"):
            if self.spec.startswith("native-static:"):
                float(self.spec.split(":", 1)[1])
            return
        if parse_token_class_spec(self.spec) is None:  # a token class is resolved with the tokenizer later
            parse_rule(self.spec)  # raises with the valid forms

    @property
    def needs_tokenizer(self) -> bool:
        """Token-class rules find their class in the tokenizer's vocabulary."""
        return parse_token_class_spec(self.spec) is not None

    @property
    def uses_draft(self) -> bool:
        return self.spec != "ar"

    def generate_kwargs(self, draft, head: DiversedHead | None) -> dict:
        if self.spec == "ar":
            return {}
        if self.spec == "native-exact":
            return {"assistant_model": draft}
        if self.spec.startswith("native-static:"):
            return {"assistant_model": draft, "assistant_ensemble_weight": float(self.spec.split(":", 1)[1])}
        if self.spec == "diversed":
            if head is None:
                raise ValueError("Method 'diversed' needs a head: pass --head ORG/NAME or a local directory.")
            return {"assistant_model": draft, "diversed_head": head}
        return {"assistant_model": draft, "diversed_verifier": self.spec}


def sampling_kwargs(temperature: float) -> dict:
    """``generate`` kwargs for greedy (T = 0) or plain temperature sampling."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}.")
    common = dict(top_k=0, top_p=1.0, repetition_penalty=1.0)  # neutral values override model defaults
    if temperature == 0:
        return dict(do_sample=False, temperature=1.0, **common)
    return dict(do_sample=True, temperature=float(temperature), **common)


@dataclass
class GenerationRecord:
    new_tokens: torch.Tensor  # (T,)
    seconds: float
    stats: DiversedStats | None

    @property
    def tokens_per_second(self) -> float:
        return len(self.new_tokens) / self.seconds if self.seconds > 0 else float("nan")


def timed_generate(
    target,
    draft,
    input_ids: torch.Tensor,
    method: Method,
    *,
    max_new_tokens: int,
    temperature: float,
    num_assistant_tokens: int = 5,
    head: DiversedHead | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    **generate_kwargs,
) -> GenerationRecord:
    """Generate once with ``method`` from ``input_ids`` (batch 1) and time it on ``clock`` (seconds).

    ``temperature`` 0 is greedy; otherwise plain sampling at that temperature (no top-k / top-p /
    repetition penalty, whatever the model's generation config says), the paper's setting.
    """
    if draft is not None:
        draft.generation_config.num_assistant_tokens = num_assistant_tokens
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0  # fixed draft length N, as in the paper
    kwargs = dict(max_new_tokens=max_new_tokens, return_dict_in_generate=True, **sampling_kwargs(temperature))
    kwargs.update(generate_kwargs)
    torch.manual_seed(seed)
    start = clock()
    out = target.generate(input_ids, **method.generate_kwargs(draft, head), **kwargs)
    seconds = clock() - start
    return GenerationRecord(out.sequences[0, input_ids.shape[1] :], seconds, getattr(out, "diversed_stats", None))
