"""Several heads' training runs on one figure (reward, acceptance, mean w against rollout batches), for comparing a
run with the one it repeats:

    python training/overlay_curves.py docs/training/gsm8k-full/opt0.1-lambda-0.01 \\
        docs/training/gsm8k-full/trainer-opt0.1-lambda-0.01 --labels "shipped head,retrained" \\
        --output docs/training/gsm8k-full/trainer-opt0.1-lambda-0.01/overlay.png

A run logged per update (several updates per rollout batch) is drawn per batch, its evaluations at the batch they
follow (hf_diversed.trainer.curves.by_rollout_batch).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_diversed.trainer.curves import plot_runs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="training output directories (holding log_history.jsonl)")
    parser.add_argument("--labels", help="comma-separated, one per run (default: the directories' names)")
    parser.add_argument("--output", type=Path, required=True, help="the figure's path (.png)")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [run.name for run in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--labels names {len(labels)} runs but {len(args.runs)} were given: give one label per run.")
    for run in args.runs:
        if not (run / "log_history.jsonl").is_file():
            parser.error(f"{run / 'log_history.jsonl'} does not exist: pass training output directories.")
    print(plot_runs({label: run / "log_history.jsonl" for label, run in zip(labels, args.runs, strict=True)},
                    args.output))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
