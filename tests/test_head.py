"""The ensemble head: its output contract, and its life as a Hub model (save, load, cache, push)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel

import hf_diversed
from hf_diversed import DiversedHead, DiversedHeadConfig, load_head
from hf_diversed.modeling.hub import seed_hf_cache

REPO = Path(__file__).resolve().parents[1]


def _inputs(seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 7, 32, generator=g) * scale, torch.randn(2, 7, 64, generator=g) * scale


@pytest.mark.parametrize("w0", [0.0, 0.1, 0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("hidden", [0, 16])
def test_fresh_head_outputs_exactly_init_weight(w0, hidden):
    head = DiversedHead(
        DiversedHeadConfig(target_hidden_size=64, draft_hidden_size=32, init_weight=w0, head_hidden_size=hidden)
    )
    for scale in (1e-3, 1.0, 1e3):
        w = head(*_inputs(scale=scale)).weight
        assert w.dtype == torch.float32 and w.shape == (2, 7)
        assert bool((w == torch.tensor(w0, dtype=torch.float32)).all())


def test_trained_head_stays_in_unit_interval_and_is_fp32():
    head = DiversedHead(DiversedHeadConfig(target_hidden_size=64, draft_hidden_size=32, init_weight=0.3))
    torch.nn.init.normal_(head.out.weight, std=3.0)
    d, t = _inputs(scale=50.0)
    with torch.no_grad():
        w = head(d.bfloat16(), t.bfloat16()).weight
    assert w.dtype == torch.float32 and float(w.min()) >= 0.0 and float(w.max()) <= 1.0
    assert float(w.std()) > 0.01
    z = torch.linspace(-20, 20, 401)
    mapped = head.weight_from_logits(z)
    assert bool((mapped[1:] >= mapped[:-1]).all()) and mapped[0] >= 0 and mapped[-1] <= 1


def test_size_mismatch_names_both_sizes():
    head = DiversedHead(DiversedHeadConfig(target_hidden_size=64, draft_hidden_size=32))
    with pytest.raises(ValueError, match="expects draft/target hidden sizes 32/64, got 48/64"):
        head(torch.zeros(1, 1, 48), torch.zeros(1, 1, 64))


def test_a_head_can_also_read_the_next_token_laws(tmp_path):
    """``use_distribution_features``: w also reads [max p, max q, TV(p, q)] per position; a fresh head is still the
    static ensemble; the features are required by such a head, refused by any other, and survive a save."""
    from hf_diversed.modeling.modeling_diversed_head import distribution_features

    g = torch.Generator().manual_seed(3)
    p, q = (2 * torch.randn(2, 7, 40, generator=g)).softmax(-1), (2 * torch.randn(2, 7, 40, generator=g)).softmax(-1)
    features = distribution_features(p, q)
    assert features.shape == (2, 7, 3)
    torch.testing.assert_close(features[..., 0], p.max(-1).values)
    torch.testing.assert_close(features[..., 1], q.max(-1).values)
    torch.testing.assert_close(features[..., 2], 0.5 * (p - q).abs().sum(-1))
    config = DiversedHeadConfig(target_hidden_size=64, draft_hidden_size=32, init_weight=0.3,
                                use_distribution_features=True)  # fmt: skip
    head = DiversedHead(config)
    assert head.out.weight.shape == (1, 32 + 64 + 3)
    assert bool((head(*_inputs(), distribution_features=features).weight == torch.tensor(0.3)).all())
    with torch.no_grad():
        head.out.weight[0, -3:] = torch.tensor([5.0, -5.0, 2.0])  # reads nothing but the laws
    w = head(*_inputs(), distribution_features=features).weight
    z = features @ torch.tensor([5.0, -5.0, 2.0])
    torch.testing.assert_close(w, head.weight_from_logits(z))
    with pytest.raises(ValueError, match="reads the two models' next-token laws"):
        head(*_inputs())
    with pytest.raises(ValueError, match=r"must have shape \(2, 7, 3\)"):
        head(*_inputs(), distribution_features=features[..., :2])
    with pytest.raises(ValueError, match="reads hidden states only"):
        DiversedHead(DiversedHeadConfig(target_hidden_size=64, draft_hidden_size=32))(
            *_inputs(), distribution_features=features
        )
    head.save_pretrained(tmp_path)
    loaded = load_head(tmp_path, cache=False)
    assert loaded.config.use_distribution_features
    torch.testing.assert_close(loaded(*_inputs(), distribution_features=features).weight, w, rtol=0, atol=0)


@pytest.mark.parametrize("rule, alpha", [("opt", 0.1), ("chow", 0.3), ("diff", 0.1)])
def test_a_head_can_start_as_a_speculative_cascade(rule, alpha):
    """``DiversedHead.from_cascade``: z = k * m with the cascade's margin m (linear in max p, max q, TV), so
    w > w0 exactly where the cascade defers, |w - delta| <= (1 - tanh(k |m|)) / 2, and hidden states count for nothing
    until training moves their weights; an MLP head gives the same z (SiLU(m) - SiLU(-m) = m), its other units
    silent."""
    from conftest import build_tiny

    from hf_diversed import SpecCascade

    target, draft = build_tiny("llama", 64, 1, seed=0), build_tiny("llama", 32, 1, seed=1)
    head = DiversedHead.from_cascade(target, draft, rule, alpha, sharpness=50.0)
    assert head.config.use_distribution_features and head.config.head_hidden_size == 0
    g = torch.Generator().manual_seed(5)
    max_p, max_q, tv = torch.rand(3, 2, 7, 500, generator=g).unbind(0)
    features = torch.stack([max_p, max_q, tv], -1).reshape(2, 7 * 500, 3)
    delta = SpecCascade(rule, alpha).weights_from_stats(max_p, max_q, tv).reshape(2, -1)
    h_d, h_t = torch.randn(2, 7 * 500, 32, generator=g), torch.randn(2, 7 * 500, 64, generator=g)
    w = head(h_d, h_t, distribution_features=features).weight
    torch.testing.assert_close(w, head(3 * h_d, -h_t, distribution_features=features).weight, atol=0, rtol=0)
    margin = {"opt": max_p - max_q - alpha * tv, "diff": max_p - max_q - alpha, "chow": 1 - alpha - max_q}[rule]
    margin = margin.reshape(2, -1)
    clear = margin.abs() > 1e-5  # float rounding decides the rest
    assert bool(((w > 0.5) == delta.bool())[clear].all())
    assert bool(((w - delta).abs() <= 0.5 * (1 - torch.tanh(50 * margin.abs())) + 1e-5).all())
    assert 0.1 < float(delta.mean()) < 0.9
    mlp = DiversedHead.from_cascade(target, draft, rule, alpha, sharpness=50.0, head_hidden_size=8)
    torch.testing.assert_close(mlp(h_d, h_t, distribution_features=features).logits,
                               head(h_d, h_t, distribution_features=features).logits, atol=1e-4, rtol=1e-5)  # fmt: skip
    assert float(mlp.hidden.weight[2:].detach().abs().sum()) > 0 and not mlp.out.weight[0, 2:].any()
    for bad, match in (
        (dict(head_hidden_size=1), "needs head_hidden_size >= 2"),
        (dict(use_distribution_features=False), "needs use_distribution_features=True"),
        (dict(rule="max"), "Unknown cascade rule 'max'"),
        (dict(sharpness=0.0), "sharpness > 0"),
    ):
        kwargs = dict(rule=rule, alpha=alpha) | bad
        with pytest.raises(ValueError, match=match):
            DiversedHead.from_cascade(target, draft, **kwargs)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match=r"`init_weight` must be in \[0, 1\]"):
        DiversedHeadConfig(init_weight=1.5)
    with pytest.raises(ValueError, match="`target_hidden_size` must be a positive int"):
        DiversedHeadConfig(target_hidden_size=0)


def _trained_head() -> DiversedHead:
    config = DiversedHeadConfig(
        target_hidden_size=64,
        draft_hidden_size=32,
        init_weight=0.4,
        head_hidden_size=8,
        target_model="org/target",
        draft_model="org/draft",
        vocab_size=128,
        task="gsm8k",
    )
    head = DiversedHead(config)
    torch.nn.init.normal_(head.out.weight, std=1.0)
    return head


def test_save_and_auto_load_round_trip(tmp_path):
    head = _trained_head()
    head.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]  # safetensors only, no pickle
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "diversed_head" and config["task"] == "gsm8k"
    assert isinstance(AutoConfig.from_pretrained(tmp_path), DiversedHeadConfig)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert isinstance(loaded, DiversedHead)
    torch.testing.assert_close(loaded(*_inputs()).weight, head(*_inputs()).weight, rtol=0, atol=0)
    torch.testing.assert_close(load_head(tmp_path)(*_inputs()).weight, head(*_inputs()).weight, rtol=0, atol=0)


def test_offline_hub_cache_round_trip(tmp_path):
    """A head seeded into HF_HOME's cache loads by repo id with HF_HUB_OFFLINE=1 (fresh process)."""
    head = _trained_head()
    head.save_pretrained(tmp_path / "saved")
    hf_home = tmp_path / "hf_home"
    seed_hf_cache("org/head-test", tmp_path / "saved", cache_dir=hf_home / "hub")
    expected = head(*_inputs()).weight
    torch.save(expected, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(REPO / "tests")!r})
        import hf_diversed
        from transformers import AutoModel
        from conftest import build_tiny
        from test_head import _inputs
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        auto = AutoModel.from_pretrained("org/head-test")
        assert torch.equal(auto(*_inputs()).weight, expected)
        target, draft = build_tiny("llama", 64, 1, 0), build_tiny("llama", 32, 1, 1)
        ids = torch.tensor([[5, 6, 7]], device=target.device)
        out = target.generate(ids, assistant_model=draft, diversed_head="org/head-test", max_new_tokens=5,
                              return_dict_in_generate=True)
        assert out.diversed_stats.num_rounds > 0
        print("OK")
        """
    )
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_push_to_hub_uploads_safetensors_and_config(tmp_path, monkeypatch):
    import transformers.utils.hub as transformers_hub

    uploaded: dict[str, bytes] = {}

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            return type("RepoUrl", (), {"repo_id": repo_id})()

        def create_commit(self, repo_id, operations, **kwargs):
            for op in operations:
                uploaded[op.path_in_repo] = Path(op.path_or_fileobj).read_bytes()
            return "commit"

    monkeypatch.setattr(transformers_hub, "_hf_api", FakeApi())
    head = _trained_head()
    head.push_to_hub("org/head-push")
    assert {"config.json", "model.safetensors"} <= set(uploaded)
    assert json.loads(uploaded["config.json"])["model_type"] == "diversed_head"
    (tmp_path / "model.safetensors").write_bytes(uploaded["model.safetensors"])
    (tmp_path / "config.json").write_bytes(uploaded["config.json"])
    assert torch.equal(load_head(tmp_path)(*_inputs()).weight, head(*_inputs()).weight)


def test_repository_code_is_never_executed(tmp_path):
    """A head repo that ships Python code and an auto_map: loading it runs none of that code."""
    _trained_head().save_pretrained(tmp_path)
    marker = tmp_path / "pwned"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass Evil: pass\n")
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.Evil", "AutoModel": "evil.Evil"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    head = load_head(tmp_path, cache=False)
    assert isinstance(head, DiversedHead) and not marker.exists()
    assert isinstance(AutoModel.from_pretrained(tmp_path), DiversedHead)  # the registered class, not evil.py
    assert not marker.exists()


def test_public_api_is_small_and_sorted():
    assert hf_diversed.__all__ == sorted(hf_diversed.__all__)
    for name in hf_diversed.__all__:
        assert getattr(hf_diversed, name) is not None


def test_push_head_folder_uploads_head_and_card_only(tmp_path, monkeypatch):
    import huggingface_hub

    from hf_diversed.modeling.hub import push_head_folder

    calls = {}

    def create_repo(self, repo_id, **kwargs):
        calls["repo"] = repo_id

    def upload_folder(self, *, repo_id, folder_path, allow_patterns, **kwargs):
        calls["files"] = sorted(
            p.name for p in Path(folder_path).iterdir() if any(p.match(pattern) for pattern in allow_patterns)
        )
        return "https://hub/commit/1"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    _trained_head().save_pretrained(tmp_path)
    (tmp_path / "README.md").write_text("# card")
    (tmp_path / "trainer_state.pt").write_bytes(b"x")
    assert push_head_folder(tmp_path, "org/head") == "https://hub/commit/1"
    assert calls == {"repo": "org/head", "files": ["README.md", "config.json", "model.safetensors"]}
    with pytest.raises(FileNotFoundError, match="save the head there first"):
        push_head_folder(tmp_path / "empty", "org/head")
