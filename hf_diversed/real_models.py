"""Alias: ``hf_diversed.real_models`` is now :mod:`hf_diversed.evaluation.real_models`; old imports keep working."""

from .evaluation.real_models import *  # noqa: F403
from .evaluation.real_models import DRAFT_NAME, MARKER, PROVENANCE, TARGET_NAME, __all__  # noqa: F401

if __name__ == "__main__":
    # ``python -m hf_diversed.real_models`` (same as ``hf-diversed models``)
    import sys

    from .evaluation.real_models import main

    sys.exit(main())
