"""Where a user has no data folder (a fresh clone, no ``../shared``) and no Hub: the demo still runs, and the
bench says in one line what is missing and how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hf_diversed.evaluation.tasks import DATA_DIR_ENV, HUB_ONLY


def _cli(tmp_path, *argv: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {
        **os.environ, DATA_DIR_ENV: HUB_ONLY, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"),
        "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "OMP_NUM_THREADS": "2",
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "hf_diversed.cli", *argv], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=timeout,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["bench", "--tasks", "gsm8k", "--num-examples", "2"], ["openai/gsm8k", DATA_DIR_ENV]),
        (["bench", "--tasks", "xsum", "--split", "train[:5]", "--num-examples", "2"], ["EdinburghNLP/xsum"]),
        (["bench", "--tasks", "gsm8k", "--split", "dev"], ["no split 'dev'", "train, test"]),
        (["bench", "--tasks", "squad"], ["unknown task", "gsm8k, mbpp"]),
        (["demo", "--task", "squad"], ["unknown task", "gsm8k, mbpp"]),
        (["demo", "--task", "cnndm"], ["abisee/cnn_dailymail", DATA_DIR_ENV]),
        (["demo", "--example", "9"], ["ships gsm8k test rows 0-2"]),
    ],
)
def test_missing_data_and_wrong_names_are_one_line_errors(tmp_path, argv, names):
    done = _cli(tmp_path, *argv, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"hf-diversed {argv[0]}: error: ") and all(n in lines[0] for n in names), lines[0]


@pytest.mark.slow
@pytest.mark.real_weights
def test_demo_runs_without_data_folder_or_hub(tmp_path):
    """README's main job, with no data folder and the Hub offline: the demo's prompt ships with the package."""
    pytest.importorskip("gguf")
    done = _cli(tmp_path, "demo", "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| method | tokens | tok/s | speedup |" in done.stdout
    assert "| diversed (hf-diversed/diversed-head-qwen2.5-coder-1.5b-gsm8k) |" in done.stdout
