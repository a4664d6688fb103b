"""The package layout: dependencies between the folders point one way, and each thing has one import path.

    modeling/    the head and where heads come from            imports modeling
    generation/  the generate hook and the batched sampler     imports generation, modeling
    evaluation/  tasks, sandbox, real models, bench            imports evaluation, generation, modeling
    trainer/     the head's RL trainer, the draft distillation imports trainer, evaluation, generation, modeling
    integrations/ other engines' plugins (vLLM)                  imports integrations, generation, modeling
    cli/         ``hf-diversed``                               imports anything

At the top of the package there is only ``__init__.py`` (the public API): no alias modules of moved ones.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import hf_diversed

PACKAGE = pathlib.Path(hf_diversed.__file__).parent
FOLDERS = ("modeling", "generation", "evaluation", "trainer", "integrations", "cli")
ALLOWED = {
    "modeling": {"modeling"},
    "generation": {"generation", "modeling"},
    "evaluation": {"evaluation", "generation", "modeling"},
    "trainer": {"trainer", "evaluation", "generation", "modeling"},
    "integrations": {"integrations", "generation", "modeling"},
}
# removed alias modules: nothing may import them
OLD_PATHS = {"batched", "bench", "hub", "pretrained", "real_models", "sandbox", "tasks", "verification"}


def _imported_parts(path: pathlib.Path) -> set[str]:
    """The first component under ``hf_diversed`` of every module ``path`` imports ("" for the package itself)."""
    package = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)[:-1]  # where relative imports start
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            # ``from hf_diversed import x`` / ``from .. import x`` imports the submodule x (or a name of the package)
            targets = [module + [alias.name] for alias in node.names] if module == ["hf_diversed"] else [module]
        else:
            continue
        for target in targets:
            if target[0] == "hf_diversed":
                part = target[1] if len(target) > 1 else ""
                parts.add("" if part in (*hf_diversed.__all__, "__version__") else part)
    return parts


@pytest.mark.parametrize("folder", FOLDERS)
def test_dependencies_point_one_way(folder):
    files = sorted((PACKAGE / folder).rglob("*.py"))
    assert files
    for path in files:
        parts = _imported_parts(path)
        assert not parts & OLD_PATHS, f"{path} imports a removed module path: use the one under a folder"
        if folder in ALLOWED:
            # the package itself ("": ``import hf_diversed``) is the generation API: not for generation/ or modeling/
            allowed = ALLOWED[folder] | ({""} if "generation" in ALLOWED[folder] - {folder} else set())
            assert parts <= allowed, f"{path} imports hf_diversed.{sorted(parts - allowed)}"


def test_import_scan_sees_relative_and_lazy_imports():
    probe = PACKAGE / "generation" / "decoding.py"
    assert _imported_parts(probe) >= {"generation", "modeling"}
    # runner.py imports generation/ and modeling/ only inside functions
    assert _imported_parts(PACKAGE / "evaluation" / "bench" / "runner.py") >= {"evaluation", "generation", "modeling"}


def test_top_level_holds_only_the_api():
    assert {path.stem for path in PACKAGE.glob("*.py")} == {"__init__"}
    for old in OLD_PATHS:
        with pytest.raises(ModuleNotFoundError):
            __import__(f"hf_diversed.{old}")
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == {*FOLDERS, "custom_generate"}


def test_public_paths_of_the_readme():
    from hf_diversed.cli import main
    from hf_diversed.evaluation.bench import BenchConfig, run_bench, summarize_records
    from hf_diversed.evaluation.tasks import get_task
    from hf_diversed.modeling.hub import push_head_folder, seed_hf_cache
    from hf_diversed.modeling.pretrained import export_head_repo
    from hf_diversed.trainer import DiversedTrainer, DiversedTrainerConfig

    assert all(
        callable(x)
        for x in (BenchConfig, run_bench, summarize_records, main, push_head_folder, seed_hf_cache, export_head_repo)
    )
    assert get_task("gsm8k").name == "gsm8k"
    assert DiversedTrainer.__module__ == "hf_diversed.trainer.diversed_trainer"
    assert DiversedTrainerConfig.__module__ == "hf_diversed.trainer.diversed_config"


def test_only_the_vllm_compat_module_imports_vllm():
    """Every touch of vLLM's internals sits in ``integrations/vllm/_compat.py`` (pinned to a tested range)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "integrations" / "vllm" / "_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            assert not any(n == "vllm" or n.startswith("vllm.") for n in names), path
