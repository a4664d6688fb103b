"""Loading DIVERSED heads from the Hub, the local HF cache or a directory."""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub.errors import HFValidationError

from .configuration_diversed_head import DiversedHeadConfig
from .modeling_diversed_head import DiversedHead

_loaded: dict[tuple[str, float, str], DiversedHead] = {}


def _cache_key(name_or_path: str) -> tuple[str, float]:
    weights = Path(name_or_path) / "model.safetensors"
    return (name_or_path, weights.stat().st_mtime if weights.is_file() else 0.0)


def _snapshot(repo_id: str, revision: str | None) -> str:
    # One snapshot call: downloads when online and falls back to the HF cache at once when the Hub cannot be
    # reached (per-file lookups would each retry with back-off first).
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, revision=revision, allow_patterns=["config.json", "model.safetensors"])


def load_head(name_or_path: str | os.PathLike, *, revision: str | None = None, cache: bool = True) -> DiversedHead:
    """Load a :class:`DiversedHead` from a Hub repo id (online, or from the HF cache when offline) or a directory.

    Only safetensors weights are read, and no repository code is ever executed (the head class is this
    package's own). Loaded heads are memoised per id/path (a rewritten local directory is reloaded).
    """
    name = os.fspath(name_or_path)
    key = (*_cache_key(name), revision or "")
    if cache and key in _loaded:
        return _loaded[key]
    try:
        folder = name if os.path.isdir(name) else _snapshot(name, revision)
        config = DiversedHeadConfig.from_pretrained(folder)
        head = DiversedHead.from_pretrained(folder, config=config, use_safetensors=True)
    except (OSError, HFValidationError, ValueError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        where = "the Hub" if not offline else "the local Hugging Face cache (HF_HUB_OFFLINE is set)"
        raise OSError(
            f"Could not load the DIVERSED head {name!r}: it is not a directory with config.json and "
            f"model.safetensors, and it could not be found in {where}. Pass a local directory saved with "
            f"`head.save_pretrained(dir)`, or a Hub id such as 'org/head-gsm8k' after downloading it "
            f"(`hf download org/head-gsm8k`) while online; the heads bundled with hf-diversed (hf-diversed/...) are "
            f"put in the cache by `hf-diversed heads`. Cause: {err}"
        ) from err
    if config.model_type != DiversedHeadConfig.model_type:
        raise ValueError(f"{name!r} holds a {config.model_type!r} model, not a DIVERSED head (diversed_head).")
    head.eval()
    if cache:
        _loaded[key] = head
    return head


HEAD_FILES = ("config.json", "model.safetensors", "README.md")
CUSTOM_GENERATE_FILES = ("custom_generate/generate.py", "custom_generate/requirements.txt")
_HEAD_REPO_ID_LINE = 'HEAD_REPO_ID = "__DIVERSED_HEAD_REPO_ID__"'


def write_custom_generate(folder: str | os.PathLike, repo_id: str) -> Path:
    """Write ``folder/custom_generate/`` (generate.py for ``repo_id``'s head, requirements.txt); return that folder.

    With it a head repository runs DIVERSED decoding without hf-diversed installed, through transformers'
    ``target.generate(..., assistant_model=draft, custom_generate=repo_id, trust_remote_code=True)``.
    ``repo_id`` (a Hub id, or a local directory) is the head that generate.py loads when the call passes no
    ``diversed_head=``: transformers neither passes the repository to the code nor runs it from there.
    """
    import json
    from importlib import resources

    if not isinstance(repo_id, str) or not repo_id:
        raise ValueError(f"`repo_id` must be the head's Hub id (e.g. 'org/head-gsm8k'), got {repo_id!r}.")
    template = resources.files("hf_diversed") / "custom_generate"
    source = template.joinpath("generate.py").read_text(encoding="utf-8")
    if source.count(_HEAD_REPO_ID_LINE) != 1:
        raise RuntimeError(f"hf_diversed/custom_generate/generate.py must hold the line {_HEAD_REPO_ID_LINE!r} once.")
    dest = Path(folder) / "custom_generate"
    dest.mkdir(parents=True, exist_ok=True)
    line = f"HEAD_REPO_ID = {json.dumps(repo_id)}"
    (dest / "generate.py").write_text(source.replace(_HEAD_REPO_ID_LINE, line), encoding="utf-8")
    (dest / "requirements.txt").write_text(template.joinpath("requirements.txt").read_text(encoding="utf-8"))
    return dest


def push_head_folder(folder: str | os.PathLike, repo_id: str, *, private: bool | None = None, token=None) -> str:
    """Upload a saved head (config.json, model.safetensors, README.md model card, and ``custom_generate/`` when
    present) to the Hub in one commit.

    Returns the commit URL. Checkpoints, logs and optimizer states in ``folder`` are not uploaded.
    """
    from huggingface_hub import HfApi

    folder = Path(folder)
    missing = [name for name in HEAD_FILES[:2] if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: save the head there first (save_pretrained).")
    patterns = list(HEAD_FILES) + [name for name in CUSTOM_GENERATE_FILES if (folder / name).is_file()]
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        allow_patterns=patterns,
        commit_message="Upload DIVERSED head",
    )
    return str(info)


def seed_hf_cache(repo_id: str, folder: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Place the files of ``folder`` in the local Hugging Face cache as revision ``main`` of model ``repo_id``.

    With ``HF_HUB_OFFLINE=1``, ``from_pretrained(repo_id)`` (and ``diversed_head=repo_id``) then resolve to
    these files exactly as they would after a download. ``cache_dir`` defaults to the hub cache of
    ``HF_HOME``. Returns the snapshot directory.
    """
    import hashlib
    import shutil

    from huggingface_hub import constants

    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"{folder} has no files to put in the cache; save a head there first.")
    digest = hashlib.sha1()
    for path in files:
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    commit = digest.hexdigest()
    repo_dir = Path(cache_dir or constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    for path in files:
        dest = snapshot / path.relative_to(folder)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot
