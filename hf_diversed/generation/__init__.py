"""The ``generate`` hook: what ``import hf_diversed`` teaches ``generate``, and the batched sampler of the same law.

- ``api.py``: the ``diversed_head=`` / ``diversed_verifier=`` arguments, validated once, at the boundary.
- ``decoding.py``: the assisted-decoding loop with a pluggable verification rule.
- ``candidate_generator.py``: the draft side (transformers' drafting plus the draft's last hidden states).
- ``verification.py``: the verification rules, pure tensor maths.
- ``stats.py``: per-call statistics.
- ``batched.py``: the batched law-exact sampler (many sequences at once, the law of ``generate``).
- ``_compat.py``: the only module that touches transformers' private generation internals.

Nothing here imports :mod:`hf_diversed.evaluation`, :mod:`hf_diversed.trainer` or :mod:`hf_diversed.cli`.
"""
