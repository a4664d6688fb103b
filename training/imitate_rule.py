"""Fit a head to a hand-made rule (a token-class rule or a speculative cascade), as a starting point for RL.

    python training/imitate_rule.py --rollouts_cache lr-sweep-gsm8k/rollouts.pt --rule token-class:digits:0 \
        --output_dir outputs/rule-head-gsm8k
    python training/imitate_rule.py --rollouts_cache lr-sweep-gsm8k/rollouts.pt --rule cascade-opt:0.1 \
        --use_distribution_features --output_dir outputs/opt-head-gsm8k
    python training/train.py --config training/recipes/gsm8k.yaml --init_head outputs/rule-head-gsm8k

The rollouts (``training/lr_sweep.py`` caches them) carry, per drafted position, both models' hidden states, most
likely tokens and their probabilities, and TV(p, q); the rule gives w there (a token-class rule: 1 where either
token is in the class, its w elsewhere; a cascade: its deferral delta from max p, max q and TV) and
:func:`hf_diversed.trainer.imitation.fit_head_to_weights` fits a fresh head to it, holding out a share of the
rollouts to say how well the fit carries to new sequences. A cascade's delta is a function of max p, max q and
TV alone, so a head with ``--use_distribution_features`` can represent it (linear or MLP, exactly and with no fit:
``DiversedHead.from_cascade``, or ``train.py --init_head cascade-opt:0.1``). Writes the head (``save_pretrained``)
and ``imitation.json`` with the fit's metrics.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from trl import TrlParser

from hf_diversed.generation.verification import SpecCascade, TokenClassEnsemble, parse_rule
from hf_diversed.modeling.modeling_diversed_head import DiversedHead
from hf_diversed.trainer.imitation import fit_head_to_weights
from hf_diversed.trainer.rollout import load_rollouts, rollouts_trace, rule_weights


@dataclass
class ImitationArguments:
    rollouts_cache: str = field(metadata={"help": "A torch file of rollouts (training/lr_sweep.py's cache)."})
    output_dir: str = field(metadata={"help": "Where the fitted head goes."})
    rule: str = field(
        default="token-class:digits:0",
        metadata={"help": "The rule to imitate: token-class:NAME:W or cascade-{chow,diff,opt}:ALPHA."},
    )
    use_distribution_features: bool = field(
        default=False,
        metadata={"help": "The fitted head also reads max p, max q and TV(p, q) (what a cascade's rule reads)."},
    )
    target: str = field(default="qwen2.5-coder-1.5b-instruct", metadata={"help": "Target (for the tokenizer)."})
    draft: str = field(default="qwen2.5-coder-0.5b-instruct", metadata={"help": "Draft the head is built for."})
    init_weight: float = field(default=0.5, metadata={"help": "w0 of the head's activation."})
    holdout: float = field(default=0.2, metadata={"help": "Share of rollouts held out from the fit."})
    steps: int = field(default=400, metadata={"help": "AdamW steps."})
    learning_rate: float = field(default=1e-2, metadata={"help": "AdamW learning rate."})
    seed: int = field(default=0, metadata={"help": "Seed of the held-out split and the batches."})
    margin: float = field(
        default=0.0,
        metadata={
            "help": "Fit m + (1 - 2m) * w_rule instead of w_rule: RL's gradient through w = sigmoid(z) is w(1 - w), "
            "about 0 at a saturated 0 or 1, so a margin such as 0.05 leaves the rule-initialised head room to move."
        },
    )


def rule_targets(rule: TokenClassEnsemble | SpecCascade, rollouts: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule's w at every drafted position of ``rollouts``, and the index of the rollout of each position."""
    targets = rule_weights(rule, rollouts)
    groups = torch.cat([torch.full((r.num_tokens,), i) for i, r in enumerate(rollouts)])
    return targets, groups


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoConfig, AutoTokenizer

    from hf_diversed.evaluation.weights import resolve_model

    (args,) = TrlParser((ImitationArguments,)).parse_args_and_config(list(sys.argv[1:] if argv is None else argv))
    target_path, draft_path = resolve_model(args.target), resolve_model(args.draft)
    rule = parse_rule(args.rule, tokenizer=AutoTokenizer.from_pretrained(target_path))
    rollouts = load_rollouts(args.rollouts_cache)
    if not 0 <= args.margin < 0.5:
        raise SystemExit(f"--margin must be in [0, 0.5), got {args.margin}.")
    targets, groups = rule_targets(rule, rollouts)
    targets = args.margin + (1 - 2 * args.margin) * targets
    configs = [AutoConfig.from_pretrained(p) for p in (target_path, draft_path)]
    shells = [type("Shell", (), {"config": c})() for c in configs]  # for_models reads only the configs
    torch.manual_seed(args.seed)
    head = DiversedHead.for_models(*shells, init_weight=args.init_weight, target_model=args.target,
                                   draft_model=args.draft, task=None,
                                   use_distribution_features=args.use_distribution_features)  # fmt: skip
    trace = rollouts_trace(rollouts)
    h_draft, h_target = trace.h_draft, trace.h_target
    features = trace.distribution_features() if args.use_distribution_features else None
    metrics = fit_head_to_weights(head, h_draft, h_target, targets, groups=groups, holdout=args.holdout,
                                  steps=args.steps, learning_rate=args.learning_rate, seed=args.seed,
                                  features=features)  # fmt: skip
    out = Path(args.output_dir)
    head.save_pretrained(out)
    report = {"rule": rule.spec(), "rollouts": len(rollouts), **metrics, "arguments": asdict(args)}
    (out / "imitation.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
