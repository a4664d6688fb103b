"""Alias: ``hf_diversed.sandbox`` is now :mod:`hf_diversed.evaluation.sandbox`; old imports keep working."""

from .evaluation.sandbox import *  # noqa: F403
from .evaluation.sandbox import Status, __all__  # noqa: F401
