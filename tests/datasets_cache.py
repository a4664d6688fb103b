"""Seed a `datasets` cache as `datasets.load_dataset(repo, config)` leaves it after downloading from the Hub.

A user's machine that loaded a dataset once holds ``<HF_DATASETS_CACHE>/<namespace>___<name>/<config>/<version>/
<revision>/`` with ``dataset_info.json`` and ``<name>-<split>.arrow``; with ``HF_HUB_OFFLINE=1`` the same
``load_dataset`` call reads it back. This builds that folder with ``datasets``' own JSON builder, so the tests
exercise the Hub code path offline, through the call a user's machine makes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hf_diversed.evaluation.tasks import HubDataset

REVISION = "0123456789abcdef0123456789abcdef01234567"  # stands in for the Hub commit the files came from


def seed_datasets_cache(cache: Path, hub: HubDataset, splits: dict[str, list[dict]]) -> Path:
    """Write ``splits`` (split name -> rows in the Hub's columns) as the cached copy of ``hub``; return its folder."""
    from datasets.packaged_modules.json.json import Json

    namespace, name = hub.path.split("/")
    config = hub.name or "default"
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for split, rows in splits.items():
            files[split] = [str(Path(tmp) / f"{split}.jsonl")]
            Path(files[split][0]).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        builder = Json(
            cache_dir=str(Path(tmp) / "build"), dataset_name=name, config_name=config, config_id=config,
            hash=REVISION, data_files=files,
        )  # fmt: skip
        builder.download_and_prepare()
        dest = cache / f"{namespace}___{name}" / config / str(builder.config.version) / REVISION
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(builder.cache_dir, dest)
    return dest
