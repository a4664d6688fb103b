"""``python -m hf_diversed.evaluation.bench [options]`` (same as ``hf-diversed bench [options]``)."""

import sys

from . import main

sys.exit(main())
