"""A padded pair: the draft's vocabulary is a prefix of the target's (one tokenizer; the target's extra rows are
padding, as Qwen2.5-7B's 152,064 ids against Qwen2.5-0.5B's 151,936). No argument is needed.

- Every engine reads the draft's law padded with zeros, q_pad = q on the draft's ids and 0 on the target-only ids:
  greedy, for every rule, generate's default and static loops and the batched sampler decode the padded pair
  exactly as the *reference pair*, the same draft as a model over the target's whole vocabulary (its LM head
  trimmed to its own ids by ``trim_draft_vocabulary``, -inf elsewhere; a target-only id in its context embedded as
  its last id, as the padded draft reads one): the same tokens and statistics.
- Greedy exact SD equals the target alone, token for token, target-only ids included.
- Exact SD's law is p over the target's whole vocabulary: the first three tokens pass a chi-square goodness-of-fit
  test against the target's law by enumeration (p puts about half its mass on sequences holding a target-only
  id), in the default loop, the static loop and the sampler. Verification over the draft's ids only (the
  target-only ids dropped from p and the residual) fails it at the same sample sizes.
- The mixtures keep their laws: static, cascade and head draws (first three tokens, accepted counts per round, bonus
  positions) match the reference pair's (two-sample chi-square tests), in each engine. The head reads max p, max q
  and TV(p, q) as well as the hidden states, so its w too is computed over the padded law.
- q padded with logit 0 instead of -inf (torch's default pad value: q then has mass on ids the draft never
  proposes) breaks the greedy identity in every engine and the sampler's static-ensemble law.
- The trainer's rollouts (generate's and the sampler's agree) trace a target-only token with q(y) = 0, and it
  trains; a head repository's standalone ``custom_generate`` recipe decodes as hf-diversed does.
- A draft with more ids than the target, or with fewer ids than the call's tokenizer, is refused in one line.

False failures: every statistical comparison is a chi-square test at level ALPHA = 2e-6 (cells expecting, or
holding, fewer than 25 draws pooled). This file makes 3 goodness-of-fit and 9 homogeneity tests x 3 outcomes that
should pass (3 + 6 in the default run, the rest with RUN_SLOW=1): a correct implementation fails any with
probability <= 30 * 2e-6 = 6e-5. The deliberate mistakes fail them with statistics far past the level.
"""

from __future__ import annotations

import copy
from collections import Counter

import datasets
import pytest
import torch
from conftest import DEVICE, EOS, chat_tokenizer
from laws import LAW_CONFIG, PROMPT, chi2_pvalue, outcomes, tiny_law_model
from test_batched import _featured_head
from test_draft_vocabulary import _gof_pvalue, _target_law
from test_trainer import _assert_same_rollout
from transformers import LlamaConfig, LlamaForCausalLM

from hf_diversed import trim_draft_vocabulary
from hf_diversed.generation import batched, decoding, static_loop
from hf_diversed.generation.batched import SamplerConfig, SampleRequest, sample_batched
from hf_diversed.generation.verification import VerificationRule
from hf_diversed.modeling.draft_vocabulary import pad_draft_logits
from hf_diversed.modeling.hub import write_custom_generate
from hf_diversed.trainer import DiversedConfig, DiversedTrainer
from hf_diversed.trainer.rollout import collect_rollout, collect_rollouts, rollouts_trace

ALPHA = 2e-6
TARGET_VOCAB, DRAFT_VOCAB = 160, 128  # the greedy pair; the law pair has 8 and 6 ids
RULES = ["exact", "static:0.5", "static:0", "lossy:0.7", "cascade-opt:0.1", "cascade-chow:0.3", "diversed"]


def _llama(vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=0, eos_token_id=EOS, pad_token_id=EOS,
        initializer_range=0.2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.generation_config.assistant_confidence_threshold = 0.0
    return model


def _padded_draft(target, vocab: int, noise: float) -> LlamaForCausalLM:
    """The target's first ``vocab`` rows with perturbed weights: a smaller vocabulary of the same tokenizer."""
    draft = copy.deepcopy(target).cpu()
    draft.resize_token_embeddings(vocab, mean_resizing=False)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(noise * param.std() * torch.randn_like(param) if param.numel() > 1 else 0)
    return draft.to(target.device)


def reference_draft(draft, target_vocab: int) -> LlamaForCausalLM:
    """``draft`` over the target's vocabulary with the law q_pad, built from the trimmed-vocabulary feature (not from
    the code under test): its LM head trimmed to its own ids (-inf elsewhere) and a target-only id embedded as its
    last id."""
    vocab = draft.config.vocab_size
    reference = copy.deepcopy(draft)
    reference.resize_token_embeddings(target_vocab, mean_resizing=False)
    with torch.no_grad():
        embeddings = reference.get_input_embeddings().weight
        embeddings[vocab:] = embeddings[vocab - 1]
    return trim_draft_vocabulary(reference, keep=range(vocab))


@pytest.fixture(scope="module")
def greedy_pair():
    """(target, padded draft, reference draft, head): 160 and 128 ids, the draft a perturbed copy of the target; the
    head reads the next-token laws (max p, max q, TV) as well as the hidden states."""
    target = _llama(TARGET_VOCAB, seed=0).to(DEVICE)
    draft = _padded_draft(target, DRAFT_VOCAB, noise=0.05)
    return target, draft, reference_draft(draft, TARGET_VOCAB), _featured_head(target, draft).to(DEVICE)


def _prompts(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, DRAFT_VOCAB, (1, 5 + i), generator=g).to(DEVICE) for i in range(n)]


def _generate(target, draft, ids, rule, head, **kwargs):
    chosen = dict(diversed_head=head) if rule == "diversed" else dict(diversed_verifier=rule)
    out = target.generate(ids, assistant_model=draft, return_dict_in_generate=True, **chosen, **kwargs)
    return out.sequences[0, ids.shape[1] :].cpu(), out.diversed_stats


def _same(a, b, what: str) -> None:
    (tokens_a, stats_a), (tokens_b, stats_b) = a, b
    assert torch.equal(tokens_a, tokens_b), f"{what}: tokens differ\n{tokens_a}\n{tokens_b}"
    assert stats_a.accepted_per_round == stats_b.accepted_per_round, f"{what}: accepted per round differ"
    for name in ("num_drafted", "num_accepted", "num_rounds", "num_verified"):
        assert getattr(stats_a, name) == getattr(stats_b, name), f"{what}: {name} differs"
    for name in ("weight_sum", "tv_sum"):
        assert getattr(stats_a, name) == pytest.approx(getattr(stats_b, name), abs=1e-4), what


# ------------------------------------------------------------------------------------------------ greedy


GREEDY = dict(max_new_tokens=24, do_sample=False, num_assistant_tokens=3, num_assistant_tokens_schedule="constant")


@pytest.mark.parametrize("loop", ["default", "static"])
def test_greedy_exact_sd_equals_the_target_alone(greedy_pair, loop):
    target, draft, _, _ = greedy_pair
    extra = {"cache_implementation": "static"} if loop == "static" else {}
    target_only = 0
    for ids in _prompts(3):
        alone = target.generate(ids, do_sample=False, max_new_tokens=24)[0, ids.shape[1] :].cpu()
        tokens, stats = _generate(target, draft, ids, "exact", None, **GREEDY, **extra)
        assert torch.equal(tokens, alone), f"{loop}: exact SD is not the target alone\n{tokens}\n{alone}"
        assert stats.num_accepted > 0
        target_only += int((alone >= DRAFT_VOCAB).sum())
    assert target_only >= 3  # the target emits ids the draft lacks, and the draft reads them in its context


@pytest.mark.parametrize("loop", ["default", "static", "sampler"])
def test_greedy_every_rule_decodes_as_the_zero_padded_draft(greedy_pair, loop):
    target, draft, reference, head = greedy_pair
    config = SamplerConfig(max_new_tokens=24, do_sample=False, num_assistant_tokens=3)
    for rule in RULES:
        for i, ids in enumerate(_prompts(2)):
            runs = []
            for model in (draft, reference):
                if loop == "sampler":
                    (result,) = sample_batched(
                        target, model, [SampleRequest(ids, rule, head=head if rule == "diversed" else None)], config
                    )
                    runs.append((result.completion_ids, result.stats))
                else:
                    extra = {"cache_implementation": "static"} if loop == "static" else {}
                    runs.append(_generate(target, model, ids, rule, head, **GREEDY, **extra))
            _same(runs[1], runs[0], f"{loop}, {rule}, prompt {i}")


@pytest.mark.parametrize("loop", ["default", "static", "sampler"])
def test_a_wrong_padding_breaks_greedy_identity(greedy_pair, monkeypatch, loop):
    """q padded with logit 0 instead of -inf (torch's default pad value): other tokens or statistics (TV)."""
    engine = {"default": decoding, "static": static_loop, "sampler": batched}[loop]
    monkeypatch.setattr(engine, "pad_draft_logits", _zero_logit_padding)
    with pytest.raises(AssertionError):
        test_greedy_every_rule_decodes_as_the_zero_padded_draft(greedy_pair, loop)


def test_repetition_penalty_reads_the_context_as_generate_does(greedy_pair):
    """The penalty acts on a padded draft's reading of its context (a target-only id as its last id) in both the
    default loop and the sampler, so the sampler keeps generate's law."""
    target, draft, _, head = greedy_pair
    config = SamplerConfig(max_new_tokens=24, do_sample=False, num_assistant_tokens=3, repetition_penalty=1.3)
    for rule in ("exact", "static:0.5", "diversed"):
        for ids in _prompts(2):
            expected = _generate(target, draft, ids, rule, head, **config.generate_kwargs())
            (result,) = sample_batched(
                target, draft, [SampleRequest(ids, rule, head=head if rule == "diversed" else None)], config
            )
            _same(expected, (result.completion_ids, result.stats), f"repetition penalty, {rule}")


def test_the_custom_generate_recipe_decodes_as_hf_diversed(greedy_pair, tmp_path):
    """The standalone recipe a head repository ships: greedy tokens, and sampled ones under the same seed, equal."""
    target, draft, _, head = greedy_pair
    head.save_pretrained(tmp_path)
    write_custom_generate(tmp_path, str(tmp_path))
    target_only = 0
    for i, ids in enumerate(_prompts(3)):
        for kwargs in (dict(do_sample=False), dict(do_sample=True)):
            torch.manual_seed(300 + i)
            ours = target.generate(
                ids, assistant_model=draft, diversed_head=head, max_new_tokens=24, num_assistant_tokens=3,
                num_assistant_tokens_schedule="constant", **kwargs,
            )  # fmt: skip
            torch.manual_seed(300 + i)
            recipe = target.generate(
                ids, assistant_model=draft, custom_generate=str(tmp_path), trust_remote_code=True, max_new_tokens=24,
                num_assistant_tokens=3, **kwargs,
            )  # fmt: skip
            assert torch.equal(recipe, ours), (i, kwargs)
            target_only += int((ours[0, ids.shape[1] :] >= DRAFT_VOCAB).sum())
    assert target_only >= 3


def test_the_trainer_draws_its_rollouts_and_trains_on_a_padded_pair(greedy_pair, tmp_path):
    """Rollouts from generate and from the sampler agree (greedy), a target-only token is traced with q(y) = 0, and
    a training step moves the head."""
    target, draft, _, head = greedy_pair
    ids = _prompts(3)
    settings = dict(max_new_tokens=16, temperature=0.0, num_assistant_tokens=3)
    rollouts = collect_rollouts(target, draft, head, ids, seeds=range(3), eos_token_id=EOS, **settings)
    for i, (prompt, rollout) in enumerate(zip(ids, rollouts, strict=True)):
        _assert_same_rollout(collect_rollout(target, draft, head, prompt, eos_token_id=EOS, **settings), rollout, i)
    trace = rollouts_trace(rollouts)
    target_only = trace.tokens >= DRAFT_VOCAB
    assert target_only.any() and (trace.q_y[target_only] == 0).all() and (trace.p_y[target_only] > 0).all()

    def reward(prompts, completions, **kwargs):  # rewards the target-only tokens, which only the target emits
        return [float(sum(token >= DRAFT_VOCAB for token in completion)) for completion in completions]

    config = DiversedConfig(
        task="gsm8k", num_prompts=4, max_new_tokens=12, num_assistant_tokens=3, learning_rate=2e-2, warmup_steps=0,
        lr_scheduler_type="constant", max_steps=4, num_iterations=2, output_dir=str(tmp_path), seed=0,
        save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    dataset = datasets.Dataset.from_list([{"input_ids": ids[0].tolist()} for ids in _prompts(4)])
    trainer = DiversedTrainer(target, draft, config, train_dataset=dataset, reward_funcs=[reward])
    before = copy.deepcopy(trainer.ref_head.state_dict())
    trainer.train()
    trained = trainer.accelerator.unwrap_model(trainer.model)
    assert any(not torch.equal(before[k].cpu(), v.cpu()) for k, v in trained.state_dict().items())


# ------------------------------------------------------------------------------------------------ laws

N_LOOP, N_SAMPLER = 1500, 12000
LAW_TARGET_SEED, LAW_DRAFT_SEED = 4, 1


@pytest.fixture(scope="module")
def law_pair():
    """(target with 8 ids, padded draft with 6, reference draft, head reading the laws too): unrelated weights, so
    TV(p, q) is large."""
    target, draft = tiny_law_model(LAW_TARGET_SEED, vocab=8), tiny_law_model(LAW_DRAFT_SEED, vocab=6)
    return target, draft, reference_draft(draft, 8), _featured_head(target, draft, scale=1.0, seed=2)


def _loop_draws(law_pair, rule: str, loop: str) -> dict[str, Counter]:
    target, draft, _, head = law_pair
    chosen = dict(diversed_head=head) if rule == "diversed" else dict(diversed_verifier=rule)
    extra = {"cache_implementation": "static"} if loop == "static" else {}
    draws = {"tokens": Counter(), "accepted": Counter(), "bonus": Counter()}
    torch.manual_seed(2468)
    for _ in range(N_LOOP):
        out = target.generate(
            PROMPT, assistant_model=draft, return_dict_in_generate=True,
            **LAW_CONFIG.generate_kwargs(), **chosen, **extra,
        )  # fmt: skip
        tokens = out.sequences[0, PROMPT.shape[1] :].tolist()
        for key, value in outcomes(tokens, out.diversed_stats.accepted_per_round).items():
            draws[key][value] += 1
    return draws


def _sampler_draws(law_pair, rule: str, reference: bool = False, sampler_class=batched._Sampler):
    target, draft, zero_padded, head = law_pair
    requests = [
        SampleRequest(PROMPT, rule, head=head if rule == "diversed" else None, seed=s) for s in range(N_SAMPLER)
    ]
    sampler = sampler_class(target, zero_padded if reference else draft, LAW_CONFIG, 2048, return_trace=False)
    draws = {"tokens": Counter(), "accepted": Counter(), "bonus": Counter()}
    for result in sampler.run(requests):
        for key, value in outcomes(result.completion_ids.tolist(), result.stats.accepted_per_round).items():
            draws[key][value] += 1
    return draws


def _draws(law_pair, rule: str, engine: str) -> dict[str, Counter]:
    return _sampler_draws(law_pair, rule) if engine == "sampler" else _loop_draws(law_pair, rule, engine)


def test_p_gives_the_target_only_ids_real_mass(law_pair):
    target, draft, _, _ = law_pair
    law = _target_law(target)
    assert sum(p for key, p in law.items() if set(key) & {6, 7}) > 0.4
    with torch.no_grad():
        p, q = target(PROMPT).logits[0, -1].softmax(-1), draft(PROMPT).logits[0, -1].softmax(-1)
    assert float(p[6:].sum()) > 0.1 and 0.5 * float((p - pad_draft_logits(q.log(), 8).exp()).abs().sum()) > 0.3


@pytest.mark.parametrize("engine", ["default", "static", "sampler"])
def test_exact_sd_outputs_p_over_the_whole_target_vocabulary(law_pair, engine):
    counts = _draws(law_pair, "exact", engine)["tokens"]
    p_value = _gof_pvalue(counts, _target_law(law_pair[0]))
    assert p_value > ALPHA, f"{engine}: exact SD on a padded pair is not p (p = {p_value:.2e})"


def _zero_logit_padding(draft_logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Deliberate mistake: q padded with logit 0 (torch's default pad value), not -inf."""
    return torch.nn.functional.pad(draft_logits, (0, vocab_size - draft_logits.shape[-1]))


class _DraftIdsOnly(batched._Sampler):
    """Deliberate mistake: verification over the draft's ids only (p renormalised on them, the residual without the
    target-only ids)."""

    def _processed(self, logits, vocab_size=None):
        scores = super()._processed(logits, vocab_size)
        if vocab_size is None:  # the target's scores
            scores[:, self.draft.vocab_size :] = float("-inf")
        return scores


def _verify_over_draft_ids(monkeypatch) -> None:
    """Deliberate mistake in the default loop: q left unpadded and p cut to the draft's ids."""
    original = VerificationRule.verify

    def verify(self, draft_tokens, draft_logits, target_logits, **kwargs):
        return original(self, draft_tokens, draft_logits, target_logits[..., : draft_logits.shape[-1]], **kwargs)

    monkeypatch.setattr(decoding, "pad_draft_logits", lambda draft_logits, vocab_size: draft_logits)
    monkeypatch.setattr(VerificationRule, "verify", verify)


@pytest.mark.parametrize("mistake", ["sampler", pytest.param("loop", marks=pytest.mark.slow)])
def test_verifying_over_the_draft_ids_only_breaks_exact_sd(law_pair, monkeypatch, mistake):
    if mistake == "loop":
        _verify_over_draft_ids(monkeypatch)
        counts = _loop_draws(law_pair, "exact", "default")["tokens"]
    else:
        counts = _sampler_draws(law_pair, "exact", sampler_class=_DraftIdsOnly)["tokens"]
    assert _gof_pvalue(counts, _target_law(law_pair[0])) < ALPHA


_MIXTURES = ["static:0.5", "cascade-opt:0.3", "diversed"]


@pytest.mark.parametrize(
    ("rule", "engine"),
    [
        pytest.param(rule, engine, marks=[] if rule == "diversed" and engine != "static" else pytest.mark.slow)
        for engine in ("sampler", "default", "static")
        for rule in _MIXTURES
    ],
)
def test_mixture_laws_are_those_of_the_zero_padded_draft(law_pair, rule, engine):
    reference, ours = _sampler_draws(law_pair, rule, reference=True), _draws(law_pair, rule, engine)
    for what in ("tokens", "accepted", "bonus"):
        p_value = chi2_pvalue(reference[what], ours[what])
        assert p_value > ALPHA, f"{engine}, {rule}: law of {what} differs from the reference pair (p = {p_value:.2e})"


def test_a_wrong_padding_breaks_a_mixture_law(law_pair, monkeypatch):
    """In the sampler, which draws the draft's token from the padded q itself, logit-0 padding leaves exact SD at p
    but mixes p with the wrong q."""
    reference = _sampler_draws(law_pair, "static:0.5", reference=True)
    monkeypatch.setattr(batched, "pad_draft_logits", _zero_logit_padding)
    wrong = _sampler_draws(law_pair, "static:0.5")
    assert min(chi2_pvalue(reference[what], wrong[what]) for what in ("tokens", "accepted", "bonus")) < ALPHA


# ------------------------------------------------------------------------------------------------ refusals


def test_a_draft_that_is_not_a_prefix_of_the_target_is_refused(greedy_pair):
    target, draft, _, _ = greedy_pair
    ids = _prompts(1)[0]
    larger = _padded_draft(target, TARGET_VOCAB + 8, noise=0.0)
    for call in (
        lambda: target.generate(ids, assistant_model=larger, diversed_verifier="exact", max_new_tokens=4),
        lambda: list(sample_batched(target, larger, [SampleRequest(ids, "exact")], SamplerConfig(max_new_tokens=4))),
    ):
        with pytest.raises(ValueError, match=f"vocab_size={TARGET_VOCAB} and the draft {TARGET_VOCAB + 8}.*tokenizer"):
            call()
    tokenizer = chat_tokenizer(["a tokenizer with more tokens than the draft has ids " * 4])
    assert len(tokenizer) > DRAFT_VOCAB
    with pytest.raises(ValueError, match="tokenizer has .* tokens but the draft's vocabulary only 128 ids"):
        target.generate(
            ids, assistant_model=draft, diversed_verifier="token-class:digits:0", tokenizer=tokenizer, max_new_tokens=4
        )
