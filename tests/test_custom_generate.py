"""The head repository's ``custom_generate/``: DIVERSED through transformers' own ``custom_generate`` mechanism.

``target.generate(..., assistant_model=draft, custom_generate=<head repo>, trust_remote_code=True)`` runs the
repository's standalone ``custom_generate/generate.py`` (no hf-diversed needed). Specification: its tokens are
hf-diversed's (greedy, and sampling under the same seed), its verification rule emits exactly
nu = w p + (1 - w) q with acceptance 1 - w TV(p, q), it runs in a process that cannot import hf_diversed (from a
directory, and by Hub id from the HF cache, offline), and whatever it does not implement raises with the fix.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import EOS, prompts
from transformers import LogitsProcessorList, TemperatureLogitsWarper

from hf_diversed import Diversed, DiversedHead
from hf_diversed.modeling.hub import push_head_folder, seed_hf_cache, write_custom_generate

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "hf_diversed" / "custom_generate" / "generate.py"
HUB_ID = "test-org/diversed-head-tiny"


def _load_module():
    spec = importlib.util.spec_from_file_location("diversed_custom_generate_under_test", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cg = _load_module()


def _head(target, draft, hidden: int = 0, features: bool = False) -> DiversedHead:
    """A head whose weight varies per token (a random, non-zero output layer)."""
    head = DiversedHead.for_models(
        target, draft, init_weight=0.5, head_hidden_size=hidden, use_distribution_features=features
    )
    torch.manual_seed(5)
    torch.nn.init.normal_(head.out.weight, std=2.0)
    return head.eval()


@pytest.fixture(scope="module")
def head_dir(llama_pair, tmp_path_factory) -> Path:
    """A head repository folder whose generate.py loads the head from the folder itself."""
    folder = tmp_path_factory.mktemp("head_repo")
    _head(*llama_pair, hidden=8).save_pretrained(folder)
    write_custom_generate(folder, str(folder))
    return folder


def _custom(target, draft, ids, repo, **kwargs):
    return target.generate(ids, assistant_model=draft, custom_generate=str(repo), trust_remote_code=True, **kwargs)


def _reference(target, draft, ids, head, n, **kwargs):
    """hf-diversed's own generate with the same fixed draft length."""
    return target.generate(
        ids,
        assistant_model=draft,
        diversed_head=str(head),
        num_assistant_tokens=n,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
        **kwargs,
    )


# ------------------------------------------------------------------------------------- token parity


@pytest.mark.parametrize("n", [2, 5])
def test_greedy_tokens_equal_hf_diversed(llama_pair, head_dir, n):
    target, draft = llama_pair
    trace: list = []
    for ids in prompts(3):
        ref = _reference(target, draft, ids, head_dir, n, max_new_tokens=24, _diversed_trace=trace)
        out = _custom(target, draft, ids, head_dir, max_new_tokens=24, num_assistant_tokens=n)
        assert out.dtype == torch.long and torch.equal(out, ref)
    w = torch.cat([entry.w for entry in trace])
    assert w.std() > 0.05, "the head should weigh tokens differently, or the test proves little"


def test_a_head_reading_the_next_token_laws_decodes_as_in_hf_diversed(llama_pair, tmp_path):
    """A head with ``use_distribution_features``: greedy tokens, and sampled ones under the same seed, equal."""
    target, draft = llama_pair
    folder = tmp_path / "featured"
    head = _head(target, draft, hidden=8, features=True)
    with torch.no_grad():
        head.hidden.weight[:, -3:] = 4.0 * torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    head.save_pretrained(folder)
    write_custom_generate(folder, str(folder))
    for i, ids in enumerate(prompts(2)):
        for kwargs in (dict(max_new_tokens=24), dict(max_new_tokens=24, do_sample=True)):
            torch.manual_seed(200 + i)
            ref = _reference(target, draft, ids, folder, 3, **kwargs)
            torch.manual_seed(200 + i)
            out = _custom(target, draft, ids, folder, num_assistant_tokens=3, **kwargs)
            assert torch.equal(out, ref)


def test_custom_generate_receives_diversed_head_when_hf_diversed_is_imported(llama_pair, head_dir, tmp_path):
    """hf-diversed's generate steps aside for `custom_generate`: the repository's function gets every argument."""
    target, draft = llama_pair
    other = tmp_path / "other_head"
    _head(target, draft, hidden=0).save_pretrained(other)  # another head: different tokens than head_dir's
    ids = prompts(1)[0]
    ref = _reference(target, draft, ids, other, 3, max_new_tokens=24)
    out = _custom(target, draft, ids, head_dir, diversed_head=str(other), max_new_tokens=24, num_assistant_tokens=3)
    assert torch.equal(out, ref)
    default = _custom(target, draft, ids, head_dir, max_new_tokens=24, num_assistant_tokens=3)
    assert not torch.equal(out, default), "the two heads should decode differently, or the test proves little"


@pytest.mark.parametrize(
    "options",
    [{}, dict(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3)],
    ids=["default-warpers", "temperature-topk-topp-repetition"],
)
def test_sampling_draws_equal_hf_diversed_under_the_same_seed(llama_pair, head_dir, options):
    """Same random draws in the same order: the draft's multinomials, the acceptance uniforms, the resample.

    This pins two properties of hf-diversed's drafting that generate.py reproduces: the draft's sampling warpers
    apply once (transformers' own drafter applies them twice), and generated pad tokens leave the draft's
    context (inherited from transformers' drafter).
    """
    target, draft = llama_pair
    for i, ids in enumerate(prompts(2)):
        kwargs = dict(max_new_tokens=30, do_sample=True, **options)
        torch.manual_seed(100 + i)
        ref = _reference(target, draft, ids, head_dir, 2, **kwargs)
        torch.manual_seed(100 + i)
        out = _custom(target, draft, ids, head_dir, num_assistant_tokens=2, **kwargs)
        assert torch.equal(out, ref)


def test_length_budget_eos_and_streamer(llama_pair, head_dir):
    target, draft = llama_pair

    class Streamer:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1))

        def end(self):
            self.ended = True

    ids = prompts(1, seed=3)[0]
    for max_new in (1, 2, 3, 7):
        ref = _reference(target, draft, ids, head_dir, 3, max_new_tokens=max_new)
        out = _custom(target, draft, ids, head_dir, max_new_tokens=max_new, num_assistant_tokens=3)
        assert torch.equal(out, ref) and out.shape[1] <= ids.shape[1] + max_new
    streamer = Streamer()
    out = _custom(target, draft, ids, head_dir, max_new_tokens=40, num_assistant_tokens=4, streamer=streamer)
    assert streamer.ended and torch.equal(torch.cat(streamer.chunks), out[0].cpu())  # streamers get CPU tensors
    assert torch.equal(streamer.chunks[0], ids[0].cpu())
    # EOS: generation stops right after the first EOS (the tiny target emits it early with this prompt and seed).
    eos_seen = False
    for seed in range(6):
        torch.manual_seed(seed)
        out = _custom(target, draft, ids, head_dir, max_new_tokens=40, do_sample=True, num_assistant_tokens=4)
        new = out[0, ids.shape[1] :].tolist()
        if EOS in new:
            eos_seen = True
            assert new.index(EOS) == len(new) - 1
    assert eos_seen


def test_head_forward_equals_diversed_head(llama_pair):
    target, draft = llama_pair
    g = torch.Generator().manual_seed(0)
    h_d, h_t = torch.randn(2, 7, 64, generator=g) * 3, torch.randn(2, 7, 64, generator=g)
    for hidden in (0, 8):
        head = _head(target, draft, hidden)
        for normalize in (True, False):
            head.config.normalize_features = normalize
            state = {name: p.detach() for name, p in head.state_dict().items()}
            ours = cg.EnsembleHead(head.config.to_dict(), state).weight(h_d, h_t)
            with torch.no_grad():
                assert torch.equal(ours, head(h_d, h_t).weight)
    from hf_diversed.modeling.modeling_diversed_head import distribution_features

    p, q = torch.randn(2, 7, 50, generator=g).softmax(-1), (3 * torch.randn(2, 7, 50, generator=g)).softmax(-1)
    head = _head(target, draft, 8, features=True)
    state = {name: p.detach() for name, p in head.state_dict().items()}
    ours = cg.EnsembleHead(head.config.to_dict(), state).weight(h_d, h_t, p, q)
    with torch.no_grad():
        assert torch.equal(ours, head(h_d, h_t, distribution_features(p, q)).weight)
    with pytest.raises(ValueError, match="reads the next-token laws"):
        cg.EnsembleHead(head.config.to_dict(), state).weight(h_d, h_t)


# ---------------------------------------------------------------------------------- the rule, statistically


def _block(num: int, gamma: int, vocab: int, seed: int):
    """One fixed (p, q, w) block, repeated ``num`` times, with drafts x_t ~ q_t (rows do not depend on context)."""
    g = torch.Generator().manual_seed(seed)
    p = (1.5 * torch.randn(gamma + 1, vocab, generator=g)).softmax(-1)
    q = (1.5 * torch.randn(gamma, vocab, generator=g)).softmax(-1)
    w = torch.rand(gamma, generator=g)
    drafts = torch.stack([torch.multinomial(q[t], num, replacement=True, generator=g) for t in range(gamma)], 1)
    return p, q, w, drafts, g


def test_sampling_rule_emits_nu_and_accepts_with_one_minus_w_tv():
    """Law of the emitted token and acceptance rate over M = 200k independent verifications.

    Tolerance: each empirical frequency f of a Binomial(M, pi)/M must satisfy |f - pi| <= 5 sqrt(pi (1 - pi) / M)
    (five standard errors; with 6 + 1 checks per position the chance of a false failure is < 1e-5, and the
    generator is seeded, so the test is deterministic). Position t >= 2 is checked given that all earlier drafts
    were accepted, where its law is again nu_t; the bonus token (all accepted) must follow p_{gamma+1}.
    """
    num, gamma, vocab = 200_000, 3, 6
    p, q, w, drafts, g = _block(num, gamma, vocab, seed=0)
    tokens, accepted = cg.verify(
        drafts,
        q.log().expand(num, -1, -1),
        p.log().expand(num, -1, -1),
        w.expand(num, -1),
        do_sample=True,
        generator=g,
    )

    def close(freq, prob, count):
        return bool(((freq - prob).abs() <= 5 * (prob * (1 - prob) / count).sqrt() + 1e-12).all())

    alive = torch.ones(num, dtype=torch.bool)
    for t in range(gamma):
        nu = w[t] * p[t] + (1 - w[t]) * q[t]
        count = int(alive.sum())
        law = torch.bincount(tokens[alive, t], minlength=vocab).double() / count
        assert close(law, nu.double(), count), (t, law, nu)
        beta = 1 - w[t] * 0.5 * (p[t] - q[t]).abs().sum()  # 1 - w TV(p, q)
        rate = (accepted[alive] > t).double().mean()
        assert close(rate, beta.double(), count), (t, rate, beta)
        alive &= accepted > t
    bonus = torch.bincount(tokens[alive, gamma], minlength=vocab).double() / int(alive.sum())
    assert close(bonus, p[gamma].double(), int(alive.sum()))


def test_rule_equals_hf_diversed_verifier_draw_for_draw():
    num, gamma, vocab = 512, 4, 11
    g = torch.Generator().manual_seed(1)
    draft_logits = 2 * torch.randn(num, gamma, vocab, generator=g)
    target_logits = 2 * torch.randn(num, gamma + 1, vocab, generator=g)
    w = torch.rand(num, gamma, generator=g)
    drafts = torch.multinomial(draft_logits.softmax(-1).view(-1, vocab), 1, generator=g).view(num, gamma)
    drafts[::3] = draft_logits[::3].argmax(-1)  # some greedy-style drafts too
    for do_sample in (True, False):
        ours = cg.verify(drafts, draft_logits, target_logits, w, do_sample=do_sample, generator=g.manual_seed(7))
        ref = Diversed().verify(
            drafts, draft_logits, target_logits, do_sample=do_sample, head_weight=w, generator=g.manual_seed(7)
        )
        assert torch.equal(ours[0], ref.tokens) and torch.equal(ours[1], ref.num_accepted)
    # No draft (length budget): the token comes from p, like hf-diversed.
    ours = cg.verify(drafts[:, :0], draft_logits[:, :0], target_logits[:, :1], w[:, :0], do_sample=False)
    assert torch.equal(ours[0][:, 0], target_logits[:, 0].argmax(-1))


# ------------------------------------------------------------------- without hf-diversed, local and by Hub id


def test_runs_where_hf_diversed_cannot_be_imported(llama_pair, head_dir, tmp_path):
    target, draft = llama_pair
    target.save_pretrained(tmp_path / "target")
    draft.save_pretrained(tmp_path / "draft")
    hub_folder = tmp_path / "hub_repo"  # the repository as pushed: its generate.py names the Hub id
    shutil.copytree(head_dir, hub_folder)
    write_custom_generate(hub_folder, HUB_ID)
    hf_home = tmp_path / "hf_home"
    seed_hf_cache(HUB_ID, hub_folder, hf_home / "hub")
    ids = prompts(2)
    expected = [_reference(target, draft, x, head_dir, 3, max_new_tokens=16).tolist() for x in ids]
    script = textwrap.dedent(
        f"""
        import json, sys

        class BlockHfDiversed:
            def find_spec(self, name, path=None, target=None):
                if name == "hf_diversed" or name.startswith("hf_diversed."):
                    raise ImportError("hf_diversed is not installed (blocked by the test)")

        sys.meta_path.insert(0, BlockHfDiversed())
        import torch
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained({str(tmp_path / "target")!r})
        draft = AutoModelForCausalLM.from_pretrained({str(tmp_path / "draft")!r})
        common = dict(assistant_model=draft, trust_remote_code=True, max_new_tokens=16, num_assistant_tokens=3)
        result = {{"local": [], "hub": []}}
        for ids in {[x.tolist() for x in ids]!r}:
            ids = torch.tensor(ids)
            result["local"].append(
                target.generate(ids, custom_generate={str(head_dir)!r}, diversed_head={str(head_dir)!r}, **common)
                .tolist()
            )
            result["hub"].append(target.generate(ids, custom_generate={HUB_ID!r}, **common).tolist())
        try:
            import hf_diversed  # noqa: F401
            result["imported"] = True
        except ImportError:
            result["imported"] = False
        print(json.dumps(result))
        """
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "PYTHONPATH"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_CACHE=str(hf_home / "hub"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["imported"] is False
    assert result["local"] == expected and result["hub"] == expected


# ---------------------------------------------------------------------------------------------- refusals


def test_transformers_refuses_without_trust_remote_code(llama_pair, head_dir, monkeypatch):
    target, draft = llama_pair
    ids = prompts(1)[0]
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        target.generate(ids, assistant_model=draft, custom_generate=str(head_dir), trust_remote_code=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # the interactive prompt reads EOF: no
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        target.generate(ids, assistant_model=draft, custom_generate=str(head_dir))


def test_missing_assistant_model_raises(llama_pair, head_dir):
    target, _ = llama_pair
    with pytest.raises(ValueError, match="pass assistant_model=draft"):
        target.generate(prompts(1)[0], custom_generate=str(head_dir), trust_remote_code=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_beams=2), "num_beams=2.*one beam"),
        (dict(return_dict_in_generate=True), "return_dict_in_generate=True.*LongTensor"),
        (dict(output_scores=True), "output_scores=True"),
        (dict(num_return_sequences=2, do_sample=True), "num_return_sequences=2"),
        (dict(logits_processor=LogitsProcessorList([TemperatureLogitsWarper(0.5)])), "logits_processor"),
        (dict(num_assistant_tokens_schedule="heuristic"), 'num_assistant_tokens_schedule="constant"'),
        (dict(assistant_confidence_threshold=0.4), "assistant_confidence_threshold=0"),
        (dict(min_p=0.1), "min_p=0.1"),
        (dict(no_repeat_ngram_size=3), "no_repeat_ngram_size=3"),
        (dict(stop_strings=["x"]), "stop_strings"),
        (dict(prompt_lookup_num_tokens=3), "prompt-lookup"),
        (dict(assistant_ensemble_weight=0.5), "drop assistant_ensemble_weight"),
        (dict(position_ids=torch.arange(6)[None]), r"generate arguments \['position_ids'\]"),
        (dict(attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1]])), "padding"),
        (dict(inputs=torch.randint(3, 100, (2, 6))), "batch of 2 prompts"),
        (dict(use_cache=False), "use_cache=True"),
    ],
)
def test_unsupported_arguments_raise_with_the_fix(llama_pair, head_dir, kwargs, match):
    target, draft = llama_pair
    inputs = kwargs.pop("inputs", prompts(1, length=6)[0])
    with pytest.raises(ValueError, match=match) as err:
        _custom(target, draft, inputs, head_dir, max_new_tokens=4, **kwargs)
    if "use_cache" not in kwargs:
        assert "pip install hf-diversed" in str(err.value)


def test_draft_generation_config_is_not_ignored(llama_pair, head_dir):
    target, draft = llama_pair[0], copy.deepcopy(llama_pair[1])
    draft.generation_config.assistant_confidence_threshold = 0.4
    with pytest.raises(ValueError, match=r"assistant_confidence_threshold=0.4 \(in assistant_model.generation_config"):
        _custom(target, draft, prompts(1)[0], head_dir, max_new_tokens=4)
    # Passed to the call, the value overrides the draft's (as hf-diversed's num_assistant_tokens does).
    out = _custom(target, draft, prompts(1)[0], head_dir, max_new_tokens=4, assistant_confidence_threshold=0.0)
    assert out.shape[1] == prompts(1)[0].shape[1] + 4


def test_wrong_head_or_missing_head_id_names_the_fix(llama_pair, small_draft_pair, head_dir, tmp_path):
    ids = prompts(1)[0]
    with pytest.raises(ValueError, match="built for target/draft hidden sizes 64/64, but the models have 64/32"):
        _custom(*small_draft_pair, ids, head_dir, max_new_tokens=4)
    raw = tmp_path / "raw"  # a repository whose generate.py was not exported for a head
    shutil.copytree(head_dir, raw)
    shutil.copy(TEMPLATE, raw / "custom_generate" / "generate.py")
    with pytest.raises(ValueError, match="pass diversed_head="):
        _custom(*llama_pair, ids, raw, max_new_tokens=4)
    with pytest.raises(OSError, match="Could not load the DIVERSED head"):
        cg.load_head(str(tmp_path / "no-such-dir"))


# ------------------------------------------------------------------------------------ export and upload


def test_generate_py_is_standalone():
    tree = ast.parse(TEMPLATE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports do not survive transformers' module copy"
            imported.add(node.module)
    allowed_roots = {"torch", "transformers", "huggingface_hub", "safetensors"} | set(sys.stdlib_module_names)
    assert {name.split(".")[0] for name in imported} <= allowed_roots, imported
    assert {name for name in imported if name.startswith("transformers")} == {"transformers"}  # the public API
    assert {name for name in imported if name.startswith("safetensors")} == {"safetensors.torch"}


def test_write_custom_generate_and_push(tmp_path, llama_pair, monkeypatch):
    import huggingface_hub

    _head(*llama_pair).save_pretrained(tmp_path)
    dest = write_custom_generate(tmp_path, "org/head-x")
    assert dest == tmp_path / "custom_generate"
    source = (dest / "generate.py").read_text()
    assert 'HEAD_REPO_ID = "org/head-x"' in source and source.count("org/head-x") == 1
    assert source.replace('"org/head-x"', '"__DIVERSED_HEAD_REPO_ID__"', 1) == TEMPLATE.read_text()
    requirements = (dest / "requirements.txt").read_text().split()
    assert requirements == ["torch", "transformers>=5.23", "huggingface-hub", "safetensors"]
    uploaded = {}

    def upload_folder(self, *, repo_id, folder_path, allow_patterns, **kwargs):
        root = Path(folder_path)
        uploaded["files"] = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and any(p.relative_to(root).match(pattern) for pattern in allow_patterns)
        )
        return "https://hub/commit/2"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kwargs: None)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    (tmp_path / "custom_generate" / "__pycache__").mkdir()
    (tmp_path / "custom_generate" / "__pycache__" / "generate.pyc").write_bytes(b"x")
    assert push_head_folder(tmp_path, "org/head-x") == "https://hub/commit/2"
    assert uploaded["files"] == [
        "config.json",
        "custom_generate/generate.py",
        "custom_generate/requirements.txt",
        "model.safetensors",
    ]
