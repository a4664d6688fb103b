"""Measure a vLLM engine's step costs for the draft-length policy and write them as JSON (run in vLLM's environment).

The engine is the one to be served (target, draft, N, dtype), with the policy in calibration mode: K cycles through
0, 1, ..., N from step to step (the draft skipped at K = 0), at each concurrency in turn, and every step's work and
seconds go to a step log. The decoding steps (no prefill in them) are fitted by ``StepCosts.fit``; the file holds
the coefficients, the fit's median relative error and the engine's settings::

    python -m hf_diversed.integrations.vllm.calibrate --model TARGET --draft DRAFT --num-draft 5 \\
        --concurrency 1,2,4,8,16,32 --output step_costs.json

A request generates ``--max-tokens`` tokens (default 256): a step's seconds grow with the contexts it attends over,
so calibrate at the lengths the server generates. ``--from-step-logs`` refits from step logs already written (a
calibration's, or a served engine's ``step_log`` with ``force_k: "cycle"``) without starting an engine.

Serve with ``--additional-config '{"diversed_draft_policy": {"step_costs": "step_costs.json"}}'`` (docs/vllm.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from ._scheduling import POLICY_KEY, read_step_log
from .goodput import StepCosts

PROMPTS = [  # plain prompts: a decoding step's cost depends on how many tokens it runs, not on their text
    "Write a Python function that returns the n-th Fibonacci number, and explain how it works.",
    "A train leaves at 9:40 and arrives at 13:15. How long is the journey? Answer step by step.",
    "Summarise the causes of the French Revolution in a few paragraphs.",
    "Explain what a hash map is and when to use one instead of a sorted list.",
]


def decoding_steps(path: str | Path, num_draft: int):
    """The (work, seconds) pairs of a step log's decoding steps: each request runs its last token and at most N
    drafts (a step with a prompt in it is a prefill's, which the policy does not choose K for)."""
    lines = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    keep = [r["target_tokens"] <= r["batch"] * (num_draft + 1) for r in lines]
    return [pair for pair, kept in zip(read_step_log(path), keep, strict=True) if kept]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="the target (a Hub id or a folder)")
    parser.add_argument("--draft", help="the draft model (a Hub id or a folder)")
    parser.add_argument("--num-draft", type=int, default=5, help="N, the drafts a request at most")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens a request generates (as served)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--compile", action="store_true", help="let vLLM compile the models (default: eager)")
    parser.add_argument("--output", required=True, help="the JSON file to write")
    parser.add_argument("--step-log", default=None, help="keep the step log here (default: a temporary file)")
    parser.add_argument("--from-step-logs", default=None, type=lambda s: s.split(","),
                        help="fit these step logs (comma-separated) instead of running the engine")  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_step_logs:
        missing = [path for path in args.from_step_logs if not Path(path).is_file()]
        if missing:
            parser.error(f"no step log at {', '.join(missing)}: give the files a step_log setting wrote.")
        steps = [step for path in args.from_step_logs for step in decoding_steps(path, args.num_draft)]
        engine = {"step_logs": args.from_step_logs, "num_draft": args.num_draft, "cores": os.cpu_count()}
        return _write(steps, engine, args.output)
    if not args.model or not args.draft:
        parser.error("give --model TARGET and --draft DRAFT (the engine to calibrate), or --from-step-logs.")

    from vllm import LLM, SamplingParams

    log = Path(args.step_log) if args.step_log else Path(tempfile.mkdtemp()) / "steps.jsonl"
    llm = LLM(
        model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0, enforce_eager=not args.compile,
        max_num_seqs=max(args.concurrency), enable_prefix_caching=False,
        speculative_config={"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.num_draft,
                            "draft_sample_method": "probabilistic"},
        additional_config={POLICY_KEY: {"force_k": "cycle", "step_log": str(log)}},
    )  # fmt: skip
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True)
    for concurrency in args.concurrency:
        prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(concurrency)]
        llm.generate(prompts, params, use_tqdm=False)
        print(f"[calibrate] {concurrency} in flight: done", file=sys.stderr, flush=True)
    engine = {"model": args.model, "draft": args.draft, "num_draft": args.num_draft, "dtype": args.dtype,
              "compiled": args.compile, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
              "cores": os.cpu_count()}  # fmt: skip
    return _write(decoding_steps(log, args.num_draft), engine, args.output)


def _write(steps: list, engine: dict, output: str) -> int:
    """Fit the steps and write the coefficients, the fit's errors and where the steps came from."""
    if len(steps) < 4:
        print(f"[calibrate] {len(steps)} decoding steps: too few to fit; generate more tokens or add step logs.",
              file=sys.stderr)  # fmt: skip
        return 2
    costs = StepCosts.fit(steps)
    errors = [abs(costs.seconds(work) - seconds) / seconds for work, seconds in steps]
    record = {
        **vars(costs),
        "fit": {"steps": len(steps), "median_relative_error": statistics.median(errors),
                "mean_relative_error": statistics.fmean(errors)},
        "engine": engine,
    }  # fmt: skip
    Path(output).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
