"""What the DIVERSED head adds to a vLLM verification step, on the real pair's sizes: a table of milliseconds.

Per step of ``b`` requests with N drafted tokens each (rows = b * N drafted positions, vocabulary V = 151936, hidden
sizes 1536 / 896): the head's weights as the plugin computes them (``heads.head_weights``: max p, max q and TV over
the vocabulary, then the bundled GSM8K head's linear layer) beside the part every relaxed rule already pays
(``exact_targets`` for ``static:0.5``: the target law t handed to vLLM) and the plugin's whole head path (weights,
then ``exact_targets`` for DIVERSED). Random laws and hidden states, float32, on the CPU, side by side in one run;
the median of ``--repeats`` after a warm-up.

    python benchmarks/bench_vllm_head_cost.py --batch 1,8 --num-draft 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from hf_diversed.generation.verification import parse_rule
from hf_diversed.integrations.vllm.heads import head_weights
from hf_diversed.integrations.vllm.rules import exact_targets
from hf_diversed.modeling.hub import load_head
from hf_diversed.modeling.pretrained import PRETRAINED_HEADS

VOCAB, TARGET_HIDDEN, DRAFT_HIDDEN = 151936, 1536, 896


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _step_costs(b: int, num_draft: int, head, repeats: int, generator: torch.Generator) -> tuple[float, float, float]:
    """(static:0.5 target law, head weights, head weights + DIVERSED target law) in ms for one step of ``b``
    requests."""
    rows, counts = b * num_draft, [num_draft] * b
    p = torch.rand(rows, VOCAB, generator=generator).softmax(-1)
    q = torch.rand(rows, VOCAB, generator=generator).softmax(-1)
    h_t = torch.randn(rows, TARGET_HIDDEN, generator=generator)
    h_d = torch.randn(rows, DRAFT_HIDDEN, generator=generator)
    static, diversed = [parse_rule("static:0.5")] * b, [parse_rule("diversed")] * b
    heads = [head] * b
    return (
        _median_ms(lambda: exact_targets(static, counts, p, q), repeats),
        _median_ms(lambda: head_weights(heads, counts, p, q, h_t, h_d), repeats),
        _median_ms(lambda: exact_targets(diversed, counts, p, q, head_weights(heads, counts, p, q, h_t, h_d)), repeats),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--num-draft", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bundled = PRETRAINED_HEADS[0]
    head = load_head(bundled.folder)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"CPU capability {capability}, {args.threads} threads, torch {torch.__version__}, float32")
    print(f"head {bundled.repo_id} (use_distribution_features={head.config.use_distribution_features})\n")
    print(
        "| requests | drafted rows | static:0.5 target law (ms) | head weights (ms) | head path: weights + law (ms) |"
    )
    print("|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for b in args.batch:
        law, weights, path = _step_costs(b, args.num_draft, head, args.repeats, generator)
        print(f"| {b} | {b * args.num_draft} | {law:.2f} | {weights:.2f} | {path:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
