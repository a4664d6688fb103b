"""Batched, law-exact sampling of speculative decoding: many sequences at once, without speculating.

Quality and acceptance depend only on the *law* of what a verification rule emits, and that law can be drawn
one position at a time. In the real loop a round drafts x_1..x_N from q, the target scores them in one pass and
they are checked in order; at the first rejection the position gets a correction from the rule's residual and
the later drafts are thrown away, after a fully accepted draft a bonus token comes from p. The thrown-away
drafts never touch the output, so walking the positions gives the same law::

    k = 0, N_r = min(N, max_new_tokens - generated - 1)           # what transformers drafts this round
    at each position t (one forward of each model on the prefix: p_t, q_t and both LM-head inputs):
        k < N_r (drafted):  x ~ q_t; with prob. min(1, ratio_t(x)) emit x, k += 1; else emit y ~ residual_t, end round
        k = N_r (bonus):    emit y ~ p_t, end round
    end of round: record (N_r drafted, k accepted); N += 2 if k = N_r else max(1, N - 1) under "heuristic"

Greedy replaces the draws by the rules' argmax tests. A drafted EOS ends the round's draft (the draft's own
``generate`` stops there), so an accepted EOS ends the round and the sequence, as in the real loop.
Sequences are rows of a batch with left padding; a finished row leaves and a waiting request takes its place;
requests that share a prompt (several rules, several samples) share one prefill of it. Every request draws
from its own generator seeded with ``request.seed``, so its result does not depend on the batch it fell in.
What this does not reproduce: wall-clock time; float rounding (one-token forwards instead of block forwards),
which in float32 should never flip a greedy choice and in bf16 rarely can; and one count. After a rejection
the real draft goes on proposing the round's later drafts (thrown away) and stops at an EOS among them, which
the walk never draws: in such a round ``num_drafted`` counts N_r where ``generate`` counts fewer. Tokens,
accepted counts, rounds, w and TV are exact.

The law is that of ``target.generate(prompt, assistant_model=draft, diversed_verifier=rule /
diversed_head=head, **config.generate_kwargs())`` with the draft's ``assistant_confidence_threshold`` at 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..modeling.distances import total_variation
from ..modeling.draft_vocabulary import (
    apply_draft_vocabulary,
    draft_input_ids,
    pad_draft_logits,
    padded_draft_vocab_size,
)
from ..modeling.modeling_diversed_head import (
    DiversedHead,
    distribution_features,
    head_verification,
    position_weights,
    reads_distribution_features,
)
from . import _compat
from .candidate_generator import LastHiddenStateRecorder
from .checks import CONTEXT_FREE_PROCESSORS, check_pair
from .stats import DiversedStats
from .trace import Trace, TraceBuilder
from .verification import LossySD, VerificationRule, lenience_overlap, parse_rule, rule_for_head

__all__ = ["SampleRequest", "SampleResult", "SamplerConfig", "sample_batched"]

_SCHEDULES = ("constant", "heuristic")
# Processors that act on each row alone (the context-free ones), plus those that read only the tokens of the row's
# own context (safe with left padding).
_ROW_LOCAL_PROCESSORS = CONTEXT_FREE_PROCESSORS | {"RepetitionPenaltyLogitsProcessor"}
_CONTEXT_PROCESSORS = {"RepetitionPenaltyLogitsProcessor"}


@dataclass(frozen=True)
class SamplerConfig:
    """Decoding settings shared by every request; :meth:`generate_kwargs` gives the equivalent ``generate`` call.

    ``temperature``, ``top_k``, ``top_p`` and ``repetition_penalty`` override the target's generation config as
    ``generate`` kwargs do; the processors are built by transformers exactly as ``generate`` builds them and
    applied once to the target's and once to the draft's logits (p_t and q_t). transformers' drafter hides a
    generated pad token (a ``pad_token_id`` that is not an EOS id) from the draft's later context; the sampler
    does not, so its law is that of ``generate`` with ``pad_token_id`` set to an EOS id, which
    :meth:`generate_kwargs` pins when ``eos_token_id`` is given (it changes nothing where the pad is an EOS id,
    as in Qwen2.5 chat models, or never generated).
    """

    max_new_tokens: int = 128
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    num_assistant_tokens: int = 5
    num_assistant_tokens_schedule: str = "constant"
    eos_token_id: int | tuple[int, ...] | None = None  # None: the target's generation config

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}.")
        if not isinstance(self.num_assistant_tokens, int) or self.num_assistant_tokens < 1:
            raise ValueError(f"num_assistant_tokens must be a positive int, got {self.num_assistant_tokens!r}; e.g. 5.")
        if self.num_assistant_tokens_schedule not in _SCHEDULES:
            raise ValueError(
                f"num_assistant_tokens_schedule {self.num_assistant_tokens_schedule!r} is not supported by the "
                f"batched sampler; use one of {', '.join(_SCHEDULES)} (transformers' 'dynamic' schedule adapts a "
                "confidence threshold the walk cannot follow)."
            )
        if self.do_sample and not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature!r}; use do_sample=False.")

    def generate_kwargs(self) -> dict[str, Any]:
        """The ``generate`` keyword arguments with the same law (pad = EOS, so no generated pad is masked)."""
        kwargs: dict[str, Any] = dict(
            max_new_tokens=self.max_new_tokens,
            do_sample=self.do_sample,
            repetition_penalty=self.repetition_penalty,
            num_assistant_tokens=self.num_assistant_tokens,
            num_assistant_tokens_schedule=self.num_assistant_tokens_schedule,
        )
        if self.do_sample:  # greedy builds no sampling warper: passing them would only make transformers warn
            kwargs.update(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        if self.eos_token_id is not None:
            eos = [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)
            kwargs.update(eos_token_id=eos, pad_token_id=eos[0])
        return kwargs


@dataclass
class SampleRequest:
    """One sequence to draw: a prompt (token ids, no padding), a rule (or a head for DIVERSED) and a seed.

    ``tag`` is returned unchanged with the result (e.g. the example index and the method).
    """

    prompt_ids: torch.Tensor
    rule: VerificationRule | str = "exact"
    head: DiversedHead | None = None
    seed: int = 0
    tag: Any = None


@dataclass
class SampleResult:
    """A finished request: its completion (EOS included), the statistics ``generate`` would report, why it
    stopped (``"eos"`` or ``"length"``) and, with ``return_trace``, its :class:`~.trace.Trace` (head inputs
    included)."""

    request: SampleRequest
    index: int
    completion_ids: torch.Tensor
    stats: DiversedStats
    finish_reason: str
    trace: Trace | None = None

    @property
    def tag(self) -> Any:
        return self.request.tag


# ------------------------------------------------------------------------------------------------ rows


@dataclass
class _Row:
    index: int
    request: SampleRequest
    rule: VerificationRule
    head: DiversedHead | None
    generator: torch.Generator | None
    context: list[int]
    schedule_n: int
    round_n: int = 0
    k: int = 0
    completion: list[int] = field(default_factory=list)
    stats: DiversedStats = field(default_factory=DiversedStats)
    round_w: float = 0.0
    round_tv: float = 0.0
    trace: TraceBuilder | None = None
    finish_reason: str | None = None


@dataclass
class _Prefix:
    """A prompt prefilled once by both models, kept until every request with that prompt has joined."""

    target_cache: Any
    draft_cache: Any
    target_logits: torch.Tensor  # (1, V) float32
    draft_logits: torch.Tensor
    target_hidden: torch.Tensor  # (1, D)
    draft_hidden: torch.Tensor
    length: int
    waiting: int


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token per row drawn from ``probs`` (rows, V) with uniforms ``u`` (rows,): the first token whose CDF exceeds
    u times the total. float64 sums, so the 150k-token tail is not lost to rounding."""
    cdf = probs.double().cumsum(-1)
    point = (u.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, point, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _uniforms(rows: list[_Row]) -> torch.Tensor:
    """Three uniforms per row from each row's own generator: (rows, 3): draft draw, accept test, residual/bonus."""
    return torch.stack([torch.rand(3, generator=row.generator) for row in rows])


class _Model:
    """One model of the pair over the batch: its cache, and one-token forwards that also read the LM-head input.
    ``vocab_size`` (a padded pair's draft): the ids it is fed are read as ``draft_vocabulary.draft_input_ids`` maps
    them."""

    def __init__(self, model, name: str, device: torch.device, vocab_size: int | None = None):
        self.model = model
        self.name = name
        self.device = device  # where the sampler keeps logits and hidden states: the target's device
        self.vocab_size = vocab_size
        self.recorder = LastHiddenStateRecorder(model)
        self.cache = None
        self.keep = _compat.supports_logits_to_keep(model)

    def _run(self, **inputs) -> tuple[Any, torch.Tensor, torch.Tensor]:
        # generate allows a draft on another device than the target's; so does the sampler
        inputs = {name: x.to(self.model.device) if isinstance(x, torch.Tensor) else x for name, x in inputs.items()}
        inputs["input_ids"] = draft_input_ids(inputs["input_ids"], self.vocab_size)
        if self.keep:
            inputs["logits_to_keep"] = 1
        with self.recorder:
            out = self.model(**inputs, use_cache=True)
        hidden = self.recorder.states[-1][:, -1].to(self.device)
        return out.past_key_values, out.logits[:, -1].to(self.device, torch.float32), hidden

    def prefill(self, ids: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor]:
        cache, logits, hidden = self._run(input_ids=ids, attention_mask=torch.ones_like(ids))
        _compat.check_batchable_cache(cache, self.name)
        return cache, logits, hidden

    def step(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
        cache, logits, hidden = self._run(
            input_ids=tokens.view(-1, 1), attention_mask=mask, position_ids=positions.view(-1, 1),
            past_key_values=self.cache,
        )  # fmt: skip
        self.cache = cache
        return logits, hidden


# ------------------------------------------------------------------------------------------------ sampler


class _Sampler:
    """The walk over a batch: ``rows`` (one per running request), both models' caches over those rows (right
    aligned, ``mask`` marks real tokens), and ``pending``: each row's next-position logits and LM-head inputs.
    Each iteration lets waiting requests join, decides one token per row, drops finished rows, then runs one
    forward of each model on the decided tokens."""

    def __init__(self, target, draft, config: SamplerConfig, batch_size: int, return_trace: bool):
        apply_draft_vocabulary(draft)
        check_pair(target, draft, None)
        threshold = getattr(draft.generation_config, "assistant_confidence_threshold", 0) or 0
        if threshold > 0:
            raise ValueError(
                f"The draft's generation_config.assistant_confidence_threshold is {threshold}: generate would stop "
                "each draft early below that confidence, which the batched sampler does not follow. Set "
                "draft.generation_config.assistant_confidence_threshold = 0.0 (both then draft N tokens a round)."
            )
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        self.config = config
        self.batch_size = batch_size
        self.return_trace = return_trace
        self.device = target.device
        self.target = _Model(target, "the target", self.device)
        self.draft = _Model(draft, "the draft", self.device, padded_draft_vocab_size(target, draft))
        processors, gen_config = _compat.generation_logits_processors(target, **config.generate_kwargs())
        names = [type(p).__name__ for p in processors]
        unsupported = [n for n in names if n not in _ROW_LOCAL_PROCESSORS]
        if unsupported:
            raise ValueError(
                f"generate would apply {', '.join(unsupported)} (from the target's generation_config), which the "
                "batched sampler does not implement. Neutralise it in target.generation_config, or use generate "
                "one sequence at a time."
            )
        self.processors = processors
        self.needs_context = any(n in _CONTEXT_PROCESSORS for n in names)
        eos = gen_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        self.eos = set(int(e) for e in eos)
        self.rows: list[_Row] = []
        self.slots: list[int] = []  # the cache row (slot) of each running row
        self.free: list[int] = []  # cache slots of finished rows, to be reused
        self.mask: torch.Tensor | None = None  # (slots, L) 1 = real token
        self.pending: tuple[torch.Tensor, ...] | None = None  # target logits, draft logits, target h, draft h

    # ------------------------------------------------------------------ joining and leaving

    def _new_row(self, index: int, request: SampleRequest) -> _Row:
        rule = parse_rule(request.rule)
        if rule.needs_head and request.head is None:
            raise ValueError(f"request {index} uses the DIVERSED rule but has no head; set SampleRequest.head.")
        if request.head is not None and not rule.needs_head:
            raise ValueError(
                f"request {index} has a head but its rule is {rule.spec()!r}; drop the head or use rule='diversed'."
            )
        if request.head is not None:
            check_pair(self.target.model, self.draft.model, request.head)
            rule = rule_for_head(rule, head_verification(request.head))  # a lenience head runs lossy SD
        generator = None
        if self.config.do_sample:
            generator = torch.Generator().manual_seed(int(request.seed))
        prompt = request.prompt_ids.reshape(-1).tolist()
        if not prompt:
            raise ValueError(f"request {index} has an empty prompt.")
        return _Row(
            index=index, request=request, rule=rule, head=request.head, generator=generator, context=prompt,
            schedule_n=self.config.num_assistant_tokens, trace=TraceBuilder() if self.return_trace else None,
        )  # fmt: skip

    def _join(self, joining: list[tuple[_Row, _Prefix]]) -> None:
        """Put new rows (each with its prompt's prefix) into free cache slots, right-aligned; add their pending
        distributions. The caches gain slots only when none is free (the first join allocates them)."""
        groups: list[list] = []  # [prefix, rows], consecutive rows sharing a prefix
        for row, prefix in joining:
            if groups and groups[-1][0] is prefix:
                groups[-1][1].append(row)
            else:
                groups.append([prefix, [row]])
        new_pending = [
            torch.cat([getattr(p, name).expand(len(rows), -1) for p, rows in groups])
            for name in ("target_logits", "draft_logits", "target_hidden", "draft_hidden")
        ]
        if self.target.cache is None:  # the first rows: build the caches around them
            prefixes, repeats = [g[0] for g in groups], [len(g[1]) for g in groups]
            self.target.cache = _compat.slot_cache([p.target_cache for p in prefixes], repeats)
            self.draft.cache = _compat.slot_cache([p.draft_cache for p in prefixes], repeats)
            length = self.target.cache.get_seq_length()
            self.mask = torch.zeros(len(joining), length, dtype=torch.long, device=self.device)
            for i, (_, prefix) in enumerate(joining):
                self.mask[i, length - prefix.length :] = 1
            self.slots = list(range(len(joining)))
        else:
            if len(self.free) < len(joining):
                extra, slots = len(joining) - len(self.free), self.mask.shape[0]
                for model in (self.target, self.draft):
                    _compat.cache_add_rows(model.cache, extra)
                self.mask = torch.cat([self.mask, self.mask.new_zeros(extra, self.mask.shape[1])])
                self.free += list(range(slots, slots + extra))
            self.free.sort(reverse=True)  # fill the lowest free slots first
            for prefix, rows in groups:
                slots = [self.free.pop() for _ in rows]
                # the two caches hold the same positions, so they grow left by the same count (one shared mask)
                extra = max(
                    _compat.cache_write_rows(model.cache, slots, cache)
                    for model, cache in ((self.target, prefix.target_cache), (self.draft, prefix.draft_cache))
                )
                if extra:
                    self.mask = torch.cat([self.mask.new_zeros(self.mask.shape[0], extra), self.mask], 1)
                self.mask[slots] = 0
                self.mask[slots, self.mask.shape[1] - prefix.length :] = 1
                self.slots += slots
        if self.rows:
            self.pending = tuple(torch.cat([a, b]) for a, b in zip(self.pending, new_pending, strict=True))
        else:
            self.pending = tuple(new_pending)
        self.rows += [row for row, _ in joining]

    def _leave(self, keep: list[int], more_waiting: bool) -> None:
        """Drop finished rows. Their slots stay in the caches (free, to be overwritten by joining rows); once no
        request waits and a quarter of the slots are free, the caches are compacted to the running rows."""
        kept = set(keep)
        self.free += [slot for i, slot in enumerate(self.slots) if i not in kept]
        self.rows = [self.rows[i] for i in keep]
        self.slots = [self.slots[i] for i in keep]
        if not self.rows:
            self.target.cache = self.draft.cache = self.mask = self.pending = None
            self.slots, self.free = [], []
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.pending = tuple(x.index_select(0, index) for x in self.pending)
        if not more_waiting and 4 * len(self.free) >= self.mask.shape[0]:
            live = torch.tensor(self.slots, dtype=torch.long, device=self.device)
            for model in (self.target, self.draft):
                _compat.cache_select_rows(model.cache, live)
            self.mask = self.mask.index_select(0, live)
            self.slots, self.free = list(range(len(self.rows))), []
        live_mask = self.mask[self.slots]
        lead = int(live_mask.argmax(-1).min())  # columns that are padding in every running row
        if lead > 0:
            for model in (self.target, self.draft):
                _compat.cache_drop_leading(model.cache, lead)
            self.mask = self.mask[:, lead:]

    # ------------------------------------------------------------------ one position of every row

    def _processed(self, logits: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
        """The processors applied to ``logits``; ``vocab_size``: the rows' contexts as a padded draft reads them."""
        if len(self.processors) == 0:
            return logits.float()
        if self.needs_context:
            width = max(len(r.context) for r in self.rows)
            ids = torch.tensor(
                [[r.context[-1]] * (width - len(r.context)) + r.context for r in self.rows], device=logits.device
            )  # left-filled with a token of the row itself, so the fill changes no penalty
            ids = draft_input_ids(ids, vocab_size)
        else:
            ids = torch.zeros(len(self.rows), 1, dtype=torch.long, device=logits.device)
        return self.processors(ids, logits.clone()).float()

    def _weights(self, p, q, h_target, h_draft, drafted: list[int]) -> torch.Tensor:
        """w_t per row (1 where not drafted), grouped by rule (and head)."""
        w = torch.ones(len(self.rows), dtype=p.dtype, device=p.device)
        groups: dict[tuple, list[int]] = {}
        for i in drafted:
            row = self.rows[i]
            groups.setdefault((row.rule, id(row.head)), []).append(i)
        for (rule, _), idx in groups.items():
            head = self.rows[idx[0]].head
            at = torch.tensor(idx, device=p.device)
            head_w = None
            if head is not None:
                features = distribution_features(p[at], q[at]) if reads_distribution_features(head) else None
                head_w = position_weights(head, h_draft[at], h_target[at], features)[:, None].to(p.device, p.dtype)
            w[at] = rule.weights(p[at].unsqueeze(1), q[at].unsqueeze(1), head_w).squeeze(1).to(p.dtype)
        return w

    def _decide(self) -> tuple[torch.Tensor, list[int]]:
        """Emit one token for every row; return the tokens fed next and the rows that finished.

        Drafted position (k < N_r): x ~ q (greedy: argmax q), accepted iff u <= ratio(p(x), q(x), w) (greedy: the
        rule's argmax test), else the correction ~ norm(residual) (p where the residual is all zero). Bonus
        position (k = N_r): y ~ p (greedy: argmax p)."""
        target_logits, draft_logits, h_target, h_draft = self.pending
        z_p = self._processed(target_logits)
        # a padded pair's q over the target's vocabulary (0 on the target-only ids), as generate's loop reads it
        z_q = pad_draft_logits(self._processed(draft_logits, self.draft.vocab_size), z_p.shape[-1])
        p, q = z_p.softmax(-1), z_q.softmax(-1)
        rows = self.rows
        drafted = [i for i, r in enumerate(rows) if r.k < r.round_n]
        bonus_rows = [i for i, r in enumerate(rows) if r.k >= r.round_n]
        w = self._weights(p, q, h_target, h_draft, drafted)
        sample = self.config.do_sample
        u = _uniforms(rows).to(p.device) if sample else None
        # Full-vocabulary work only for the rows that need it: draws from q and TV at drafted positions, from p at
        # bonus positions.
        x = torch.zeros(len(rows), dtype=torch.long, device=p.device)
        tv = torch.zeros(len(rows), dtype=p.dtype, device=p.device)
        bonus_tokens, corrections = torch.zeros_like(x), torch.zeros_like(x)
        accepted = torch.zeros(len(rows), dtype=torch.bool, device=p.device)
        if bonus_rows:
            b = torch.tensor(bonus_rows, device=p.device)
            bonus_tokens[b] = self._bonus(p[b], q[b], z_p[b], u[b] if sample else None)
        if drafted:
            d = torch.tensor(drafted, device=p.device)
            # Most rows are at a drafted position: then the full-vocabulary work runs on all rows (the bonus rows'
            # results are dropped), which is cheaper than copying the drafted rows out first.
            full = 2 * len(drafted) > len(rows)
            p_d, q_d = (p, q) if full else (p[d], q[d])
            pick = d if full else slice(None)
            if sample:
                x[d] = _inverse_cdf(q_d, u[:, 0] if full else u[d, 0])[pick]
            else:
                x[d] = (z_q if full else z_q[d]).argmax(-1)[pick]
            tv[d] = total_variation(p_d, q_d)[pick]
            groups: dict[VerificationRule, list[int]] = {}
            for i in drafted:
                groups.setdefault(rows[i].rule, []).append(i)
            if sample:
                p_x, q_x = p.gather(1, x[:, None]), q.gather(1, x[:, None])  # (rows, 1); bonus rows unused
                rejected: dict[VerificationRule, list[int]] = {}
                for rule, idx in groups.items():
                    at = torch.tensor(idx, device=p.device)
                    ok = u[at, 1] <= rule.acceptance_ratio(p_x[at], q_x[at], w[at].unsqueeze(1)).squeeze(1)
                    accepted[at] = ok
                    rejected[rule] = at[~ok].tolist()
                for rule, idx in rejected.items():  # the residual only where a draft was rejected
                    if not idx:
                        continue
                    at = torch.tensor(idx, device=p.device)
                    residual = rule.residual(p[at].unsqueeze(1), q[at].unsqueeze(1), w[at].view(-1, 1)).squeeze(1)
                    mass = residual.sum(-1, keepdim=True)
                    usable = mass > torch.finfo(mass.dtype).tiny
                    dist = torch.where(usable, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), p[at])
                    corrections[at] = _inverse_cdf(dist, u[at, 2])
            else:
                for rule, idx in groups.items():
                    at = torch.tensor(idx, device=p.device)
                    p_g, q_g, w_g, x_g = p[at].unsqueeze(1), q[at].unsqueeze(1), w[at].unsqueeze(1), x[at].unsqueeze(1)
                    ok, targets = rule.greedy_accept(x_g, p_g, q_g, w_g, z_p[at].unsqueeze(1))
                    accepted[at] = ok.squeeze(1)
                    corrections[at] = targets.squeeze(1)
        finished, out = [], []
        # one transfer of the per-row verdicts, then plain Python per row
        x, accepted, corrections, bonus_tokens = (t.tolist() for t in (x, accepted, corrections, bonus_tokens))
        w_list, tv_list = w.tolist(), tv.tolist()
        if any(row.trace is not None for row in rows):
            top_p, top_q = p.argmax(-1).tolist(), q.argmax(-1).tolist()
            max_p, max_q = p.amax(-1).tolist(), q.amax(-1).tolist()
        # S(l) and its slope, which only a lenience head's trainer reads: on the traced drafted rows of lossy rules
        lossy = [i for i in drafted if rows[i].trace is not None and isinstance(rows[i].rule, LossySD)]
        overlaps: dict[int, dict[str, float]] = {}
        if lossy:
            at = torch.tensor(lossy, device=p.device)
            overlap, slope = (t.tolist() for t in lenience_overlap(p[at], q[at], w[at]))
            overlaps = {i: {"overlap": o, "overlap_slope": s} for i, o, s in zip(lossy, overlap, slope, strict=True)}
        for i, row in enumerate(rows):
            if row.k < row.round_n:  # a drafted position
                if x[i] in self.eos:
                    row.round_n = row.k + 1  # the draft's own generate stops drafting at an EOS
                row.round_w += w_list[i]
                row.round_tv += tv_list[i]
                if accepted[i]:
                    token, row.k, ends, ok = x[i], row.k + 1, False, True
                else:
                    token, ends, ok = corrections[i], True, False
                if row.trace is not None:
                    row.trace.append(
                        tokens=token, p_y=float(p[i, token]), q_y=float(q[i, token]), tv=tv_list[i], w=w_list[i],
                        accepted=ok, top_p=top_p[i], top_q=top_q[i], max_p=max_p[i], max_q=max_q[i],
                        h_draft=h_draft[i].float().cpu(), h_target=h_target[i].float().cpu(), **overlaps.get(i, {}),
                    )  # fmt: skip
            else:  # the bonus position
                token, ends = bonus_tokens[i], True
            out.append(token)
            row.context.append(token)
            row.completion.append(token)
            if token in self.eos:
                row.finish_reason, ends = "eos", True
            elif len(row.completion) >= self.config.max_new_tokens:
                row.finish_reason = "length"  # rounds are sized so that this is always a round's last position
            if ends:
                self._end_round(row)
                if row.finish_reason is not None:
                    finished.append(i)
                else:
                    self._start_round(row)
        return torch.tensor(out, dtype=torch.long), finished

    def _bonus(self, p: torch.Tensor, q: torch.Tensor, z_p: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
        """The token each row emits if its position is the bonus one: y ~ p (greedy: argmax p)."""
        return _inverse_cdf(p, u[:, 2]) if u is not None else z_p.argmax(-1)

    def _start_round(self, row: _Row) -> None:
        row.k, row.round_w, row.round_tv = 0, 0.0, 0.0
        row.round_n = max(0, min(row.schedule_n, self.config.max_new_tokens - len(row.completion) - 1))

    def _end_round(self, row: _Row) -> None:
        row.stats.record_round(row.round_n, row.k, row.round_w, row.round_tv)
        if self.config.num_assistant_tokens_schedule == "heuristic":
            row.schedule_n = row.schedule_n + 2 if row.k == row.round_n else max(1, row.schedule_n - 1)

    def _result(self, row: _Row) -> SampleResult:
        trace = None
        if row.trace is not None:
            trace = row.trace.build(self.draft.model.config.get_text_config().hidden_size,
                                    self.target.model.config.get_text_config().hidden_size)  # fmt: skip
        return SampleResult(
            request=row.request, index=row.index, completion_ids=torch.tensor(row.completion, dtype=torch.long),
            stats=row.stats, finish_reason=row.finish_reason, trace=trace,
        )  # fmt: skip

    # ------------------------------------------------------------------ the loop

    def run(self, requests: list[SampleRequest]) -> Iterator[SampleResult]:
        waiting_per_prompt: dict[tuple[int, ...], int] = {}
        keys = []
        for request in requests:
            key = tuple(request.prompt_ids.reshape(-1).tolist())
            keys.append(key)
            waiting_per_prompt[key] = waiting_per_prompt.get(key, 0) + 1
        prefixes: dict[tuple[int, ...], _Prefix] = {}
        next_request = 0
        while True:  # autograd off while decoding, never across a yield: the caller runs in its own grad mode
            with torch.no_grad():
                joining = []
                while next_request < len(requests) and len(self.rows) + len(joining) < self.batch_size:
                    request, key = requests[next_request], keys[next_request]
                    row = self._new_row(next_request, request)
                    prefix = prefixes.get(key)
                    if prefix is None:
                        prefix = prefixes[key] = self._prefill(key, waiting_per_prompt[key])
                    prefix.waiting -= 1
                    if prefix.waiting == 0:
                        del prefixes[key]
                    self._start_round(row)
                    joining.append((row, prefix))
                    next_request += 1
                if joining:
                    self._join(joining)
                if not self.rows:
                    return
                tokens, finished = self._decide()
                results = [self._result(self.rows[i]) for i in finished]
            yield from results
            with torch.no_grad():
                if finished:
                    done = set(finished)
                    keep = [i for i in range(len(self.rows)) if i not in done]
                    tokens = tokens[keep] if keep else tokens[:0]
                    self._leave(keep, more_waiting=next_request < len(requests))
                if self.rows:
                    self._forward(tokens.to(self.device))

    def _prefill(self, key: tuple[int, ...], waiting: int) -> _Prefix:
        ids = torch.tensor([key], dtype=torch.long, device=self.device)
        t_cache, t_logits, t_hidden = self.target.prefill(ids)
        d_cache, d_logits, d_hidden = self.draft.prefill(ids)
        return _Prefix(t_cache, d_cache, t_logits, d_logits, t_hidden, d_hidden, len(key), waiting)

    def _forward(self, tokens: torch.Tensor) -> None:
        """One forward of each model over every cache slot: running rows feed their decided token; free slots feed
        token 0 at a new unmasked column (their outputs are dropped, and keep their cached values finite)."""
        slots = self.mask.shape[0]
        dense = self.slots == list(range(slots))
        if not dense:
            index = torch.tensor(self.slots, dtype=torch.long, device=self.device)
            tokens = tokens.new_zeros(slots).index_copy_(0, index, tokens)
        positions = self.mask.sum(-1)
        self.mask = torch.cat([self.mask, self.mask.new_ones(slots, 1)], 1)
        t_logits, t_hidden = self.target.step(tokens, self.mask, positions)
        d_logits, d_hidden = self.draft.step(tokens, self.mask, positions)
        self.pending = (t_logits, d_logits, t_hidden, d_hidden)
        if not dense:
            self.pending = tuple(x.index_select(0, index) for x in self.pending)


def sample_batched(
    target,
    draft,
    requests: Iterable[SampleRequest],
    config: SamplerConfig | None = None,
    *,
    batch_size: int = 32,
    return_trace: bool = False,
) -> Iterator[SampleResult]:
    """Draw each request's sequence with the law of ``generate`` under its rule, ``batch_size`` rows at a time.

    Yields :class:`SampleResult` as sequences finish (not in request order; ``result.index`` is the request's
    position). ``return_trace`` adds the per-position features the head trainer uses.
    """
    _compat.check_transformers_version()  # the sampler edits transformers' caches and builds its processors
    config = config or SamplerConfig()
    requests = list(requests)
    sampler = _Sampler(target, draft, config, batch_size, return_trace)
    for i, request in enumerate(requests):  # fail before any compute on a bad request
        sampler._new_row(i, request)
    return sampler.run(requests)
