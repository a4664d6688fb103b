"""Alias: ``hf_diversed.verification`` is now :mod:`hf_diversed.generation.verification`; old imports keep working."""

from .generation.verification import *  # noqa: F403
from .generation.verification import RULE_SPECS, __all__  # noqa: F401
