"""Alias: ``hf_diversed.batched`` is now :mod:`hf_diversed.generation.batched`; old imports keep working."""

from .generation.batched import *  # noqa: F403
from .generation.batched import SampleTrace, __all__, _Sampler  # noqa: F401
