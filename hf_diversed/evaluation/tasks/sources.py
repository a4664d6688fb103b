"""Where a task's rows come from: a local JSON Lines folder when there is one, else the Hugging Face Hub.

Precedence, per task and split:

1. ``data_dir=`` (or ``--data-dir``) when given: ``<data_dir>/<task>/<split>.jsonl`` must exist.
2. ``$HF_DIVERSED_DATA_DIR``: a folder in the same layout (it must hold the file), or ``hub`` to skip local folders.
3. ``<repo>/../shared/data`` or ``./shared/data``, where one exists and holds the file (this project's offline copy,
   ``shared/data/MANIFEST.md``).
4. The Hub: ``datasets.load_dataset(path, name, split=split)`` of the task's canonical dataset repository
   (:class:`HubDataset`), through the user's ``datasets`` cache, so ``HF_HUB_OFFLINE=1`` reads a cached copy.

Either way the rows carry the dataset's own ids (:attr:`HubDataset.id_column`, or the row's position in the split
where the dataset has none), so a row selected by id is the same row from both sources.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

DATA_DIR_ENV = "HF_DIVERSED_DATA_DIR"
HUB_ONLY = "hub"  # HF_DIVERSED_DATA_DIR=hub: read every task from the Hub, ignoring local folders


class DataNotFoundError(FileNotFoundError):
    """A task's rows are in none of the places looked at; the message says where it looked and what to do."""


@dataclasses.dataclass(frozen=True)
class HubDataset:
    """A dataset repository on the Hub: ``datasets.load_dataset(path, name, split=...)``.

    ``id_column`` is the dataset's own row id; ``None`` means it has none, and rows get an ``id`` column
    ``<task>/<split>/<position>`` (GSM8K: the row's position in the official file).
    """

    path: str
    name: str | None = None
    id_column: str | None = None

    def describe(self) -> str:
        return f"{self.path}" + (f" (config {self.name})" if self.name else "")


def _repo_candidates() -> list[Path]:
    repo_root = Path(__file__).resolve().parents[3]
    return [repo_root.parent / "shared" / "data", Path.cwd() / "shared" / "data"]


def default_data_dir() -> Path | None:
    """The local data folder, or ``None`` where there is none (then tasks load from the Hub).

    ``$HF_DIVERSED_DATA_DIR`` if set (``hub`` means none), else ``<repo>/../shared/data``, else ``./shared/data``
    (``<repo>`` is the parent of the ``hf_diversed`` package directory).

    Raises:
        DataNotFoundError: if the variable names a folder that does not exist.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        if env.strip().lower() == HUB_ONLY:
            return None
        path = Path(env).expanduser()
        if not path.is_dir():
            raise DataNotFoundError(
                f"{DATA_DIR_ENV}={env!r} is not a directory; point it at the data folder "
                f"(<task>/<split>.jsonl), or set {DATA_DIR_ENV}={HUB_ONLY} to load tasks from the Hugging Face Hub."
            )
        return path
    return next((candidate for candidate in _repo_candidates() if candidate.is_dir()), None)


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON Lines file (``.gz`` compressed or not)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def local_split_file(task: str, split: str, data_dir: str | os.PathLike[str] | None) -> Path | None:
    """The local file of ``task``/``split`` by the precedence above, or ``None`` if the Hub should serve it.

    Raises:
        DataNotFoundError: a folder that was asked for explicitly (``data_dir``, the environment variable) lacks it.
    """
    if data_dir is not None:
        path = Path(data_dir).expanduser() / task / f"{split}.jsonl"
        if not path.is_file():
            raise DataNotFoundError(
                f"{path} does not exist: pass a data folder (--data-dir, data_dir=) holding {task}/{split}.jsonl "
                "(layout: shared/data/MANIFEST.md), or none to load it from the Hugging Face Hub."
            )
        return path
    base = default_data_dir()
    if base is None:
        return None
    path = base / task / f"{split}.jsonl"
    if path.is_file():
        return path
    if os.environ.get(DATA_DIR_ENV):
        raise DataNotFoundError(
            f"{path} does not exist: {DATA_DIR_ENV}={os.environ[DATA_DIR_ENV]!r} must hold {task}/{split}.jsonl; "
            f"add it, or set {DATA_DIR_ENV}={HUB_ONLY} to load tasks from the Hugging Face Hub."
        )
    return None  # the project's folder has no such file: the Hub has the split


def load_hub_split(task: str, hub: HubDataset, split: str) -> datasets.Dataset:
    """``datasets.load_dataset(hub.path, hub.name, split=split)``, every failure as one :class:`DataNotFoundError`."""
    import datasets

    try:
        return datasets.load_dataset(hub.path, hub.name, split=split)
    except Exception as err:  # noqa: BLE001 - network, cache, auth and missing-split failures all end the same way
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataNotFoundError(
            f"cannot load {task}/{split} from the Hugging Face Hub dataset {hub.describe()}: {reason}. Connect to "
            f"the Hub (HF_HUB_OFFLINE=1 reads only the datasets cache), or set {DATA_DIR_ENV} to a folder "
            f"holding {task}/{split}.jsonl."
        ) from None


def load_split(
    task: str, hub: HubDataset, split: str, data_dir: str | os.PathLike[str] | None
) -> tuple[datasets.Dataset, str]:
    """The rows of ``task``/``split`` with an id column, and where they came from (a path, or ``hub:<repo>``)."""
    import datasets

    path = local_split_file(task, split, data_dir)
    if path is not None:
        data, source = datasets.Dataset.from_list(read_jsonl(path)), str(path)
    else:
        data, source = load_hub_split(task, hub, split), f"hub:{hub.path}"
    id_column = hub.id_column or "id"
    if id_column not in data.column_names:
        data = data.add_column(id_column, [f"{task}/{split}/{i}" for i in range(len(data))])
    return data, source


def source_of(task: str, hub: HubDataset, split: str, data_dir: str | os.PathLike[str] | None) -> str:
    """Where :func:`load_split` would read ``task``/``split`` from: a local path, or ``hub:<repo>``."""
    path = local_split_file(task, split, data_dir)
    return str(path) if path is not None else f"hub:{hub.path}"
