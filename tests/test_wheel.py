"""The package installed as a wheel, the way users install it: every data file it reads ships inside.

The wheel is built from this checkout and installed (without dependencies) in a fresh virtual environment that
borrows this interpreter's site-packages for torch and transformers; everything then runs from a folder outside
the repository, so nothing can be read from the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` folder of a fresh venv with the wheel of this checkout installed."""
    root = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"),
         str(REPO)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (root / "dist").glob("hf_diversed-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root / "venv")], check=True)
    bin_dir = root / "venv" / "bin"
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    return bin_dir


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HOME"] = str(cwd / "hf")  # a fresh Hub cache: the bundled heads are seeded from the wheel's files
    done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done


def test_the_wheel_carries_every_data_file(installed: Path) -> None:
    (wheel,) = installed.parent.parent.glob("dist/hf_diversed-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "hf_diversed/evaluation/demo_prompts.jsonl",
        "hf_diversed/evaluation/gguf_sources.json",
        "hf_diversed/modeling/model_cards/diversed_head.md",
        "hf_diversed/modeling/model_cards/usage/gsm8k.py",
        "hf_diversed/custom_generate/generate.py",
        "hf_diversed/modeling/heads/diversed-head-qwen2.5-coder-1.5b-gsm8k/model.safetensors",
    ):
        assert expected in names


RENDER = """
import json, sys, tempfile
import hf_diversed
from hf_diversed.modeling.pretrained import PRETRAINED_HEADS, export_head_repo
head = PRETRAINED_HEADS[0]
with tempfile.TemporaryDirectory() as tmp:
    repo = export_head_repo(head.folder, tmp + "/repo", "org/my-head")
    card = (repo / "README.md").read_text()
print(json.dumps({"file": hf_diversed.__file__, "card": card}))
"""


def test_installed_package_renders_a_head_card_and_runs_the_quickstart(installed: Path, tmp_path: Path) -> None:
    out = json.loads(_run(installed, str(installed / "python"), "-c", RENDER, cwd=tmp_path).stdout.splitlines()[-1])
    assert Path(out["file"]).is_relative_to(installed.parent)  # the wheel's copy, not the checkout
    card = out["card"]
    assert "## Use" in card and 'diversed_head="org/my-head"' in card and "### Serving with vLLM" in card
    assert "Question: Natalia sold clips" in card  # the task's usage prompt, read from the wheel
    assert "Q4_K_M GGUF copies" in card  # the head's provenance

    shutil.copy2(REPO / "examples" / "quickstart.py", tmp_path / "quickstart.py")
    _run(installed, str(installed / "python"), "quickstart.py", cwd=tmp_path)
    assert "--weights" in _run(installed, str(installed / "hf-diversed"), "demo", "--help", cwd=tmp_path).stdout
