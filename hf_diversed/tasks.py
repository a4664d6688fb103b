"""Alias: ``hf_diversed.tasks`` is now :mod:`hf_diversed.evaluation.tasks`; old imports keep working."""

from .evaluation.tasks import *  # noqa: F403
from .evaluation.tasks import Message, __all__, parse_split  # noqa: F401
