"""Copy the vLLM sources that Model Runner V2's verification kernels need into a folder, for a GPU machine where
vLLM itself is not installed (its wheel and dependencies are far larger than what travels there).

``python tests/mrv2_bundle.py DEST`` (with vLLM installed here) writes ``DEST/vllm/``: vLLM's own
``rejection_sampler_utils.py`` and the modules it imports (Gumbel sampling, watermarking's Philox PRF) unchanged,
empty package ``__init__`` files, and a ``vllm.triton_utils`` that hands out the real Triton. With ``DEST`` on
``PYTHONPATH`` the harness's ``through="kernel"`` draws run those kernels compiled (``docs/vllm.md``, "On a GPU").
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

SOURCES = [
    "v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
    "v1/worker/gpu/sample/gumbel.py",
    "v1/worker/gpu/sample/watermark.py",
    "v1/watermarking/prfs/base.py",
    "v1/watermarking/prfs/philox.py",
]
TRITON_UTILS = '''"""The real Triton (vLLM's own module also decides whether Triton has a backend here)."""
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice

HAS_TRITON = True
'''


def bundle(dest: Path) -> list[Path]:
    import vllm

    root = Path(vllm.__file__).parent
    out = dest / "vllm"
    if out.exists():
        shutil.rmtree(out)
    written = []
    for rel in SOURCES:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
        written.append(target)
    for package in {p for rel in SOURCES for p in (out / rel).parents if p.is_relative_to(out)}:
        (package / "__init__.py").touch()
    (out / "triton_utils").mkdir()
    (out / "triton_utils" / "__init__.py").write_text(TRITON_UTILS)
    (out / "VERSION").write_text(vllm.__version__ + "\n")
    return written


if __name__ == "__main__":
    for path in bundle(Path(sys.argv[1])):
        print(path)
