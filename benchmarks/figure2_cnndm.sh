#!/usr/bin/env bash
# The paper's Figure 2 on the real pair: CNN/DM at T = 0 (greedy), the static ensemble's sweep w = 0 ... 1 as a
# time-quality frontier, with exact SD, the cascades and the CNN/DM head as points. Two steps, each resumable:
#
#   1. the sampler on stories 0-99 (ROUGE-2 and acceptance) into docs/table1/cnndm, beside Table 1's records
#      (~40 min of a 2-core AVX512-BF16 CPU);
#   2. the batch-1 loop on stories 0-9, every method side by side in one run, into docs/table1/cnndm-greedy-timed
#      (~1 h; it needs the machine to itself, and a resumed run mixes two machines' timings: finish it on one).
#
#   bash benchmarks/figure2_cnndm.sh            # from the repository root
#
# Then `python benchmarks/table1_report.py` draws docs/table1/cnndm/frontier_greedy.png and its table.
set -euo pipefail
cd "$(dirname "$0")/.."
HEAD_DIR=docs/training/cnndm-full/opt0.3-lambda-0.01
METHODS=exact,cascade-opt:0.1,cascade-opt:0.3,cascade-chow:0.5,cascade-diff:0.1,diversed # Table 1's cascades
ARGS=(--tasks cnndm --temperature 0 --static-sweep 0,0.1,0.3,0.5,0.7,0.9,1 --head "$HEAD_DIR"
    --max-new-tokens 128 --num-assistant-tokens 5 --threads 2 --dtype "${DTYPE:-bfloat16}")
hf-diversed bench "${ARGS[@]}" --methods "$METHODS" --num-examples 100 --timed-examples 0 --batch-size 160 \
    --output-dir docs/table1/cnndm
hf-diversed bench "${ARGS[@]}" --methods "ar,$METHODS" --num-examples 10 --timed-examples 10 --batch-size 64 \
    --output-dir docs/table1/cnndm-greedy-timed
python benchmarks/table1_report.py
