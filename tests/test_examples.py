"""The README's runnable examples run offline, as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "script, expected",
    [
        ("quickstart.py", ["DIVERSED", "cascade-opt:0.2", "loaded head"]),
        ("batched_sampling.py", ["prompt 1 diversed", "generate, prompt 0 diversed"]),
        ("trim_draft_vocabulary.py", ["kept 8 of 64 ids", "exact     :", "proposes from its kept ids: Trimmed"]),
        ("train_head_tiny.py", ["untrained head: acceptance", "trained   head: acceptance", "model card"]),
        ("lenience_head.py", ["= lossy:0.3 token for token: True", "varying lenience head: mean l"]),
        (
            "compiled_generation.py",
            [
                "compiled ahead for attention windows [69]",
                "same tokens as the dynamic loop: True",
                "static cache, eager:",
                "packed linear weights, same tokens: True",
            ],
        ),
    ],
)
def test_example_runs(script, expected):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(ROOT / "examples" / script)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for text in expected:
        assert text in result.stdout
