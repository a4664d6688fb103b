"""What one token costs: the models' per-token costs (c, v), and the speed models built on them."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .config import COSTS_FILE


def analytic_speedup(alpha: float | None, gamma: int, c: float | None, v: float = 1.0) -> float | None:
    """Expected speedup of exact SD (Leviathan et al. 2023): (1 - α^(γ+1)) / ((1 - α)(γ·c + v)).

    α: per-token acceptance rate; γ: draft length N; c: draft / target cost of one token; v: cost of the
    target's verification forward over γ+1 tokens relative to one token (1 = memory-bound ideal).
    """
    if alpha is None or c is None or v is None or not (math.isfinite(alpha) and math.isfinite(c)):
        return None
    tokens = gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + v)


def tau_speedup(tau: float | None, gamma: int, c: float | None, v: float = 1.0) -> float | None:
    """Speedup from the measured tokens per round τ (accepted + bonus): τ / (γ·c + v).

    Unlike :func:`analytic_speedup` it needs no i.i.d. assumption: acceptance is bursty, so the i.i.d. form
    under-predicts τ."""
    if tau is None or c is None or v is None or not (math.isfinite(tau) and math.isfinite(c)):
        return None
    return tau / (gamma * c + v)


def synchronize() -> None:
    """Wait for queued accelerator work, so a wall-clock timer measures the compute, not the kernel launches."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


Clock = Callable[[], float]
"""A clock in seconds: :func:`time.perf_counter` where timing, a simulated one in the tests."""


def _fastest_time(fn, repeats: int, clock: Clock = time.perf_counter) -> float:
    """The fastest of ``repeats`` timed calls: another process on the machine only ever adds time, and a median of
    three took in disturbed calls (a probe with another process starting beside it read the target's marginal cost
    as an eighth of its decode step, c = 2.8)."""
    times = []
    for _ in range(repeats):
        synchronize()
        start = clock()
        fn()
        synchronize()
        times.append(clock() - start)
    return min(times)


def fastest_interleaved(fns: dict, repeats: int, clock: Clock = time.perf_counter) -> dict:
    """:func:`_fastest_time` of each of ``fns`` (name -> callable), timed in turn ``repeats`` times round-robin:
    a machine whose speed drifts over minutes (a shared host) slows every one of them alike, not the last ones."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], _fastest_time(fn, 1, clock))
    return best


def _seconds_per_token(model, input_ids, short: int, long: int, repeats: int, clock: Clock = time.perf_counter,
                       **generate_kwargs) -> float:  # fmt: skip
    """Marginal decode cost of a plain greedy ``generate`` of ``model`` alone (prefill cancels out); extra
    ``generate_kwargs`` (e.g. a static cache and a compile config) select how it decodes."""
    import torch

    def gen(n):
        with torch.no_grad():
            model.generate(
                input_ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, top_k=None, top_p=None,
                **generate_kwargs,
            )  # fmt: skip

    gen(2)  # warm-up
    t_short = _fastest_time(lambda: gen(short), repeats, clock)
    t_long = _fastest_time(lambda: gen(long), repeats, clock)
    marginal = (t_long - t_short) / (long - short)
    return marginal if marginal > 0 else t_long / long


def _verify_cost_ratio(model, input_ids, n: int, repeats: int, clock: Clock = time.perf_counter) -> float | None:
    """v: time of one target forward over n+1 new tokens / over 1 new token, both after a cached prefill, with
    attention as hf_diversed's loop runs it (grouped key/value heads in place on CPU)."""
    import torch

    from ...generation._compat import grouped_attention_on_cpu

    try:
        with torch.no_grad(), grouped_attention_on_cpu():
            out = model(input_ids, use_cache=True)
            cache, length = out.past_key_values, input_ids.shape[1]
            token = input_ids[:, -1:]

            def step(k):
                model(token.repeat(1, k), past_key_values=cache, use_cache=True)
                cache.crop(-(cache.get_seq_length() - length))  # transformers 5: crop(-n) drops n tokens

            step(1), step(n + 1)  # warm-up
            one = _fastest_time(lambda: step(1), repeats, clock)
            many = _fastest_time(lambda: step(n + 1), repeats, clock)
        return many / one if one > 0 else None
    except Exception:  # noqa: BLE001 - an optional measurement; a model without crop-able cache skips it
        return None


def measure_costs(target, draft, input_ids, ns: Iterable[int], *, repeats: int = 5, short: int = 4,
                  long: int = 16, clock: Clock = time.perf_counter) -> dict:  # fmt: skip
    """Per-token costs of target and draft alone (plain generate) and the verification ratio v per N."""
    t_target = _seconds_per_token(target, input_ids, short, long, repeats, clock)
    t_draft = _seconds_per_token(draft, input_ids, short, long, repeats, clock)
    return {
        "target_seconds_per_token": t_target,
        "draft_seconds_per_token": t_draft,
        "c": t_draft / t_target,
        "v": {str(n): _verify_cost_ratio(target, input_ids, n, repeats, clock) for n in ns},
        "prompt_tokens": int(input_ids.shape[1]),
        "method": (
            f"c: marginal seconds/token of greedy generate ({long} vs {short} new tokens, fastest of {repeats}) of "
            f"each model alone; v: target forward on N+1 vs 1 new token(s) after a cached prefill "
            f"(fastest of {repeats})"
        ),
    }


def measure_compiled_costs(target, draft, input_ids, n: int, compile_config, *, repeats: int = 5,
                           cache_len: int | None = None, clock: Clock = time.perf_counter) -> dict:  # fmt: skip
    """:func:`measure_costs` for the compiled static-cache path, from the forwards the static loop runs.

    ``target_alone_seconds_per_token``: transformers' static-cache compiled ``generate`` of the target alone (the
    baseline); ``draft_step_seconds``, ``target_step_seconds``, ``verify_seconds``: one compiled forward of the draft
    over 1 token and of the target over 1 and N + 1 tokens on a static cache of ``cache_len`` positions (default: just
    enough) after ``input_ids``, attending over the window the loop uses there; c and v from them.
    """
    import torch
    import torch._dynamo

    from ...generation._compat import (
        compile_on_every_device,
        grouped_attention_on_cpu,
        rewind_static_cache,
        set_static_window,
        windowed_static_cache,
    )
    from ...generation.static_loop import RECOMPILE_LIMIT, compiled_forward

    kwargs = {"cache_implementation": "static", "compile_config": compile_on_every_device(compile_config)}
    if cache_len is not None:
        kwargs["max_cache_len"] = cache_len
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):  # transformers' own compiled generate
        t_alone = _seconds_per_token(target, input_ids, 4, 16, repeats, clock, **kwargs)
    length = input_ids.shape[1]

    def forward_seconds(model, k: int) -> float:
        call = compiled_forward(model, compile_config)
        cache = windowed_static_cache(model.config, max(cache_len or 0, length + n + 2))
        set_static_window(cache, length + n + 1)
        tokens = input_ids[:, -1:].repeat(1, k).to(model.device)
        with torch.no_grad(), grouped_attention_on_cpu():
            model(input_ids.to(model.device), past_key_values=cache, use_cache=True)

            def step():
                call(input_ids=tokens, past_key_values=cache, use_cache=True)
                rewind_static_cache(cache, length)

            step()  # warm-up (compiles this shape)
            return _fastest_time(step, repeats, clock)

    t_draft, t_one, t_verify = forward_seconds(draft, 1), forward_seconds(target, 1), forward_seconds(target, n + 1)
    return {"target_alone_seconds_per_token": t_alone, "draft_step_seconds": t_draft, "target_step_seconds": t_one,
            "verify_seconds": t_verify, "c": t_draft / t_one, "v": {str(n): t_verify / t_one},
            "prompt_tokens": int(length)}  # fmt: skip


def round_seconds_at_full_acceptance(target, draft, input_ids, n: int, new_tokens: int, *, repeats: int = 3,
                                     clock: Clock = time.perf_counter, **generate_kwargs) -> float:  # fmt: skip
    """Marginal seconds per round of hf_diversed's loop when every draft is accepted (``static:0``, greedy): N draft
    steps, one verification and the loop's own work, nothing else; compare with its bare forwards
    N·t_draft + t_verify. The prefill and the first round cancel out: (T(new_tokens) − T(new_tokens / 2)) over the
    difference in rounds. (No ``min_new_tokens``: the static loop takes no processor that reads the length; an early
    EOS only means fewer rounds.)"""
    import torch

    def run(k: int) -> int:
        with torch.no_grad():
            out = target.generate(
                input_ids, assistant_model=draft, diversed_verifier="static:0", do_sample=False,
                max_new_tokens=k, num_assistant_tokens=n,
                num_assistant_tokens_schedule="constant", return_dict_in_generate=True, **generate_kwargs,
            )  # fmt: skip
        return out.diversed_stats.num_rounds

    short = max(1, new_tokens // 2)
    rounds_long, rounds_short = run(new_tokens), run(short)  # warm-up
    if rounds_long <= rounds_short:  # an EOS before the shorter call's end: no marginal round to time
        return _fastest_time(lambda: run(new_tokens), repeats, clock) / rounds_long
    long_s = _fastest_time(lambda: run(new_tokens), repeats, clock)
    short_s = _fastest_time(lambda: run(short), repeats, clock)
    return (long_s - short_s) / (rounds_long - rounds_short)


def costs_key(target: str, draft: str | None, dtype: str) -> str:
    """The key of a pair's costs in ``costs.json``: costs depend on the models, their dtype and the machine."""
    return f"{target} | {draft} | {dtype}"


def pair_costs(costs: dict, target: str, draft: str | None, dtype: str) -> tuple[str, dict] | None:
    """``(dtype, costs)`` of the pair in ``costs``: measured in ``dtype`` where there are such, else in any dtype."""
    if costs_key(target, draft, dtype) in costs:
        return dtype, costs[costs_key(target, draft, dtype)]
    pair = costs_key(target, draft, "")
    return next(((k[len(pair) :], v) for k, v in costs.items() if k.startswith(pair)), None)


def _read_costs(out_dir: Path) -> dict:
    try:
        return json.loads((out_dir / COSTS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
