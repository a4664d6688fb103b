"""The ``generate`` hook: what ``import hf_diversed`` teaches ``generate``, and the batched sampler of the same law.

- ``api.py``: the ``diversed_head=`` / ``diversed_verifier=`` arguments, validated once, at the boundary.
- ``decoding.py``: the assisted-decoding loop with a pluggable verification rule.
- ``static_loop.py``: the same loop on static caches, its steps compiled (``cache_implementation="static"``).
- ``candidate_generator.py``: the draft side (transformers' drafting plus the draft's last hidden states).
- ``verification.py``: the verification rules, pure tensor maths.
- ``checks.py``: what a pair and a call must satisfy, shared by the loops and the sampler.
- ``stats.py``: per-call statistics.
- ``trace.py``: the per-position trace (what the head saw, what the rule did), for rollouts and diagnostics.
- ``batched.py``: the batched law-exact sampler (many sequences at once, the law of ``generate``).
- ``_compat.py``: the only module that touches transformers' private generation internals.

Imports between these modules point one way (``tests/test_layout.py``). Nothing here imports
:mod:`hf_diversed.evaluation`, :mod:`hf_diversed.trainer` or :mod:`hf_diversed.cli`.
"""
