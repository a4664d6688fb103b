"""The draft-length policy in vLLM's V1 scheduler and draft-model proposer: the only module that touches those
internals (tested with vLLM 0.32 on its CPU backend). Opt-in, per engine, in vLLM's ``additional_config``::

    --additional-config '{"diversed_draft_policy": {"step_costs": "step_costs.json"}}'

What ``install()`` patches, when an engine's ``additional_config`` names the policy:

- ``InputProcessor.__init__`` (the front end, before the engine starts) and ``Scheduler.__init__``: check the
  engine (draft-model speculation, no prefix caching while the draft may be skipped, no async scheduling, no hand
  schedule beside it); the scheduler then puts the policy where vLLM's dynamic speculation
  reads its batch-size schedule (``dynamic_sd_lookup[batch_size]``, vLLM's own hook for "K tokens at this batch
  size"), so vLLM's scheduler asks the policy for K at every step: K = argmax_K goodput of the batch's requests,
  each with its running acceptance (``goodput``), and 0 where the draft was skipped and catching it up on the tokens
  it missed costs more than drafting would save over the requests' remaining tokens (``worth_catching_up``), or
  than the plain steps since drafting began to pay have lost (``skipping_cost``: a dip of the batch for a step or
  two pays no catch-up).
- ``Scheduler.update_from_output``: each request's accepted drafted tokens and rejections (its acceptance estimate,
  pooled per rule as the prior of new requests), the tokens its draft has missed since it last drafted, and, with
  ``step_log``, the step's work and seconds (the data that calibrates the step costs).
- ``Scheduler.update_draft_token_ids``: each request keeps the drafted tokens whose expected gain is worth the
  target time they cost (``goodput.drafts_to_verify``); the rest are never verified, and the position after the
  last kept one is the target's own sample, so it follows p.
- ``SpecDecodeBaseProposer.propose``: at K = 0 the draft is skipped (vLLM would run its first pass anyway, to keep
  its cache in step); when it drafts again, it first runs a catch-up pass over the tokens it missed, so its cache
  holds every token of the request before it proposes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .goodput import (
    StepCosts,
    StepWork,
    acceptance_estimate,
    best_draft_length,
    drafts_to_verify,
    goodput,
    skipping_cost,
    worth_catching_up,
)
from .rules import RuleError, requested

logger = logging.getLogger(__name__)

POLICY_KEY = "diversed_draft_policy"
DEFAULT_PRIOR = 0.7  # acceptance assumed for a rule none of whose requests has been verified yet
CYCLE_HOLD = 4  # steps each K is held for by force_k "cycle"
_FIELDS = {"step_costs", "skip_draft", "prior", "prior_strength", "step_log", "force_k"}


@dataclass(frozen=True)
class Policy:
    """An engine's draft-length policy (``additional_config["diversed_draft_policy"]``).

    ``step_costs``: the fitted step costs (a JSON file or its dict); ``skip_draft``: skip the draft at K = 0;
    ``prior`` / ``prior_strength``: the Beta prior of a request's acceptance; ``step_log``: a JSON-lines file of
    each step's work and seconds; ``force_k``: a fixed K at every step, or ``"cycle"`` for K = 0, 1, ..., N, 0, ...,
    each held for ``CYCLE_HOLD`` steps (calibration runs, which need steps that differ in their draft work)."""

    costs: StepCosts
    skip_draft: bool = True
    prior: float = DEFAULT_PRIOR
    prior_strength: float = 8.0
    step_log: str | None = None
    force_k: int | str | None = None


def policy_of(vllm_config: Any) -> Policy | None:
    """The policy an engine's ``additional_config`` asks for (None without one); a bad entry raises
    :class:`RuleError` naming the fix."""
    extra = getattr(vllm_config, "additional_config", None)
    entry = extra.get(POLICY_KEY) if isinstance(extra, Mapping) else None
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise RuleError(f'additional_config["{POLICY_KEY}"] must be a dict such as {{"step_costs": "step_costs.json"}},'
                        f" got {entry!r}.")  # fmt: skip
    unknown = set(entry) - _FIELDS
    if unknown:
        raise RuleError(f'additional_config["{POLICY_KEY}"] has no setting {", ".join(sorted(unknown))}: use '
                        f"{', '.join(sorted(_FIELDS))}.")  # fmt: skip
    costs = entry.get("step_costs")
    force_k = entry.get("force_k")
    if costs is None and force_k is None:
        raise RuleError(
            f'additional_config["{POLICY_KEY}"] needs "step_costs" (a file written by python -m '
            "hf_diversed.integrations.vllm.calibrate, or its dict): calibrate this engine first."
        )
    try:
        if isinstance(costs, Mapping):
            costs = StepCosts.from_dict(dict(costs))
        elif costs is not None:
            costs = StepCosts.from_json(costs)
        else:
            costs = StepCosts(1.0, 0.0, 0.0, 0.0)  # unused: force_k decides every step
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise RuleError(f'additional_config["{POLICY_KEY}"]["step_costs"] cannot be read ({err}): give the file '
                        "that python -m hf_diversed.integrations.vllm.calibrate wrote, or a dict of c0, c_target, "
                        "c_pass, c_draft.") from None  # fmt: skip
    prior = float(entry.get("prior", DEFAULT_PRIOR))
    if not 0.0 <= prior <= 1.0:
        raise RuleError(f'additional_config["{POLICY_KEY}"]["prior"] is an acceptance in [0, 1], got {prior}.')
    return Policy(
        costs=costs,
        skip_draft=bool(entry.get("skip_draft", True)),
        prior=prior,
        prior_strength=float(entry.get("prior_strength", 8.0)),
        step_log=entry.get("step_log"),
        force_k=_force_k(force_k),
    )


def _force_k(value: Any) -> int | str | None:
    if value is None or value == "cycle":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RuleError(f'additional_config["{POLICY_KEY}"]["force_k"] is a number of drafts >= 0 or "cycle", got '
                        f"{value!r}.")  # fmt: skip
    return value


def check_engine(policy: Policy, vllm_config: Any) -> None:
    """Raise :class:`RuleError` if this engine cannot run the policy; the message names the fix."""
    spec = vllm_config.speculative_config
    where = f'additional_config["{POLICY_KEY}"]'
    if spec is None or spec.method != "draft_model":
        raise RuleError(f"{where} chooses how many tokens a draft model proposes: start the engine with "
                        'speculative_config={"method": "draft_model", ...}, or drop the policy.')  # fmt: skip
    if spec.num_speculative_tokens_per_batch_size:
        raise RuleError(f"{where} chooses K at every step and replaces num_speculative_tokens_per_batch_size: keep "
                        "one of the two.")  # fmt: skip
    if vllm_config.scheduler_config.async_scheduling:
        raise RuleError(f"{where} reads each step's accepted tokens before the next is scheduled: start the engine "
                        "with --no-async-scheduling (async_scheduling=False).")  # fmt: skip
    if vllm_config.use_v2_model_runner:
        raise RuleError(f"{where} runs on vLLM's V1 model runner: start the engine with VLLM_USE_V2_MODEL_RUNNER=0.")
    if policy.skip_draft and vllm_config.cache_config.enable_prefix_caching:
        raise RuleError(f"{where} skips the draft under load, and a cached prefix could then hand a new request "
                        'blocks without the draft\'s keys: add --no-enable-prefix-caching, or set "skip_draft": '
                        "false.")  # fmt: skip


# ------------------------------------------------------------------------------------------------ scheduler side


class _Acceptances:
    """Per request: drafted tokens accepted and blocks ended by a rejection; pooled per rule for the prior."""

    def __init__(self, policy: Policy, defaults: Mapping[str, Any]):
        self.policy = policy
        self.defaults = defaults
        self.requests: dict[str, tuple[str, int, int]] = {}  # req_id -> (rule key, accepted, rejections)
        self.rules: dict[str, list[int]] = {}  # rule key -> [accepted, rejections]

    def _rule_key(self, request: Any) -> str:
        params = getattr(request, "sampling_params", None)
        try:
            asked = requested(getattr(params, "extra_args", None), self.defaults)
        except RuleError:  # refused at the front end; never scheduled
            return "exact"
        return f"{asked.spec}|{asked.head}"

    def of(self, request: Any) -> float:
        key, accepted, rejections = self.requests.get(request.request_id) or (self._rule_key(request), 0, 0)
        pooled = self.rules.get(key)
        strength = self.policy.prior_strength
        prior = self.policy.prior if pooled is None else acceptance_estimate(*pooled, self.policy.prior, strength)
        return acceptance_estimate(accepted, rejections, prior, strength)

    def record(self, request: Any, accepted: int, rejected: bool) -> None:
        key, a, r = self.requests.get(request.request_id) or (self._rule_key(request), 0, 0)
        self.requests[request.request_id] = (key, a + accepted, r + int(rejected))
        pooled = self.rules.setdefault(key, [0, 0])
        pooled[0] += accepted
        pooled[1] += int(rejected)

    def forget(self, live: set[str]) -> None:
        for req_id in [r for r in self.requests if r not in live]:
            del self.requests[req_id]


class _Lookup:
    """Stands where vLLM reads its batch-size schedule: ``lookup[batch_size]`` is this step's K."""

    def __init__(self, scheduler: Any, policy: Policy, acceptances: _Acceptances, max_k: int):
        self.scheduler = scheduler
        self.policy = policy
        self.acceptances = acceptances
        self.max_k = max_k
        self.last: tuple[list[float], int] = ([], max_k)
        self.steps = 0
        self.missed: dict[str, int] = {}  # req_id -> tokens the target ran while the request's draft was skipped
        self.waited = 0.0  # seconds lost to plain steps since drafting again began to pay (goodput.skipping_cost)

    def __getitem__(self, batch_size: int) -> int:
        self.steps += 1
        if self.policy.force_k is not None:
            forced = self.policy.force_k
            if forced == "cycle":  # each K held for a few steps, so that most steps verify what they propose
                k = (self.steps - 1) // CYCLE_HOLD % (self.max_k + 1)
            else:
                k = min(forced, self.max_k)
            self.last = ([], k)
            return k
        # the running queue is scheduled in order (this step's new requests appended): its first batch_size
        running = [r for r in self.scheduler.running if not r.is_finished()][:batch_size]
        rates = [self.acceptances.of(r) for r in running] or [self.policy.prior] * batch_size
        costs = self.policy.costs
        k = best_draft_length(rates, costs, self.max_k, draft_runs_at_zero=not self.policy.skip_draft)
        missed = sum(self.missed.get(r.request_id, 0) for r in running) if k and self.policy.skip_draft else 0
        if missed:
            remaining = sum(max(r.max_tokens - r.num_output_tokens, 0) for r in running)
            # ski rental: catch up once staying plain has lost what the catch-up costs, and only if it repays
            if self.waited < costs.draft_pass(missed) or not worth_catching_up(rates, k, costs, remaining, missed):
                self.waited += skipping_cost(rates, k, costs)
                self.last = (rates, 0)
                return 0
        self.waited = 0.0  # drafting, or nothing to draft for: a later catch-up waits afresh
        self.last = (rates, k)
        return k

    def record_step(self, scheduler_output: Any, live: Any) -> int:
        """Note the tokens each scheduled request's draft missed (all of this step's, where the step skipped the
        draft; none after a step that drafted, which caught it up); returns the step's catch-up tokens."""
        skipped = scheduler_output.num_spec_tokens_to_schedule == 0 and self.policy.skip_draft
        catch_up = 0
        for req_id, tokens in scheduler_output.num_scheduled_tokens.items():
            missed = self.missed.get(req_id, 0)
            self.missed[req_id] = missed + tokens if skipped else 0
            catch_up += 0 if skipped else missed
        for req_id in [r for r in self.missed if r not in live]:
            del self.missed[req_id]
        return catch_up


def _patch_front_end() -> None:
    from vllm.v1.engine import input_processor

    original = input_processor.InputProcessor.__init__

    @functools.wraps(original)
    def __init__(self, vllm_config, *args, **kwargs):
        policy = policy_of(vllm_config)
        if policy is not None:
            check_engine(policy, vllm_config)
        original(self, vllm_config, *args, **kwargs)

    input_processor.InputProcessor.__init__ = __init__


def _patch_scheduler() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    original_init = Scheduler.__init__

    @functools.wraps(original_init)
    def __init__(self, vllm_config, *args, **kwargs):
        original_init(self, vllm_config, *args, **kwargs)
        policy = policy_of(vllm_config)
        self._hf_diversed_policy = None
        if policy is None:
            return
        check_engine(policy, vllm_config)
        extra = vllm_config.additional_config
        defaults = {key: extra.get(key) for key in ("diversed_verifier", "diversed_head")}
        acceptances = _Acceptances(policy, defaults)
        self.dynamic_sd_lookup = _Lookup(self, policy, acceptances, self.num_spec_tokens)
        self._hf_diversed_policy = (policy, acceptances)
        self._hf_diversed_step_start = None

    original_schedule = Scheduler.schedule

    @functools.wraps(original_schedule)
    def schedule(self, *args, **kwargs):
        if getattr(self, "_hf_diversed_policy", None) is not None:
            self._hf_diversed_step_start = time.perf_counter()
        return original_schedule(self, *args, **kwargs)

    original_update = Scheduler.update_from_output

    @functools.wraps(original_update)
    def update_from_output(self, scheduler_output, model_runner_output):
        held = getattr(self, "_hf_diversed_policy", None)
        if held is not None:
            _record_acceptances(self, held[1], scheduler_output, model_runner_output)
        out = original_update(self, scheduler_output, model_runner_output)
        if held is not None:
            catch_up = self.dynamic_sd_lookup.record_step(scheduler_output, self.requests)
            if held[0].step_log and self._hf_diversed_step_start is not None:
                seconds = time.perf_counter() - self._hf_diversed_step_start
                _log_step(held[0], scheduler_output, catch_up, seconds)
        return out

    original_drafts = Scheduler.update_draft_token_ids

    @functools.wraps(original_drafts)
    def update_draft_token_ids(self, draft_token_ids):
        original_drafts(self, draft_token_ids)
        held = getattr(self, "_hf_diversed_policy", None)
        if held is None or held[0].force_k is not None:
            return
        policy, acceptances = held
        rates, k = self.dynamic_sd_lookup.last
        if k == 0 or not rates:
            return
        step_goodput = goodput(rates, k, policy.costs)
        for req_id in draft_token_ids.req_ids:
            request = self.requests.get(req_id)
            if request is None or not request.spec_token_ids:
                continue
            keep = drafts_to_verify(acceptances.of(request), len(request.spec_token_ids), policy.costs, step_goodput)
            del request.spec_token_ids[keep:]

    Scheduler.__init__ = __init__
    Scheduler.schedule = schedule
    Scheduler.update_from_output = update_from_output
    Scheduler.update_draft_token_ids = update_draft_token_ids


def _record_acceptances(scheduler: Any, acceptances: _Acceptances, scheduler_output: Any, output: Any) -> None:
    sampled = output.sampled_token_ids
    for req_id, drafted in scheduler_output.scheduled_spec_decode_tokens.items():
        request = scheduler.requests.get(req_id)
        index = output.req_id_to_index.get(req_id)
        if request is None or index is None or not sampled or not drafted:
            continue
        accepted = max(len(sampled[index]) - 1, 0)
        acceptances.record(request, accepted, rejected=accepted < len(drafted))
    acceptances.forget(set(scheduler.requests))


def _log_step(policy: Policy, scheduler_output: Any, catch_up: int, seconds: float) -> None:
    """Append the step's work and seconds: the target's tokens and the tokens of each draft pass (a catch-up pass
    over the tokens the batch's drafts missed in the skipped steps before it, then vLLM's first pass and the K - 1
    others)."""
    batch = len(scheduler_output.num_scheduled_tokens)
    if batch == 0:
        return
    k = scheduler_output.num_spec_tokens_to_schedule
    target = scheduler_output.total_num_scheduled_tokens
    if k == 0 and policy.skip_draft:
        passes: tuple[int, ...] = ()
    else:
        passes = ((catch_up,) if catch_up else ()) + (target + batch,) + (batch,) * (max(k, 1) - 1)
    record = {"batch": batch, "k": k, "target_tokens": target, "draft_passes": list(passes), "seconds": seconds}
    with open(policy.step_log, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_step_log(path: str | Path) -> list[tuple[StepWork, float]]:
    """The (work, seconds) pairs of a step log, for :meth:`StepCosts.fit`."""
    pairs = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            pairs.append((StepWork(r["target_tokens"], tuple(r["draft_passes"]), r.get("batch")), r["seconds"]))
    return pairs


# ------------------------------------------------------------------------------------------------- worker side


def _catch_up_spans(proposer: Any, cad: Any) -> list[tuple[int, int, int]]:
    """(batch row, first position, end) of the tokens each request's draft has not run, before this step's tokens;
    updates the proposer's record of what its draft has run (positions below ``synced[req_id]``)."""
    req_ids = proposer._hf_diversed_runner.input_batch.req_ids
    seq_lens = cad.seq_lens.cpu().tolist()
    starts = cad.query_start_loc_cpu.tolist()
    synced = proposer._hf_diversed_synced
    spans = []
    for row, req_id in enumerate(req_ids[: cad.num_reqs]):
        computed = seq_lens[row] - (starts[row + 1] - starts[row])  # tokens before this step's query
        first = min(synced.get(req_id, 0), computed)  # 0 for a new request; a preempted one restarts at 0
        synced[req_id] = first
        if first < computed:
            spans.append((row, first, computed))
    if len(synced) > 4 * max(len(req_ids), 64):
        live = set(req_ids)
        for req_id in [r for r in synced if r not in live]:
            del synced[req_id]
    return spans


def _catch_up(proposer: Any, cad: Any, spans: list[tuple[int, int, int]]) -> None:
    """Run the draft over the tokens it missed (a prefill of those spans, in chunks that fit its buffers), writing
    its keys and values where the target's block table puts them."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import set_forward_context

    capacity = proposer.input_ids.shape[0]
    token_ids = proposer._hf_diversed_runner.input_batch.token_ids_cpu
    block_size = proposer.block_size
    pieces = []  # split long spans so that each forward fits the buffers
    for row, first, end in spans:
        for lo in range(first, end, capacity):
            pieces.append((row, lo, min(end, lo + capacity)))
    while pieces:
        chunk, total = [], 0
        while pieces and total + (pieces[0][2] - pieces[0][1]) <= capacity:
            row, lo, hi = pieces.pop(0)
            chunk.append((row, lo, hi))
            total += hi - lo
        device = cad.seq_lens.device
        rows = torch.tensor([row for row, _, _ in chunk], device=device)
        lengths = torch.tensor([hi - lo for _, lo, hi in chunk], dtype=torch.int32)
        ends = torch.tensor([hi for _, _, hi in chunk], dtype=torch.int32)
        positions = torch.cat([torch.arange(lo, hi) for _, lo, hi in chunk]).to(device)
        ids = torch.cat([torch.from_numpy(token_ids[row, lo:hi].copy()) for row, lo, hi in chunk]).to(device)
        table = cad.block_table_tensor[rows]
        token_row = torch.repeat_interleave(torch.arange(len(chunk), device=device), lengths.to(device))
        slots = table[token_row, positions // block_size].long() * block_size + positions % block_size
        query_start = torch.zeros(len(chunk) + 1, dtype=torch.int32)
        query_start[1:] = lengths.cumsum(0)
        sub = dataclasses.replace(
            cad,
            query_start_loc=query_start.to(device),
            query_start_loc_cpu=query_start,
            seq_lens=ends.to(device),
            num_reqs=len(chunk),
            num_actual_tokens=total,
            max_query_len=int(lengths.max()),
            max_seq_len=int(ends.max()),
            block_table_tensor=table,
            slot_mapping=slots,
            logits_indices_padded=None,
            num_logits_indices=None,
            max_logits_per_req=None,
            positions=None,
            is_prefilling=None,
            seq_lens_cpu_upper_bound=ends,
            req_idx=None if cad.req_idx is None else cad.req_idx[[row for row, _, _ in chunk]],
            dcp_local_seq_lens=None,
            dcp_local_seq_lens_cpu_upper_bound=None,
        )
        _, per_layer = proposer.build_per_group_and_layer_attn_metadata(sub)
        proposer.input_ids[:total] = ids.to(proposer.input_ids.dtype)
        proposer._set_positions(total, positions.to(proposer.positions.dtype))
        model_kwargs, _ = proposer.build_model_inputs_first_pass(total, total, None)
        with set_forward_context(
            per_layer, proposer.vllm_config, num_tokens=total, cudagraph_runtime_mode=CUDAGraphMode.NONE,
            slot_mapping=proposer._get_slot_mapping(total, slots),
        ):  # fmt: skip
            proposer.model(**model_kwargs)


def _patch_proposer() -> None:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original_runner_propose = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(original_runner_propose)
    def propose_draft_token_ids(self, *args, **kwargs):
        self.drafter._hf_diversed_runner = self  # the batch's request ids and token ids, for the catch-up
        return original_runner_propose(self, *args, **kwargs)

    original_propose = SpecDecodeBaseProposer.propose

    @functools.wraps(original_propose)
    def propose(self, num_speculative_tokens, *args, **kwargs):
        policy = getattr(self, "_hf_diversed_policy", False)
        if policy is False:  # read once per proposer
            policy = policy_of(self.vllm_config) if self.method == "draft_model" else None
            self._hf_diversed_policy = policy
            self._hf_diversed_synced = {}
        if policy is None or not policy.skip_draft:
            return original_propose(self, num_speculative_tokens, *args, **kwargs)
        cad = kwargs["common_attn_metadata"]
        spans = _catch_up_spans(self, cad)
        if num_speculative_tokens == 0:  # the draft is skipped: what it did not run is caught up when it drafts
            self._last_draft_probs = None
            self._hf_diversed_last_hidden = None  # no head inputs filed for a step that drafted nothing
            return torch.empty(cad.num_reqs, 0, dtype=torch.int64, device=cad.seq_lens.device)
        if spans:
            _catch_up(self, cad, spans)
        out = original_propose(self, num_speculative_tokens, *args, **kwargs)
        for req_id in self._hf_diversed_runner.input_batch.req_ids[: cad.num_reqs]:
            self._hf_diversed_synced[req_id] = math.inf  # its first pass ran every token the target has
        return out

    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
    SpecDecodeBaseProposer.propose = propose


_installed = False


def install() -> None:
    """Patch this process's scheduler and proposer once; both act only on engines whose config names the policy."""
    global _installed
    if _installed:
        return
    _installed = True
    _patch_front_end()
    _patch_scheduler()
    _patch_proposer()
