"""Pretrained DIVERSED heads for the real pair, bundled with the package and served the Hub way.

Each head's own files live in ``hf_diversed/modeling/heads/<name>/`` (config.json, model.safetensors, README.md
model card); :meth:`PretrainedHead.write_repo` adds the shared ``custom_generate/`` recipe for its id, which
makes the complete Hub repository. :func:`seed_pretrained_heads` places those repositories in the local
Hugging Face cache under their Hub ids, so that ``diversed_head="hf-diversed/<name>"`` (and
``custom_generate="hf-diversed/<name>"``) resolve offline exactly as after a download; once the repositories
are pushed, the same ids resolve on the Hub unchanged. ``hf-diversed models`` and ``hf-diversed demo`` seed
the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

ORG = "hf-diversed"
BUNDLED_FILES = ("config.json", "model.safetensors", "README.md")
HEADS_DIR = Path(__file__).resolve().parent / "heads"


@dataclass(frozen=True)
class PretrainedHead:
    """A bundled head: ``repo_id`` on the Hub, the task it was trained for, and where its files are."""

    repo_id: str
    task: str

    @property
    def folder(self) -> Path:
        """The bundled files: config.json, model.safetensors, README.md."""
        return HEADS_DIR / self.repo_id.split("/", 1)[1]

    def write_repo(self, dest: str | os.PathLike) -> Path:
        """The complete Hub repository in ``dest``: the bundled files plus ``custom_generate/`` for this id."""
        from .hub import write_custom_generate

        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for name in BUNDLED_FILES:
            shutil.copy2(self.folder / name, dest / name)
        write_custom_generate(dest, self.repo_id)
        return dest


PRETRAINED_HEADS: tuple[PretrainedHead, ...] = (
    PretrainedHead(f"{ORG}/diversed-head-qwen2.5-coder-1.5b-gsm8k", "gsm8k"),
    PretrainedHead(f"{ORG}/diversed-head-qwen2.5-coder-1.5b-mbpp", "mbpp"),
    PretrainedHead(f"{ORG}/diversed-head-qwen2.5-coder-1.5b-cnndm", "cnndm"),
)


def available_heads() -> list[PretrainedHead]:
    """The bundled heads whose files are present."""
    return [h for h in PRETRAINED_HEADS if (h.folder / "model.safetensors").is_file()]


def head_for_task(task: str) -> str | None:
    """The Hub id of the bundled head trained for ``task`` (None if there is none)."""
    return next((h.repo_id for h in available_heads() if h.task == task), None)


def seed_pretrained_heads(cache_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """Put every bundled head in the local HF hub cache (default: that of ``HF_HOME``); returns snapshot dirs.

    Idempotent: the snapshot's commit id is a hash of the files, so re-seeding unchanged heads rewrites
    nothing new, and a changed head becomes the new ``main``.
    """
    from .hub import seed_hf_cache

    snapshots = {}
    for head in available_heads():
        with tempfile.TemporaryDirectory() as tmp:
            snapshots[head.repo_id] = seed_hf_cache(head.repo_id, head.write_repo(tmp), cache_dir)
    return snapshots


def export_head_repo(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    repo_id: str,
    *,
    target_model: str | None = None,
    draft_model: str | None = None,
    custom_generate: bool = True,
) -> Path:
    """Turn a trained head folder (``DiversedTrainer`` output) into a Hub repository folder for ``repo_id``.

    Writes config.json (provenance set to ``target_model``/``draft_model``, e.g. Hub ids instead of local
    paths), model.safetensors, a README.md model card rendered for ``repo_id`` (keeping the source card's
    Training and Evaluation sections) and, with ``custom_generate``, ``custom_generate/`` (a mixture head's: the
    standalone recipe does not run a lenience head, whose card says so). ``dest`` is replaced.
    """
    from .hub import write_custom_generate
    from .model_card import card_section, render_head_card, weights_sentence

    source, dest = Path(source), Path(dest)
    missing = [n for n in ("config.json", "model.safetensors") if not (source / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{source} lacks {', '.join(missing)}: pass the output_dir of a finished training run.")
    config = json.loads((source / "config.json").read_text())
    config["target_model"] = target_model or config.get("target_model")
    config["draft_model"] = draft_model or config.get("draft_model")
    old_card = (source / "README.md").read_text() if (source / "README.md").is_file() else ""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.copy2(source / "model.safetensors", dest / "model.safetensors")
    card = render_head_card(
        repo_id=repo_id,
        target_model=config["target_model"],
        draft_model=config["draft_model"],
        vocab_size=config.get("vocab_size"),
        task=config.get("task"),
        weights=weights_sentence(config.get("training_weights")),
        training=card_section(old_card, "Training") or "Not recorded.",
        evaluation=card_section(old_card, "Evaluation") or "Not evaluated.",
        verification=config.get("verification", "mixture"),
    )
    (dest / "README.md").write_text(card)
    if custom_generate and config.get("verification", "mixture") == "mixture":  # it runs mixture heads only
        write_custom_generate(dest, repo_id)
    return dest
