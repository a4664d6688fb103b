"""The DIVERSED ensemble head as a transformers model, and where heads come from.

- ``configuration_diversed_head.py`` / ``modeling_diversed_head.py``: ``DiversedHeadConfig`` and ``DiversedHead``.
- ``hub.py``: loading heads from the Hub, the local HF cache or a directory; pushing them; ``custom_generate/``.
- ``pretrained.py`` + ``heads/``: the bundled pretrained heads, complete Hub repositories.
- ``model_card.py``: model cards of head repositories.
- ``dtypes.py``: which dtype to run the language models in (``--dtype auto``).
- ``distances.py``: TV(p, q) between next-token laws (the head's features and the rules read it).
- ``draft_vocabulary.py``: a draft LM head trimmed to K token ids (``trim_draft_vocabulary``).
- ``packed_linear.py``: linear layers on oneDNN's blocked weights for CPU decoding (``pack_linear_weights``).

Nothing here imports :mod:`hf_diversed.generation`, :mod:`hf_diversed.evaluation`, :mod:`hf_diversed.trainer`
or :mod:`hf_diversed.cli`.
"""
