"""The speculative loop on static KV caches, compiled: ``generate(..., cache_implementation="static")``.

Same law as the dynamic-cache loop (``decoding.py``) for every rule, the head included; what changes is how a
round runs on the device:

- target and draft each write into a ``StaticCache`` sized for the whole generation plus one round; a rejected
  draft is rolled back by setting the cache's position back (later writes overwrite it, the causal mask hides it
  until then), never by re-allocating or cropping;
- fixed shapes: a draft step is one token (two after a fully accepted round), a verification N + 1 tokens
  (positions a short last round does not draft are padding whose outputs are dropped); the prompt's prefill is
  separate and eager;
- attention reads a window of each cache, not the whole of it: the first 256·2^k positions that cover the round
  (``_compat.WindowedStaticLayer``), so a step costs what its sequence needs; each window is its own compiled
  graph (at most 1 + log2(cache length / 256) of them per step shape), entered as the sequence grows;
- the verdict (rule, head, residual, bonus) is computed on the device by the same ``VerificationRule.verify``;
  the host reads one small tensor per round (accepted count, emitted count, statistics);
- the draft step and the verification are compiled with ``model.get_compiled_call(compile_config)`` (transformers'
  own compiled forward; ``mode="reduce-overhead"`` records CUDA graphs on a GPU) when a ``compile_config`` is given,
  or by default on an accelerator, as transformers compiles a static-cache ``generate``; ``disable_compile=True``
  runs the same loop eagerly. The first round runs eagerly (it also installs transformers' output hooks).

Round r with ``last`` the newest token (in neither cache) and N_r = min(N, max_length - cur - 1) drafts::

    draft:   feed last, x_1, ..., x_{N_r - 1} one token at a time; x_i ~ q_i      (cache: + N_r positions)
    target:  feed [last, x_1, ..., x_N] once -> p_1 .. p_{N+1}                     (cache: + N + 1 positions)
    verdict: rule.verify(x_{1..N_r}, q_{1..N_r}, p_{1..N_r+1}) -> k accepted, then y
    emit x_1..x_k, y (cropped at the first EOS and at max_length); both caches rewound to cur + k
    (after a fully accepted round the draft's cache lacks x_{N_r}: the next round's first draft step feeds the two
    tokens [x_{N_r}, y] at once, a second step shape, as the dynamic loop's draft does, instead of one more step)

What the dynamic loop does and this one does not, refused with the fix named: sliding-window caches, logits
processors that read the generated text (repetition penalty, n-gram blocking, ...), a draft-length schedule
other than "constant", per-step outputs (scores, logits, attentions, hidden states), ``synced_gpus``.
The draft's ``assistant_confidence_threshold`` (which stops the dynamic loop's drafting early) is not applied:
every round drafts N tokens, and a warning says so when the threshold is set.
"""

from __future__ import annotations

import logging

import torch
import torch._dynamo

from ..modeling.draft_vocabulary import draft_input_ids, pad_draft_logits, padded_draft_vocab_size
from ..modeling.modeling_diversed_head import distribution_features, position_weights, reads_distribution_features
from . import _compat
from .checks import CONTEXT_FREE_PROCESSORS
from .decoding import DecodingSettings, DiversedGenerateOutput

logger = logging.getLogger(__name__)

_HANDLED_STOPPING = frozenset({"MaxLengthCriteria", "EosTokenCriteria"})
_PER_STEP_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


# transformers' models share one decorated forward code object, and Dynamo keeps `recompile_limit` (8) compiled
# variants per code object: target and draft, with and without hidden states, and transformers' own static-cache
# generate already take up to six. The loop's compiled calls run with room for more.
RECOMPILE_LIMIT = 64


def compiled_forward(model, compile_config):
    """``model.get_compiled_call(compile_config)`` (transformers' compiled ``__call__``), called with Dynamo's
    ``recompile_limit`` raised to at least :data:`RECOMPILE_LIMIT` for the call."""
    call = model.get_compiled_call(compile_config)

    def forward(**kwargs):
        with torch._dynamo.config.patch(recompile_limit=max(RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)):
            return call(**kwargs)

    return forward


def _refuse(problem: str) -> ValueError:
    return ValueError(f"cache_implementation='static' with speculative decoding: {problem}")


def _check(model, draft, settings: DecodingSettings, generation_config, logits_processor, model_kwargs) -> int:
    """Validate what the static loop can run; return the draft length N."""
    if draft is None:
        raise _refuse("it needs a draft model; pass assistant_model=draft.")
    if draft is model:
        raise _refuse("the draft is the target itself (each keeps its own cache). Pass another model as the draft.")
    schedule = settings.num_assistant_tokens_schedule or draft.generation_config.num_assistant_tokens_schedule
    if schedule not in (None, "constant"):
        raise _refuse(
            f"the draft length must be fixed, got num_assistant_tokens_schedule={schedule!r}. "
            'Pass num_assistant_tokens_schedule="constant" (and num_assistant_tokens=N).'
        )
    n = settings.num_assistant_tokens or draft.generation_config.num_assistant_tokens or 20  # transformers' default
    blocked = [type(p).__name__ for p in logits_processor if type(p).__name__ not in CONTEXT_FREE_PROCESSORS]
    if blocked:
        raise _refuse(
            f"{', '.join(blocked)} (logits processors) need the generated text, which the compiled round does not "
            "replay per token. Drop those options (e.g. repetition_penalty), or omit cache_implementation for the "
            "dynamic-cache loop."
        )
    if generation_config.return_dict_in_generate:
        asked = [name for name in _PER_STEP_OUTPUTS if getattr(generation_config, name, False)]
        if asked:
            raise _refuse(
                f"{', '.join(asked)} are not recorded by the static loop. Drop them, or omit cache_implementation."
            )
    if settings.trace is not None:
        raise _refuse("per-round traces (rollouts) run on the dynamic-cache loop; omit cache_implementation.")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise _refuse("the prompt has padding (an attention_mask with zeros). Pass the prompt without padding.")
    if getattr(draft.generation_config, "assistant_confidence_threshold", 0):
        logger.warning(
            "The static-cache loop drafts %d tokens every round; the draft's assistant_confidence_threshold=%s is not "
            "applied (set assistant_model.generation_config.assistant_confidence_threshold = 0 to silence this).",
            n,
            draft.generation_config.assistant_confidence_threshold,
        )
    return n


class _Stepper:
    """One model on its static cache: forwards (eager or compiled) and rollback by position. ``vocab_size`` (a
    padded pair's draft): the ids it is fed are read as ``draft_vocabulary.draft_input_ids`` maps them."""

    def __init__(
        self, model, max_cache_len: int, compile_config, compiled: bool, hidden: bool, vocab_size: int | None = None
    ):
        self.model = model
        self.cache = _compat.static_cache(model, max_cache_len)
        self.compiled = compiled_forward(model, compile_config) if compiled else None
        self.hidden = hidden
        self.vocab_size = vocab_size
        self.window: int | None = None

    def prefill(self, input_ids: torch.Tensor) -> None:
        kwargs = {"logits_to_keep": 1} if _compat.supports_logits_to_keep(self.model) else {}
        input_ids = draft_input_ids(input_ids, self.vocab_size)
        self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, **kwargs)

    def __call__(self, input_ids: torch.Tensor, eager: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """float32 logits (1, L, V) and last hidden states (1, L, D) (or None), copied out of the compiled graph's
        buffers (a CUDA-graph replay overwrites its outputs)."""
        call = self.model.__call__ if eager or self.compiled is None else self.compiled
        # one layout for every call: Dynamo guards on strides, and a (1, 1) slice of a longer row has other strides
        input_ids = draft_input_ids(input_ids, self.vocab_size).clone(memory_format=torch.contiguous_format)
        out = call(input_ids=input_ids, past_key_values=self.cache, use_cache=True, output_hidden_states=self.hidden)
        logits = out.logits.to(torch.float32, copy=True)
        return logits, (out.hidden_states[-1].clone() if self.hidden else None)

    def rewind(self, length: int) -> None:
        _compat.rewind_static_cache(self.cache, length)

    def reach(self, length: int) -> None:
        """Let the next forwards attend over a window of the cache covering its first ``length`` positions."""
        if self.window is None or self.window < length:
            self.window = _compat.set_static_window(self.cache, length)


@torch.no_grad()
def compile_windows(
    model, assistant_model, *, max_cache_len: int, num_assistant_tokens: int, compile_config, diversed_head=None
) -> list[int]:
    """Compile the static loop's steps for every attention window ahead of time; returns the windows.

    ``model.generate(..., assistant_model=assistant_model, cache_implementation="static", compile_config=...,
    max_cache_len=max_cache_len, num_assistant_tokens=N)`` runs on caches of ``max_cache_len + N + 1`` positions and
    enters a new attention window (one more compiled graph) as its sequence grows. This runs the compiled draft steps
    (1 and 2 tokens) and verification (N + 1 tokens) once per window on those caches, as the loop calls them, so that
    such calls compile nothing (the warm-up paid up front, as a server captures its graphs at start-up). Pass the
    ``diversed_head`` the calls will pass (or any head): with a head the steps also return hidden states, which are
    other graphs; the head itself runs outside them.
    """
    n, hidden = num_assistant_tokens, diversed_head is not None
    steppers = [(_Stepper(assistant_model, max_cache_len + n + 1, compile_config, True, hidden), (1, 2)),
                (_Stepper(model, max_cache_len + n + 1, compile_config, True, hidden), (n + 1,))]  # fmt: skip
    windows = set()
    with _compat.grouped_attention_on_cpu():
        for stepper, widths in steppers:
            length = stepper.cache.layers[0].max_cache_len  # a larger cache kept from an earlier call is reused
            stepper.reach(max(widths))
            stepper(torch.zeros((1, 1), dtype=torch.long, device=stepper.model.device), eager=True)  # installs hooks
            for window in sorted({_compat.static_window(k, length) for k in range(n + 2, length + 1)}):
                stepper.reach(window)
                for width in widths:
                    stepper.rewind(window - width)
                    stepper(torch.zeros((1, width), dtype=torch.long, device=stepper.model.device), eager=False)
                windows.add(window)
            stepper.rewind(0)
    return sorted(windows)


def _process(logits_processor, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Apply context-free processors to every row of ``scores`` (R, V) at once."""
    if len(logits_processor) == 0:
        return scores
    return logits_processor(input_ids.expand(scores.shape[0], -1), scores)


def should_compile(model, generation_config) -> bool:
    """Compile when asked (``compile_config``) or on an accelerator, unless ``disable_compile``."""
    if generation_config.disable_compile:
        return False
    return generation_config.compile_config is not None or model.device.type in ("cuda", "xpu")


@torch.no_grad()
def static_assisted_decoding(
    model,
    settings: DecodingSettings,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    inputs_tensor: torch.Tensor | None = None,
    assistant_model=None,
    assistant_tokenizer=None,
    tokenizer=None,
    **model_kwargs,
):
    """Drop-in for ``GenerationMixin._assisted_decoding`` with ``cache_implementation="static"`` (batch size 1)."""
    settings.entered = True
    if synced_gpus:
        raise _refuse("synced_gpus is not supported. Drop it, or omit cache_implementation.")
    draft = assistant_model
    n = _check(model, draft, settings, generation_config, logits_processor, model_kwargs)
    max_length = generation_config.max_length
    compiled = should_compile(model, generation_config)
    hidden = settings.head is not None
    # transformers' max_cache_len sizes the cache for the longest call to come, so later calls reuse its graphs
    cache_len = max(max_length, generation_config.max_cache_len or 0) + n + 1
    target = _Stepper(model, cache_len, generation_config.compile_config, compiled, hidden)
    drafter = _Stepper(
        draft, cache_len, generation_config.compile_config, compiled, hidden, padded_draft_vocab_size(model, draft)
    )
    eos = getattr(generation_config, "_eos_token_tensor", None)
    if eos is not None:
        eos = eos.to(input_ids.device).view(-1)
    extra_stopping = [c for c in stopping_criteria if type(c).__name__ not in _HANDLED_STOPPING]
    rule, head, stats, generator = settings.rule, settings.head, settings.stats, settings.generator
    do_sample = generation_config.do_sample

    cur = input_ids.shape[1]
    for stepper in (target, drafter):
        stepper.reach(cur + n)
    if cur > 1:
        target.prefill(input_ids[:, :-1])
        drafter.prefill(input_ids[:, :-1].to(draft.device))
    last = input_ids[:, -1:]
    pending = None  # after a fully accepted round: the newest draft, not yet in the draft's cache
    padding = input_ids.new_zeros(1, n)
    positions = torch.arange(n + 1, device=input_ids.device)
    eager = True
    while cur < max_length:
        n_round = min(n, max_length - cur - 1)
        target.reach(cur + n)  # the round writes positions up to cur - 1 + n in either cache
        drafter.reach(cur + n)
        # 1. Draft N_r tokens, one fixed-shape step each (the first feeds [x_N, last] after a fully accepted round).
        token, drafts, q_rows, h_draft = last, [], [], []
        for i in range(n_round):
            feed = torch.cat([pending, last], dim=1) if i == 0 and pending is not None else token
            logits, h = drafter(feed.to(draft.device), eager)
            scores = _process(logits_processor, input_ids, logits[:, -1].to(input_ids.device))
            if do_sample:
                token = torch.multinomial(scores.softmax(-1), 1, generator=generator)
            else:
                token = scores.argmax(-1, keepdim=True)
            drafts.append(token)
            q_rows.append(scores)
            if h is not None:
                h_draft.append(h[:, -1])
        # 2. Verify: one fixed-shape target forward over [last, x_1..x_N].
        block = torch.cat([last, *drafts, padding[:, : n - n_round]], dim=1)
        logits, h_target = target(block, eager)
        p_scores = _process(logits_processor, input_ids, logits[0, : n_round + 1].to(input_ids.device)).unsqueeze(0)
        draft_tokens = block[:, 1 : n_round + 1]
        q_scores = torch.stack(q_rows, dim=1) if drafts else p_scores[:, :0]
        q_scores = pad_draft_logits(q_scores, p_scores.shape[-1])  # a padded pair's q: 0 on the target-only ids
        head_weight = None
        if head is not None:
            head_weight = p_scores.new_ones(1, 0)
            if n_round > 0:
                features = None
                if reads_distribution_features(head):
                    features = distribution_features(p_scores[0, :n_round].softmax(-1), q_scores[0].softmax(-1))
                w = position_weights(head, torch.stack(h_draft, dim=1)[0], h_target[0, :n_round], features)
                head_weight = w.to(p_scores.device)[None]
        verdict = rule.verify(
            draft_tokens, q_scores, p_scores, do_sample=do_sample, head_weight=head_weight, generator=generator
        )
        # 3. Everything the host needs, in one read: the dynamic loop's raw counts (its draft stops at an EOS, so
        #    it drafts g = min(N_r, first drafted EOS + 1)), the emitted count up to the first emitted EOS, w and TV.
        accepted = verdict.num_accepted[0]
        tokens = verdict.tokens[0]
        # torch.full, not torch.tensor: a host-to-device copy would wait for the queued work (a second sync)
        drafted, emitted = torch.full((), n_round, device=tokens.device), accepted + 1
        ends = torch.zeros((), dtype=torch.bool, device=tokens.device)
        if eos is not None:
            if n_round > 0:
                is_eos = torch.isin(draft_tokens[0], eos)
                drafted = torch.where(is_eos.any(), is_eos.int().argmax() + 1, drafted)
            is_eos = torch.isin(tokens, eos) & (positions[: n_round + 1] <= accepted)
            ends = is_eos.any()
            emitted = torch.where(ends, is_eos.int().argmax() + 1, emitted)
        raw = torch.minimum(accepted, drafted)
        verified = positions[:n_round] < torch.minimum(raw + 1, drafted)
        summary = torch.stack(
            [
                raw.double(),
                drafted.double(),
                emitted.double(),
                (verdict.weight[0] * verified).sum().double(),
                (verdict.tv[0] * verified).sum().double(),
                ends.double(),
            ]
        ).tolist()
        num_raw, num_drafted, num_emitted = int(summary[0]), int(summary[1]), int(summary[2])
        stats.record_round(num_drafted, num_raw, summary[3], summary[4])
        num_emitted = min(num_emitted, max_length - cur)
        new_tokens = verdict.tokens[:, :num_emitted]
        # 4. Append; roll both caches back to everything but the newest token.
        input_ids = torch.cat([input_ids, new_tokens], dim=1)
        if streamer is not None:
            streamer.put(new_tokens.cpu())
        cur += num_emitted
        target.rewind(cur - 1)
        if num_emitted - 1 == n_round:  # every draft accepted: the draft's cache lacks the last one
            pending = block[:, n_round : n_round + 1]
            drafter.rewind(cur - 2)
        else:
            pending = None
            drafter.rewind(cur - 1)
        last = new_tokens[:, -1:]
        eager = False
        if summary[5]:  # an EOS was emitted (the emitted tokens end on it)
            break
        if extra_stopping and bool(stopping_criteria(input_ids, None).all()):
            break

    if streamer is not None:
        streamer.end()
    if not generation_config.return_dict_in_generate:
        return input_ids
    return DiversedGenerateOutput(sequences=input_ids, diversed_stats=stats)
