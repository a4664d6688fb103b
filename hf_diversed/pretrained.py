"""Alias: ``hf_diversed.pretrained`` is now :mod:`hf_diversed.modeling.pretrained`; old imports keep working."""

from .modeling.pretrained import *  # noqa: F403
