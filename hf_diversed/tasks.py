"""Alias: ``hf_diversed.tasks`` is now :mod:`hf_diversed.evaluation.tasks`; old imports keep working."""

from .evaluation.tasks import *  # noqa: F403
from .evaluation.tasks import __all__  # noqa: F401
