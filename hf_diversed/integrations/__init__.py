"""Integrations with other engines, each loaded by that engine's own plugin mechanism.

- ``vllm/``: the verification rules inside vLLM's speculative decoding (a ``vllm.general_plugins`` entry point).

Uses :mod:`hf_diversed.generation` (the rules) and :mod:`hf_diversed.modeling`; never imported by them.
"""
