"""Alias: ``hf_diversed.hub`` is now :mod:`hf_diversed.modeling.hub`; old imports keep working."""

from .modeling.hub import *  # noqa: F403
