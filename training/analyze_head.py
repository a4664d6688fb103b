"""Is a head's w informative? Diagnostics of one or more heads on cached rollouts (no generation).

    python training/analyze_head.py --rollouts_cache lr-sweep-gsm8k/rollouts.pt --rule token-class:digits:0 \
        --heads outputs/diversed-head-gsm8k,outputs/rule-head-gsm8k --output analysis.json

For each head: mean and spread of w over the cached drafted positions, corr(w, TV), mean w where the two models
agree on the next token and where not, the expected acceptance mean(1 - w TV) beside a static head's with the same
mean w, and with a token-class or cascade rule the AUC of w for the rule's exact positions
(:func:`hf_diversed.trainer.analysis.head_diagnostics`). Prints a Markdown table; ``--output`` also writes JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trl import TrlParser

from hf_diversed.trainer.analysis import head_diagnostics

COLUMNS = ("mean_w", "std_w", "corr_w_tv", "mean_w_where_agree", "mean_w_where_disagree", "expected_acceptance",
           "expected_acceptance_static_same_mean_w", "auc_w_for_rule", "mean_w_where_rule_exact",
           "mean_w_elsewhere")  # fmt: skip


@dataclass
class AnalysisArguments:
    rollouts_cache: str = field(metadata={"help": "A torch file of rollouts (training/lr_sweep.py's cache)."})
    heads: str = field(metadata={"help": "Comma list of heads (Hub ids or directories)."})
    rule: str | None = field(default=None, metadata={"help": "A token-class or cascade rule to compare w with."})
    target: str = field(default="qwen2.5-coder-1.5b-instruct", metadata={"help": "Target (tokenizer of the rule)."})
    output: str | None = field(default=None, metadata={"help": "Also write the diagnostics as JSON here."})


def markdown(results: dict[str, dict]) -> str:
    present = [c for c in COLUMNS if any(r.get(c) is not None for r in results.values())]
    lines = ["| head | " + " | ".join(present) + " |", "|---|" + "---|" * len(present)]
    for name, r in results.items():
        cells = ["-" if r.get(c) is None else f"{r[c]:.3f}" for c in present]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from hf_diversed.modeling.hub import load_head
    from hf_diversed.trainer.rollout import load_rollouts

    (args,) = TrlParser((AnalysisArguments,)).parse_args_and_config(list(sys.argv[1:] if argv is None else argv))
    rule = None
    if args.rule:
        from transformers import AutoTokenizer

        from hf_diversed.evaluation.weights import resolve_model
        from hf_diversed.generation.verification import parse_rule

        rule = parse_rule(args.rule, tokenizer=AutoTokenizer.from_pretrained(resolve_model(args.target)))
    rollouts = load_rollouts(args.rollouts_cache)
    results = {name: head_diagnostics(load_head(name), rollouts, rule) for name in args.heads.split(",") if name}
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
