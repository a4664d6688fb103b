"""``python -m hf_diversed.cli`` (same as ``hf-diversed``)."""

import sys

from .main import main

sys.exit(main())
