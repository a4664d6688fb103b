#!/usr/bin/env bash
# Draft length N = 3, 5, 7 for one task (T = 1): exact SD, static 0.5, SpecCascade OPT at Table 1's alpha and the
# task's bundled head. Two steps, each resumable:
#
#   1. the sampler at N = 3 and 7 on rows 0-49 into docs/table1/<task>, beside Table 1's N = 5 records (acceptance,
#      tokens per round, quality);
#   2. the batch-1 loop at N = 3, 5 and 7 on the first 10 examples, every method and N side by side in one run (with
#      c and v(N) measured in it), into docs/table1/<task>-draft-timed. It needs the machine to itself, and a resumed
#      run mixes two machines' timings: finish it on one.
#
#   bash benchmarks/draft_length.sh gsm8k    # from the repository root; gsm8k | mbpp | cnndm
#
# Then `python benchmarks/table1_report.py` writes each task's draft-length table and its fastest N per method.
set -euo pipefail
cd "$(dirname "$0")/.."
TASK=${1:?usage: bash benchmarks/draft_length.sh gsm8k|mbpp|cnndm}
case "$TASK" in
gsm8k) MAX_NEW=512 BATCH=128 HEAD=docs/training/gsm8k-full/opt0.1-lambda-0.01 ;;
mbpp) MAX_NEW=512 BATCH=160 HEAD=docs/training/mbpp-full/opt0.1-lambda-0.01 ;;
cnndm) MAX_NEW=128 BATCH=160 HEAD=docs/training/cnndm-full/opt0.3-lambda-0.01 ;;
*)
    echo "unknown task '$TASK': pass gsm8k, mbpp or cnndm" >&2
    exit 2
    ;;
esac
METHODS=exact,static:0.5,cascade-opt:0.1,diversed
ARGS=(--tasks "$TASK" --head "$HEAD" --temperature 1 --max-new-tokens "$MAX_NEW" --threads 2 --dtype "${DTYPE:-bfloat16}")
hf-diversed bench "${ARGS[@]}" --methods "$METHODS" --num-assistant-tokens 3,7 --num-examples 50 --timed-examples 0 \
    --batch-size "$BATCH" --output-dir "docs/table1/$TASK"
hf-diversed bench "${ARGS[@]}" --methods "ar,$METHODS" --num-assistant-tokens 3,5,7 --num-examples 10 \
    --timed-examples 10 --batch-size 64 --output-dir "docs/table1/$TASK-draft-timed"
python benchmarks/table1_report.py
