"""Alias: ``hf_diversed.bench`` is now :mod:`hf_diversed.evaluation.bench`; old imports keep working."""

from .evaluation.bench import *  # noqa: F403
from .evaluation.bench import __all__  # noqa: F401

if __name__ == "__main__":
    # ``python -m hf_diversed.bench`` (same as ``hf-diversed bench``)
    import sys

    from .evaluation.bench import main

    sys.exit(main())
