"""A draft with a trimmed vocabulary: q_K is q renormalised on the kept ids, and every rule reads q_K.

- The trimmed head computes the kept logits exactly and -inf elsewhere; the state dict, weight tying and the
  saved checkpoint are the untrimmed model's; the set travels in config.json and is applied when the draft
  enters generate or the batched sampler.
- ``size=K`` keeps the corpus' K most frequent ids (special tokens always; unseen ids follow in id order).
- Exact SD with a trimmed draft still outputs exactly p: the law of the first three tokens, from generate and
  from the batched sampler, passes a chi-square goodness-of-fit test against p computed by enumeration; the
  static ensemble with the same draft (whose law is not p) fails it, so the test has power.

False failures: 3 chi-square tests at level ALPHA = 2e-6 that should pass (<= 6e-6 by chance); the one that
should fail has, at these sample sizes, a statistic far beyond the level.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
from conftest import build_pair, prompts, require_data_dir
from test_batched import _chi2_pvalue
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hf_diversed import DiversedHead, trim_draft_vocabulary
from hf_diversed.generation.batched import SamplerConfig, SampleRequest, sample_batched
from hf_diversed.modeling.draft_vocabulary import (
    TrimmedLMHead,
    apply_draft_vocabulary,
    decode_ids,
    draft_vocabulary_ids,
    encode_ids,
)

ALPHA = 2e-6


def _tiny(seed: int, vocab: int = 6, tied: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        initializer_range=0.5, tie_word_embeddings=tied,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.generation_config.assistant_confidence_threshold = 0.0
    return model


# ------------------------------------------------------------------------------------------------ the head


@pytest.mark.parametrize("tied", [True, False])
def test_trimmed_head_keeps_kept_logits_and_saves_an_ordinary_checkpoint(tmp_path, tied):
    draft = _tiny(0, vocab=50, tied=tied)
    ids = torch.tensor([[3, 4, 5, 7]])
    full = draft(ids).logits
    keys = sorted(draft.state_dict())
    trim_draft_vocabulary(draft, keep=[2, 3, 4, 10, 20])
    kept = draft_vocabulary_ids(draft)
    assert kept.tolist() == [0, 1, 2, 3, 4, 10, 20]  # BOS and EOS/pad are always kept
    assert isinstance(draft.get_output_embeddings(), TrimmedLMHead)
    trimmed = draft(ids).logits
    assert torch.allclose(trimmed[..., kept], full[..., kept], atol=1e-6)
    outside = torch.ones(50, dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(trimmed[..., outside]).all()
    assert sorted(draft.state_dict()) == keys  # the checkpoint is the untrimmed model's
    if tied:
        assert draft.get_output_embeddings().weight is draft.get_input_embeddings().weight

    draft.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded.get_output_embeddings(), torch.nn.Linear)  # plain transformers: full vocabulary
    assert torch.allclose(loaded(ids).logits, full, atol=1e-6)
    assert torch.equal(apply_draft_vocabulary(loaded), kept)
    assert torch.allclose(loaded(ids).logits, trimmed, atol=1e-6)


def test_bitmask_record_round_trips():
    ids = torch.tensor(sorted(torch.randperm(151936, generator=torch.Generator().manual_seed(0))[:4000].tolist()))
    assert torch.equal(decode_ids(encode_ids(ids, 151936), 151936), ids)


def test_generate_and_sampler_apply_a_saved_trimmed_draft(tmp_path):
    target, draft = build_pair("llama")
    trim_draft_vocabulary(draft, keep=range(3, 60))
    draft.save_pretrained(tmp_path)
    for load in ("generate", "sampler"):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        loaded.generation_config.assistant_confidence_threshold = 0.0
        ids = prompts(1)[0]
        if load == "generate":
            target.generate(ids, assistant_model=loaded, max_new_tokens=4, do_sample=False)  # plain assisted
        else:
            list(sample_batched(target, loaded, [SampleRequest(ids, "exact")], SamplerConfig(max_new_tokens=4)))
        assert isinstance(loaded.get_output_embeddings(), TrimmedLMHead), load


def test_greedy_sampler_equals_generate_with_a_trimmed_draft():
    target, draft = build_pair("llama")
    for model in (target, draft):  # the sampler's law is generate's with pad = EOS (see SamplerConfig)
        model.generation_config.pad_token_id = model.generation_config.eos_token_id
    trim_draft_vocabulary(draft, keep=range(3, 40))
    config = SamplerConfig(max_new_tokens=16, do_sample=False, num_assistant_tokens=4)
    for rule in ("exact", "static:0.4"):
        for ids in prompts(3, seed=7):
            out = target.generate(
                ids, assistant_model=draft, diversed_verifier=rule, return_dict_in_generate=True,
                **config.generate_kwargs(),
            )  # fmt: skip
            (result,) = sample_batched(target, draft, [SampleRequest(ids, rule)], config)
            assert torch.equal(out.sequences[0, ids.shape[1] :].cpu(), result.completion_ids), rule
            assert out.diversed_stats.accepted_per_round == result.stats.accepted_per_round, rule


# ------------------------------------------------------------------------------------------------ the kept set


def _word_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, "a": 3, "b": 4, "c": 5, "d": 6, "e": 7, "f": 8, "g": 9}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def test_size_keeps_the_most_frequent_ids_then_the_lowest_unseen():
    tokenizer = _word_tokenizer()
    draft = _tiny(0, vocab=10)
    corpus = ["g g g f f e", "g f d"]  # g: 4, f: 3, e: 1, d: 1
    trim_draft_vocabulary(draft, size=5, corpus=corpus, tokenizer=tokenizer)
    assert draft_vocabulary_ids(draft).tolist() == [0, 1, 2, 8, 9]  # specials, then g, f
    trim_draft_vocabulary(draft, size=7, corpus=corpus, tokenizer=tokenizer)
    assert draft_vocabulary_ids(draft).tolist() == [0, 1, 2, 6, 7, 8, 9]  # e and d tie: lower id first
    trim_draft_vocabulary(draft, size=9, corpus=corpus, tokenizer=tokenizer)
    assert draft_vocabulary_ids(draft).tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]  # unseen: lowest ids first
    record = draft.config.diversed_draft_vocabulary
    assert record["size"] == 9 and record["vocab_size"] == 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(), "exactly one of `keep`"),
        (dict(keep=[3], size=4), "exactly one of `keep`"),
        (dict(keep=[3, 12]), "outside the draft's vocabulary"),
        (dict(keep=[]), "`keep` is empty"),
        (dict(size=4), "pass `corpus=`"),
        (dict(size=2, corpus=["a b"]), "smaller than the 3 special tokens"),
        (dict(size=0, corpus=["a"]), "`size` must be an int"),
        (dict(size=4, corpus=[["a"]]), "must yield strings"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, message):
    kwargs.setdefault("tokenizer", _word_tokenizer()) if "corpus" in kwargs else None
    with pytest.raises(ValueError, match=message):
        trim_draft_vocabulary(_tiny(0, vocab=10), **kwargs)


def test_trimmed_ids_beyond_the_target_vocabulary_are_refused():
    target, draft = _tiny(0, vocab=6), _tiny(1, vocab=10)
    trim_draft_vocabulary(draft, keep=[2, 8])
    with pytest.raises(ValueError, match="trimmed vocabulary holds ids up to 8.*target's vocabulary has 6"):
        target.generate(torch.tensor([[3, 4]]), assistant_model=draft, diversed_verifier="exact", max_new_tokens=2)


def test_a_head_trained_with_another_draft_vocabulary_is_used_with_a_warning(caplog):
    target, draft = build_pair("llama")
    full_head = DiversedHead.for_models(target, draft)
    trim_draft_vocabulary(draft, keep=range(3, 60))
    own_head = DiversedHead.for_models(target, draft)
    assert own_head.config.draft_vocabulary == draft.config.diversed_draft_vocabulary["fingerprint"]
    ids = prompts(1)[0]
    ours = "hf_diversed.modeling.draft_vocabulary"
    with caplog.at_level(logging.WARNING, logger=ours):
        target.generate(ids, assistant_model=draft, diversed_head=own_head, max_new_tokens=3, do_sample=False)
        # transformers' own once-per-process warnings land here too, depending on which test ran first
        assert not [r for r in caplog.records if r.name == ours]
        target.generate(ids, assistant_model=draft, diversed_head=full_head, max_new_tokens=3, do_sample=False)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == ours]
    assert "trained with the full draft vocabulary" in warning and "reads hidden states" in warning


# ------------------------------------------------------------------------------------------------ the law

PROMPT = torch.tensor([[3, 5, 2]])
KEEP = [2, 3]  # with BOS 0 and EOS 1 kept: the draft never proposes 4 or 5, which p gives mass
CONFIG = SamplerConfig(max_new_tokens=5, do_sample=True, num_assistant_tokens=2)
N_REAL, N_SAMPLER = 1500, 12000


@pytest.fixture(scope="module")
def trimmed_pair():
    target, draft = _tiny(0), _tiny(1)
    trim_draft_vocabulary(draft, keep=KEEP)
    return target, draft


def _first_three(tokens: list[int]) -> tuple:
    return tuple(tokens[:3]) + (-1,) * (3 - min(3, len(tokens)))


@torch.no_grad()
def _target_law(target) -> dict[tuple, float]:
    """P(first three tokens) under the target alone, by enumeration (EOS = 1 ends a sequence: -1 after it)."""
    law: dict[tuple, float] = {}

    def walk(prefix: list[int], prob: float) -> None:
        if len(prefix) == 3 or (prefix and prefix[-1] == 1):
            law[_first_three(prefix)] = law.get(_first_three(prefix), 0.0) + prob
            return
        ids = torch.cat([PROMPT, torch.tensor([prefix], dtype=torch.long)], dim=1) if prefix else PROMPT
        p = target(ids).logits[0, -1].double().softmax(-1)
        for token, p_token in enumerate(p.tolist()):
            walk(prefix + [token], prob * p_token)

    walk([], 1.0)
    return law


def _gof_pvalue(counts: Counter, law: dict[tuple, float]) -> float:
    """Chi-square goodness of fit; cells expecting < 25 draws are pooled."""
    n = sum(counts.values())
    cells, pooled = [], [0.0, 0.0]
    for key, prob in law.items():
        if n * prob >= 25:
            cells.append((counts[key], n * prob))
        else:
            pooled[0] += counts[key]
            pooled[1] += n * prob
    assert set(counts) <= set(law)
    if pooled[1] > 0:
        cells.append(tuple(pooled))
    stat = sum((observed - expected) ** 2 / expected for observed, expected in cells)
    dof = max(len(cells) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0)))


def _generate_counts(target, draft, rule: str) -> Counter:
    torch.manual_seed(4321)
    counts: Counter = Counter()
    for _ in range(N_REAL):
        out = target.generate(PROMPT, assistant_model=draft, diversed_verifier=rule, **CONFIG.generate_kwargs())
        counts[_first_three(out[0, PROMPT.shape[1] :].tolist())] += 1
    return counts


def _sampler_counts(target, draft, rule: str) -> Counter:
    requests = [SampleRequest(PROMPT, rule, seed=s) for s in range(N_SAMPLER)]
    results = sample_batched(target, draft, requests, CONFIG, batch_size=2048)
    return Counter(_first_three(r.completion_ids.tolist()) for r in results)


@pytest.mark.slow
def test_exact_sd_with_a_trimmed_draft_outputs_the_target_law(trimmed_pair):
    target, draft = trimmed_pair
    law = _target_law(target)
    assert sum(p for key, p in law.items() if set(key) & {4, 5}) > 0.3  # much of p lies outside the kept set
    for engine, counts in (("generate", _generate_counts(target, draft, "exact")),
                           ("sampler", _sampler_counts(target, draft, "exact"))):  # fmt: skip
        p_value = _gof_pvalue(counts, law)
        assert p_value > ALPHA, f"{engine}: exact SD with a trimmed draft is not p (p = {p_value:.2e})"


@pytest.mark.slow
def test_the_static_ensemble_mixes_p_with_the_trimmed_q(trimmed_pair):
    """Its law is not p (the goodness-of-fit test sees that), and the sampler's law is generate's."""
    target, draft = trimmed_pair
    counts = _sampler_counts(target, draft, "static:0.5")
    assert _gof_pvalue(counts, _target_law(target)) < ALPHA
    p_value = _chi2_pvalue(_generate_counts(target, draft, "static:0.5"), counts)
    assert p_value > ALPHA, f"static 0.5 with a trimmed draft: sampler and generate differ (p = {p_value:.2e})"


# ------------------------------------------------------------------------------------------------ the command


def test_trim_draft_command_counts_a_tasks_train_split_and_corpus_files(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from hf_diversed.cli.main import main

    require_data_dir()
    words = ["<s>", "</s>", "<pad>", "the", "of", "and", "he", "she", "dollars", "Python", "def"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    draft = _tiny(0, vocab=len(words))
    draft.save_pretrained(tmp_path / "draft")
    tokenizer.save_pretrained(tmp_path / "draft")
    outputs = tmp_path / "outputs.jsonl"  # e.g. bench records of the target's own outputs
    outputs.write_text('{"completion": "def def def Python"}\n{"completion": "def Python"}\n')

    argv = ["trim-draft", "--draft", str(tmp_path / "draft"), "--task", "gsm8k", "--size", "6",
            "--output", str(tmp_path / "trimmed")]  # fmt: skip
    assert main(argv) == 0
    record = AutoModelForCausalLM.from_pretrained(tmp_path / "trimmed").config.diversed_draft_vocabulary
    assert record["source"] == "gsm8k train (14946 texts)"
    kept = [words[i] for i in decode_ids(record["ids"], record["vocab_size"]).tolist()]
    assert kept == ["<s>", "</s>", "<pad>", "the", "of", "and"]  # specials, then GSM8K's three most frequent

    assert main([*argv, "--corpus-file", str(outputs)]) == 0
    record = AutoModelForCausalLM.from_pretrained(tmp_path / "trimmed").config.diversed_draft_vocabulary
    assert record["source"] == "gsm8k train (14946 texts) + outputs.jsonl (2 texts)"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"answer": "42"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1 has no string `completion` or `text` field"):
        main([*argv, "--corpus-file", str(bad)])
