"""The rules and heads on vLLM's Model Runner V2 (``vllm/v1/worker/gpu/``), the runner vLLM 0.32 uses on a GPU.

MRV2 verifies in Triton kernels (``spec_decode/rejection_sampler_utils.rejection_sample``): they take the target's
processed logits ``[num_logits, V]`` (temperature applied), the draft's cached logits ``[max_num_reqs, N, V]``
(before temperature: the kernels divide them by each request's temperature), normalise both over
min(V_target, V_draft) and verify exactly: accept x ~ q with min(1, p/q), resample from norm(max(0, p - q)), the
last row of each request (the bonus token) from p. For a mixture rule t = nu is a law, so handing the kernels log t
as the target's logits at a relaxed request's drafted rows runs that rule with vLLM's own kernels and seeds
(``rules.exact_targets_by_row``, the single source of t); nothing else changes. What ``install()`` patches:

- ``GPUModelRunner.add_requests`` (MRV2's) notes each new request's rule (and head) by its request-state index, on
  the runner's rejection sampler (exact requests are not noted);
- ``RejectionSampler._verify`` makes the rules of the chunk of requests it verifies visible to
- ``rejection_sample`` as MRV2's rejection sampler calls it, which swaps the target's logits at the drafted rows of
  relaxed requests for log t. A chunk of exact requests runs vLLM's path untouched.
- Once a request with a DIVERSED head arrives: ``GPUModelRunner.sample`` keeps the target's hidden states at each row
  it samples, and ``DraftModelSpeculator.sample_draft`` the draft's at each token it drafts (the inputs of their LM
  heads), by request-state index and row, the way MRV2 itself caches the draft's logits for verification; the head's
  w at a drafted row reads the pair kept for that row.

How many tokens each request drafted is read from ``cu_num_logits`` on the device, so vLLM's dynamic speculation
(``num_speculative_tokens_per_batch_size``) composes. What the front end refuses here, with the fix
(:func:`refusal`): lossy SD, heads with another speculative method or batch-sharded sampling, block and adaptive
verification.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...generation.verification import ExactSD, LossySD, VerificationRule
from . import heads
from .rules import exact_targets_by_row, is_exact

logger = logging.getLogger(__name__)

RULES_ATTR = "_hf_diversed_rules"  # on MRV2's RejectionSampler: request-state index -> its (relaxed) Row
INPUTS_ATTR = "_hf_diversed_head_inputs"  # on the runner, its speculator and its rejection sampler: HeadInputs
V1_RUNNER = "start the engine with VLLM_USE_V2_MODEL_RUNNER=0 (vLLM's V1 runner, where the plugin runs it)"


@dataclass(frozen=True)
class Row:
    """A request's rule, and its DIVERSED head (on the runner's device) if it has one."""

    rule: VerificationRule
    head: Any = None


@dataclass
class HeadInputs:
    """What a head reads, by request-state index (one spare row for vLLM's padding index -1): the target's hidden
    state at each row it samples, ``target[state, j]`` (j = 0 ... N), and the draft's at each token it drafted,
    ``draft[state, j]`` (j = 0 ... N - 1), as MRV2 caches the draft's logits ``[state, j]`` for verification."""

    max_num_reqs: int
    num_steps: int
    target: torch.Tensor | None = None
    draft: torch.Tensor | None = None

    def keep(self, which: str, hidden: torch.Tensor, states: torch.Tensor, cols: torch.Tensor) -> None:
        cols_total = self.num_steps + 1 if which == "target" else self.num_steps
        buffer = getattr(self, which)
        if buffer is None or buffer.shape[-1] != hidden.shape[-1] or buffer.device != hidden.device:
            shape = (self.max_num_reqs + 1, cols_total, hidden.shape[-1])
            buffer = torch.zeros(shape, dtype=torch.float32, device=hidden.device)
            setattr(self, which, buffer)
        states = states.long()
        states = torch.where(states >= 0, states, self.max_num_reqs)
        buffer[states, cols.long().clamp(max=cols_total - 1)] = hidden.float()


@dataclass(frozen=True)
class Chunk:
    """The relaxed requests of the chunk being verified: their distinct rows (rule and head), and each one's
    request-state index with the index of its row in ``rows``; with heads, what they read."""

    rows: list[Row]
    states: list[int]
    rule_ids: list[int]
    inputs: HeadInputs | None = None


_chunk: contextvars.ContextVar[Chunk | None] = contextvars.ContextVar("hf_diversed_mrv2_chunk", default=None)


def refusal(spec: str, rule: VerificationRule | None, head: str | None, vllm_config: Any) -> str | None:
    """Why a relaxed request cannot run on Model Runner V2 (a one-line reason with the fix), or None."""
    speculative_config = vllm_config.speculative_config
    if head is not None and speculative_config.method != "draft_model":
        return (
            "a DIVERSED head reads a draft model's hidden states, and this engine speculates with "
            f'{speculative_config.method!r}: use the method "draft_model", or a rule without a head.'
        )
    if head is not None and getattr(vllm_config.parallel_config, "enable_batch_sharded_sampling", False):
        return (
            "a DIVERSED head on Model Runner V2 has not been tested with batch-sharded sampling: start the engine "
            "without enable_batch_sharded_sampling."
        )
    if isinstance(rule, LossySD):
        return (
            f"{spec!r} verifies against t = p / l, which is not a law, and Model Runner V2's kernels normalise the "
            f"draft's law themselves: {V1_RUNNER}, or use a mixture rule (static, cascade, token-class)."
        )
    if getattr(speculative_config, "enable_adaptive_verification", False):
        return (
            f"{spec!r} has not been tested with vLLM's adaptive verification: drop "
            '"enable_adaptive_verification" from speculative_config.'
        )
    if getattr(speculative_config, "rejection_sample_method", "standard") != "standard":
        return (
            f"{spec!r} is tested with vLLM's standard rejection sampling: drop "
            f'"rejection_sample_method": "{speculative_config.rejection_sample_method}" from speculative_config.'
        )
    return None


def note_request(rejection_sampler: Any, req_index: int, row: Row) -> None:
    """Remember the rule (and head) of the request at request-state index ``req_index`` (an index vLLM reuses:
    overwritten)."""
    table = rejection_sampler.__dict__.setdefault(RULES_ATTR, {})
    if is_exact(row.rule):
        table.pop(req_index, None)
    else:
        table[req_index] = row


def chunk_of(rejection_sampler: Any, idx_mapping_np: Sequence[int]) -> Chunk | None:
    """The relaxed requests among the request-state indices ``idx_mapping_np`` (None if all verify exactly)."""
    table: dict[int, Row] = getattr(rejection_sampler, RULES_ATTR, None) or {}
    rows: list[Row] = []
    states, rule_ids = [], []
    for state in map(int, idx_mapping_np):
        row = table.get(state)
        if row is None:
            continue
        # resolve_rule and head_on cache per spec and head: equal rows are the same objects
        found = next((k for k, known in enumerate(rows) if known.rule is row.rule and known.head is row.head), None)
        if found is None:
            rows.append(row)
            found = len(rows) - 1
        states.append(state)
        rule_ids.append(found)
    if not rows:
        return None
    return Chunk(rows, states, rule_ids, getattr(rejection_sampler, INPUTS_ATTR, None))


def relaxed_target_logits(
    chunk: Chunk,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    cu_num_logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
) -> torch.Tensor:
    """The target logits to hand MRV2's kernels: log t at the drafted rows of the chunk's relaxed requests, the
    processed logits elsewhere (bonus rows, exact requests). Arguments in ``rejection_sample``'s layout."""
    num_logits, target_vocab = target_logits.shape
    vocab = min(target_vocab, draft_logits.shape[-1])  # what the kernels verify over
    device = target_logits.device
    rule_of_state = torch.full((temperature.shape[0],), -1, dtype=torch.int64)
    rule_of_state[chunk.states] = torch.tensor(chunk.rule_ids, dtype=torch.int64)
    states = expanded_idx_mapping.long()
    drafted = torch.ones(num_logits, dtype=torch.bool, device=device)
    drafted[cu_num_logits[1:].long() - 1] = False  # each request's last row is its bonus token
    rule_of_row = torch.where(drafted, rule_of_state.to(device, non_blocking=True)[states], -1)
    temp = temperature.float()[states]
    temp = torch.where(temp > 0, temp, torch.ones_like(temp))  # greedy rows verify by argmax: their t is unused
    step = expanded_local_pos.long().clamp(max=draft_logits.shape[1] - 1)
    p = target_logits[:, :vocab].float().softmax(-1)
    q = (draft_logits[states, step, :vocab].float() / temp.unsqueeze(-1)).softmax(-1)
    rules = [row.rule for row in chunk.rows]
    t = exact_targets_by_row(rules, rule_of_row, p, q, _head_weights(chunk, rules, rule_of_row, states, step, p, q))
    # a new tensor: vLLM keeps its processed logits (logprobs read them)
    out = torch.where((rule_of_row >= 0).unsqueeze(-1), t.log(), target_logits[:, :vocab].float())
    return out if vocab == target_vocab else torch.cat([out, target_logits[:, vocab:].float()], dim=-1)


def _head_weights(chunk: Chunk, rules: list[VerificationRule], rule_of_row, states, step, p, q):
    """Per row of ``chunk.rows``, its head's w at every row (None without a head); a head whose hidden states were
    not kept (none drafted since it arrived) verifies its rows exactly."""
    if all(row.head is None for row in chunk.rows):
        return None
    inputs = chunk.inputs
    if inputs is None or inputs.target is None or inputs.draft is None:
        logger.warning("hf_diversed: no hidden states kept for this step's DIVERSED rows; they verify exactly.")
        for k, row in enumerate(chunk.rows):
            if row.head is not None:
                rules[k] = ExactSD()
        return None
    slot = torch.where(states >= 0, states, inputs.max_num_reqs)
    h_target, h_draft = inputs.target[slot, step], inputs.draft[slot, step]  # drafted row j: target row j, draft j
    rows = p.shape[0]
    return [
        None if row.head is None else heads.head_weights([row.head], [rows], p, q, h_target, h_draft)[0]
        for row in chunk.rows
    ]


def relaxed_rejection_sample(original: Callable[..., Any]) -> Callable[..., Any]:
    """``rejection_sample`` that hands the kernels log t for the relaxed rows of the chunk in :data:`_chunk`."""

    @functools.wraps(original)
    def rejection_sample(
        target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
        expanded_local_pos, temperature, *args, **kwargs,
    ):  # fmt: skip
        chunk = _chunk.get()
        if chunk is not None:
            if draft_logits is None:  # the front end asks for probabilistic drafts; a greedy draft has no q
                logger.warning("hf_diversed: no draft logits this step; its rows verify exactly.")
            else:
                target_logits = relaxed_target_logits(
                    chunk, target_logits, draft_logits, cu_num_logits, expanded_idx_mapping, expanded_local_pos,
                    temperature,
                )  # fmt: skip
        return original(
            target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
            expanded_local_pos, temperature, *args, **kwargs,
        )  # fmt: skip

    return rejection_sample


def verifying(chunk: Chunk | None) -> contextvars.Token:
    """Make ``chunk`` the one :func:`relaxed_rejection_sample` verifies (``_chunk.reset(token)`` ends it)."""
    return _chunk.set(chunk)


def _patch_verification() -> None:
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler

    original_verify = rejection_sampler.RejectionSampler._verify

    @functools.wraps(original_verify)
    def _verify(self, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
                *args, **kwargs):  # fmt: skip
        token = verifying(chunk_of(self, idx_mapping_np))
        try:
            return original_verify(
                self, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
                *args, **kwargs,
            )  # fmt: skip
        finally:
            _chunk.reset(token)

    rejection_sampler.RejectionSampler._verify = _verify
    rejection_sampler.rejection_sample = relaxed_rejection_sample(rejection_sampler.rejection_sample)


def _keep_head_inputs(runner: Any) -> None:
    """From now on, keep the hidden states heads read (shared by the runner, its speculator and rejection sampler)."""
    if getattr(runner, INPUTS_ATTR, None) is None:
        inputs = HeadInputs(runner.max_num_reqs, runner.num_speculative_steps)
        for owner in (runner, runner.speculator, runner.rejection_sampler):
            setattr(owner, INPUTS_ATTR, inputs)


def _patch_runner(row_of: Callable[[Any, Any], Row]) -> None:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    original_add = GPUModelRunner.add_requests

    @functools.wraps(original_add)
    def add_requests(self, scheduler_output):
        out = original_add(self, scheduler_output)
        if self.rejection_sampler is not None:
            for new in scheduler_output.scheduled_new_reqs:
                if new.sampling_params is not None:
                    row = row_of(self, new.sampling_params)
                    if row.head is not None:
                        _keep_head_inputs(self)
                    note_request(self.rejection_sampler, self.req_states.req_id_to_index[new.req_id], row)
        return out

    original_sample = GPUModelRunner.sample

    @functools.wraps(original_sample)
    def sample(self, hidden_states, input_batch, grammar_output):
        inputs = getattr(self, INPUTS_ATTR, None)
        if inputs is not None and input_batch.num_draft_tokens > 0:
            inputs.keep(
                "target", hidden_states[input_batch.logits_indices], input_batch.expanded_idx_mapping,
                input_batch.expanded_local_pos,
            )  # fmt: skip
        return original_sample(self, hidden_states, input_batch, grammar_output)

    GPUModelRunner.add_requests = add_requests
    GPUModelRunner.sample = sample


def _patch_speculator() -> None:
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    original = DraftModelSpeculator.sample_draft

    @functools.wraps(original)
    def sample_draft(self, hidden_states, sample_src_positions, idx_mapping, temperature, seeds, draft_step,
                     draft_logits, *args, **kwargs):  # fmt: skip
        inputs = getattr(self, INPUTS_ATTR, None)
        if inputs is not None and draft_logits is not None:
            n = hidden_states.shape[0]
            inputs.keep("draft", hidden_states, idx_mapping[:n], draft_step.expand(n))
        return original(
            self, hidden_states, sample_src_positions, idx_mapping, temperature, seeds, draft_step, draft_logits,
            *args, **kwargs,
        )  # fmt: skip

    DraftModelSpeculator.sample_draft = sample_draft


def install(row_of: Callable[[Any, Any], Row]) -> None:
    """Patch MRV2 (see the module docstring); ``row_of(runner, sampling_params)`` is a request's rule and head."""
    _patch_verification()
    _patch_runner(row_of)
    _patch_speculator()
