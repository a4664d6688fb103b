"""The package layout: dependencies between the folders point one way, and each thing has one import path.

    modeling/    the head and where heads come from            imports modeling
    generation/  the generate hook and the batched sampler     imports generation, modeling
    evaluation/  tasks, sandbox, real models, bench            imports evaluation, generation, modeling
    trainer/     the head's RL trainer, the draft distillation imports trainer, evaluation, generation, modeling
    integrations/ other engines' plugins (vLLM)                  imports integrations, generation, modeling
    cli/         ``hf-diversed``                               imports anything

At the top of the package there is only ``__init__.py`` (the public API): no alias modules of moved ones. Inside
generation/ the modules import each other without a circle (lazy imports inside functions count too).
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


def _module_imports(folder: pathlib.Path) -> dict[str, set[str]]:
    """Each module of ``folder`` (a flat package) -> the modules of the same folder it imports, anywhere in it."""
    package = ".".join(folder.relative_to(PACKAGE.parent).parts)
    modules = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    graph = {}
    for name in modules:
        path = folder / f"{name}.py"
        imported = []  # full dotted names: ``from . import x`` and ``from .x import y`` both import package.x
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package if node.level == 1 else "" if node.level == 0 else None
                if base is None:  # ``from ..x``: outside the folder
                    continue
                module = ".".join(filter(None, [base, node.module]))
                imported += [module] + [f"{module}.{alias.name}" for alias in node.names]
        inside = (m.removeprefix(package + ".").split(".")[0] for m in imported if m.startswith(package + "."))
        graph[name] = set(inside) & modules
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in ``graph`` (module -> modules it imports), as a path that ends where it starts."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    return next((c for c in (visit(node, []) for node in sorted(graph)) if c), None)


def test_generation_modules_import_one_way():
    """api imports the loops, the loops import their parts; nothing below imports back up (a circle would make a
    module's import order matter, and once made batched reach for api's checks inside functions)."""
    graph = _module_imports(PACKAGE / "generation")
    assert {"api", "decoding", "static_loop", "batched", "checks", "_compat"} <= set(graph)
    assert graph["api"] >= {"decoding", "static_loop", "checks"} and "api" not in graph["batched"]
    assert _circle(graph) is None, " -> ".join(_circle(graph))


def test_the_circle_check_finds_an_added_circle():
    """The check on the graph as it was: static_loop took its processor set from batched, and batched imported
    api's checks inside functions (api -> static_loop -> batched -> api)."""
    graph = _module_imports(PACKAGE / "generation")
    graph["static_loop"] = graph["static_loop"] | {"batched"}
    graph["batched"] = graph["batched"] | {"api"}
    assert _circle(graph) == ["api", "static_loop", "batched", "api"]
    assert _circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None and _circle({"a": {"a"}}) == ["a", "a"]


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
    from hf_diversed.trainer import DiversedConfig, DiversedTrainer

    assert all(
        callable(x)
        for x in (BenchConfig, run_bench, summarize_records, main, push_head_folder, seed_hf_cache, export_head_repo)
    )
    assert get_task("gsm8k").name == "gsm8k"
    assert DiversedTrainer.__module__ == "hf_diversed.trainer.diversed_trainer"
    assert DiversedConfig.__module__ == "hf_diversed.trainer.diversed_config"


def test_only_the_vllm_compat_modules_import_vllm():
    """Every touch of vLLM's internals sits in ``integrations/vllm/_compat.py`` (pinned to a tested range) and its
    siblings for Model Runner V2, ``_mrv2.py``, and for the scheduler's draft-length policy, ``_scheduling.py``
    (installed by ``_compat`` inside the same version check); the calibration command uses vLLM's public ``LLM``."""
    vllm_dir = PACKAGE / "integrations" / "vllm"
    compat = {vllm_dir / name for name in ("_compat.py", "_mrv2.py", "_scheduling.py")}
    public_only = {vllm_dir / "calibrate.py"}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in compat:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            allowed = {"vllm"} if path in public_only else set()
            assert not any((n == "vllm" or n.startswith("vllm.")) and n not in allowed for n in names), path
