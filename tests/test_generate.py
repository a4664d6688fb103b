"""`generate(..., assistant_model=draft, diversed_head=..., diversed_verifier=...)` end to end."""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
import transformers
from conftest import EOS, VOCAB, build_pair, build_tiny, prompts
from transformers.generation.streamers import BaseStreamer

import hf_diversed
from hf_diversed import DiversedHead, DiversedHeadConfig, DiversedStats

RULES = ["exact", "static:0.5", "lossy:0.6", "cascade-chow:0.3", "cascade-diff:0.1", "cascade-opt:0.2", "diversed"]


def _run(target, draft, ids, rule, do_sample, head=None, **kwargs):
    extra = {"diversed_head": head} if rule == "diversed" else {"diversed_verifier": rule}
    return target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=20,
        do_sample=do_sample,
        return_dict_in_generate=True,
        **extra,
        **kwargs,
    )


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_paper_families_run_every_rule(family):
    target, draft = build_pair(family)
    head = DiversedHead.for_models(target, draft, head_hidden_size=8)
    torch.nn.init.normal_(head.out.weight, std=0.5)  # a non-constant head
    ids = prompts(1)[0]
    for rule in RULES:
        for do_sample in (False, True):
            torch.manual_seed(0)
            out = _run(target, draft, ids, rule, do_sample, head=head)
            stats = out.diversed_stats
            assert out.sequences.shape[1] > ids.shape[1]
            assert 0 <= stats.num_accepted <= stats.num_drafted and stats.num_rounds > 0
            assert 0.0 <= stats.mean_weight <= 1.0


@pytest.mark.parametrize("rule", RULES)
def test_stats_count_raw_verdicts(llama_pair, rule):
    """Without crops (EOS banned), new tokens = accepted + rounds; accepted <= drafted always."""
    target, draft = llama_pair
    head = DiversedHead.for_models(target, draft, init_weight=0.4)
    for do_sample in (False, True):
        ids = prompts(1, seed=2)[0]
        torch.manual_seed(1)
        out = _run(target, draft, ids, rule, do_sample, head=head, bad_words_ids=[[EOS]])
        s = out.diversed_stats
        assert s.num_accepted <= s.num_drafted
        assert out.sequences.shape[1] - ids.shape[1] == s.num_accepted + s.num_rounds
        assert s.acceptance_rate == s.num_accepted / s.num_drafted
        assert sum(s.accepted_per_round) == s.num_accepted and len(s.accepted_per_round) == s.num_rounds
        assert hf_diversed.last_stats(target) is s
    assert rule != "static:0.5" or s.mean_weight == 0.5


def test_stats_mean_weight_is_head_output(small_draft_pair):
    target, draft = small_draft_pair
    head = DiversedHead.for_models(target, draft, init_weight=0.25)
    out = _run(target, draft, prompts(1)[0], "diversed", True, head=head)
    assert out.diversed_stats.mean_weight == pytest.approx(0.25)
    assert isinstance(out, hf_diversed.DiversedGenerateOutput)


def test_a_head_the_caller_passes_stays_on_its_device(llama_pair):
    """As with ``assistant_model``, generate does not move the caller's head: a head on the CPU beside a target on
    the test device gives the same tokens and weights as one on the target's device, and is still on the CPU."""
    target, draft = llama_pair
    on_target = DiversedHead.for_models(target, draft, init_weight=0.3).to(target.device)
    on_cpu = copy.deepcopy(on_target).cpu()
    ids = prompts(1, seed=4)[0]
    outs = []
    for head in (on_target, on_cpu):
        torch.manual_seed(0)
        outs.append(_run(target, draft, ids, "diversed", True, head=head))
    assert {p.device.type for p in on_cpu.parameters()} == {"cpu"}
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    assert outs[0].diversed_stats.mean_weight == pytest.approx(outs[1].diversed_stats.mean_weight)


def test_stats_without_return_dict(llama_pair):
    target, draft = llama_pair
    seq = target.generate(prompts(1)[0], assistant_model=draft, diversed_verifier="exact", max_new_tokens=8)
    assert isinstance(seq, torch.Tensor)
    assert isinstance(hf_diversed.last_stats(target), DiversedStats)


class _Collect(BaseStreamer):
    def __init__(self):
        self.chunks: list[torch.Tensor] = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.view(-1))

    def end(self):
        self.ended = True


def test_streamer_receives_output_tokens(llama_pair):
    target, draft = llama_pair
    streamer = _Collect()
    ids = prompts(1)[0]
    torch.manual_seed(0)
    out = _run(target, draft, ids, "static:0.5", True, streamer=streamer)
    assert streamer.ended
    assert torch.equal(torch.cat(streamer.chunks), out.sequences[0].cpu())  # prompt first, then each accepted block


def test_num_assistant_tokens_passed_to_generate_is_honoured(llama_pair):
    target, draft = llama_pair
    draft.generation_config.num_assistant_tokens = 7
    out = _run(target, draft, prompts(1)[0], "exact", False, num_assistant_tokens=3, bad_words_ids=[[EOS]])
    s = out.diversed_stats
    assert s.num_drafted <= 3 * s.num_rounds and s.num_drafted >= 3 * (s.num_rounds - 1)
    assert draft.generation_config.num_assistant_tokens == 7  # a constant schedule leaves the draft config alone
    draft.generation_config.num_assistant_tokens = 4


def test_heuristic_schedule_behaves_as_transformers(llama_pair):
    target, draft = llama_pair
    results = []
    for kwargs in ({"assistant_ensemble_weight": 0.5}, {"diversed_verifier": "static:0.5"}):
        draft.generation_config.num_assistant_tokens = 4
        draft.generation_config.num_assistant_tokens_schedule = "heuristic"
        torch.manual_seed(3)
        out = target.generate(prompts(1)[0], assistant_model=draft, max_new_tokens=20, do_sample=True, **kwargs)
        results.append((out, draft.generation_config.num_assistant_tokens))
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.num_assistant_tokens = 4
    assert torch.equal(results[0][0], results[1][0]) and results[0][1] == results[1][1]


def test_peft_wrapped_target_and_draft():
    peft = pytest.importorskip("peft")
    target, draft = build_pair("llama")
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    target = peft.get_peft_model(target, peft.LoraConfig(**lora))
    draft = peft.get_peft_model(draft, peft.LoraConfig(**lora))
    head = DiversedHead.for_models(target, draft, init_weight=0.5)
    for rule in ("diversed", "exact"):
        torch.manual_seed(0)
        out = _run(target, draft, prompts(1)[0], rule, True, head=head)
        assert out.diversed_stats.num_rounds > 0
    assert hf_diversed.last_stats(target).num_rounds > 0


# --- bad input: each error names the problem and the fix -------------------------------------------


def test_errors_name_the_fix(llama_pair, small_draft_pair, tmp_path, monkeypatch):
    target, draft = llama_pair
    ids = prompts(1)[0]
    head = DiversedHead.for_models(target, draft)
    with pytest.raises(ValueError, match="pass `assistant_model=draft`"):
        target.generate(ids, diversed_head=head, max_new_tokens=4)
    with pytest.raises(ValueError, match="batch size 1.*Call generate once per prompt"):
        target.generate(torch.cat([ids, ids]), assistant_model=draft, diversed_head=head, max_new_tokens=4)
    other_vocab = build_tiny("llama", 32, 1, seed=5)
    other_vocab.resize_token_embeddings(VOCAB + 8)
    with pytest.raises(ValueError, match=f"vocab_size={VOCAB}.*{VOCAB + 8}.*shares the target's tokenizer"):
        target.generate(ids, assistant_model=other_vocab, diversed_verifier="exact", max_new_tokens=4)
    wrong = DiversedHead(DiversedHeadConfig(target_hidden_size=64, draft_hidden_size=48))
    with pytest.raises(ValueError, match="hidden sizes 64/48.*models have 64/32"):
        target.generate(ids, assistant_model=small_draft_pair[1], diversed_head=wrong, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        target.generate(ids, assistant_model=draft, diversed_verifier="static:1.2", max_new_tokens=4)
    with pytest.raises(ValueError, match="Unknown verification rule 'typical'"):
        target.generate(ids, assistant_model=draft, diversed_verifier="typical", max_new_tokens=4)
    with pytest.raises(ValueError, match="only used by the DIVERSED rule"):
        target.generate(ids, assistant_model=draft, diversed_head=head, diversed_verifier="exact", max_new_tokens=4)
    with pytest.raises(ValueError, match="needs an ensemble head"):
        target.generate(ids, assistant_model=draft, diversed_verifier="diversed", max_new_tokens=4)
    with pytest.raises(ValueError, match="expects a repo id, a local path or a DiversedHead, got int"):
        target.generate(ids, assistant_model=draft, diversed_head=3, max_new_tokens=4)
    with pytest.raises(ValueError, match='Use diversed_verifier="static:W"'):
        target.generate(
            ids, assistant_model=draft, diversed_verifier="exact", assistant_ensemble_weight=0.5, max_new_tokens=4
        )
    with pytest.raises(ValueError, match="num_beams=2"):
        target.generate(ids, assistant_model=draft, diversed_verifier="exact", num_beams=2, max_new_tokens=4)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="Could not load the DIVERSED head 'nobody/no-such-head'.*hf download"):
        target.generate(ids, assistant_model=draft, diversed_head="nobody/no-such-head", max_new_tokens=4)
    with pytest.raises(OSError, match="Could not load the DIVERSED head"):
        target.generate(ids, assistant_model=draft, diversed_head=str(tmp_path / "missing"), max_new_tokens=4)


def test_bfloat16_pair_runs_every_rule_in_both_loops(llama_pair):
    """Half-precision weights (what ``--dtype auto`` picks on a GPU): the real loop and the batched sampler both
    run every rule, and a float32 head (as loaded from the Hub) serves a bfloat16 pair."""
    from hf_diversed.generation.batched import SamplerConfig, SampleRequest, sample_batched

    target, draft = (copy.deepcopy(model).to(torch.bfloat16) for model in llama_pair)
    head = DiversedHead.for_models(target, draft, head_hidden_size=8)
    torch.nn.init.normal_(head.out.weight, std=0.5)
    ids = prompts(1, seed=3)[0]
    for rule in RULES:
        torch.manual_seed(0)
        s = _run(target, draft, ids, rule, True, head=head, bad_words_ids=[[EOS]]).diversed_stats
        assert 0 < s.num_accepted + s.num_rounds and 0.0 <= s.mean_weight <= 1.0, rule
    config = SamplerConfig(max_new_tokens=12, eos_token_id=EOS)
    requests = [
        SampleRequest(ids, rule, head=head if rule == "diversed" else None, seed=i) for i, rule in enumerate(RULES)
    ]
    results = sorted(sample_batched(target, draft, requests, config, batch_size=4), key=lambda r: r.index)
    assert [r.request.rule for r in results] == RULES
    for r in results:
        assert r.completion_ids.numel() <= 12 and ((r.completion_ids >= 0) & (r.completion_ids < VOCAB)).all()
        assert 0.0 <= r.stats.mean_weight <= 1.0


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("loop", ["rule", "head", "static"])
def test_a_diversed_call_warns_nothing(loop):
    """A DIVERSED ``generate`` (the default loop with a rule or the head, and the static-cache loop) emits no
    FutureWarning / DeprecationWarning and no warning on transformers' logger (e.g. its deprecation of a
    ``generation_config`` passed with generation kwargs, once the draft's ``generate`` was called that way)."""
    target, draft = build_pair("llama")
    for model in (target, draft):
        model.generation_config.pad_token_id = EOS  # else generate warns that it sets pad to EOS
    if loop == "head":
        chosen = {"diversed_head": DiversedHead.for_models(target, draft, init_weight=0.4)}
    else:
        chosen = {"diversed_verifier": "static:0.5"}
    if loop == "static":
        chosen.update(cache_implementation="static", disable_compile=True, num_assistant_tokens_schedule="constant")
    logger, handler = transformers.logging.get_logger("transformers"), _Records()
    verbosity = transformers.logging.get_verbosity()
    logging.Logger.warning_once.cache_clear()  # a warning already given once in this process is given again
    transformers.logging.set_verbosity_warning()
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.manual_seed(0)
            target.generate(prompts(1)[0], assistant_model=draft, max_new_tokens=12, do_sample=True, **chosen)
    finally:
        logger.removeHandler(handler)
        transformers.logging.set_verbosity(verbosity)
    deprecations = [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert deprecations == [] and handler.messages == []
