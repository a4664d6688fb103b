#!/usr/bin/env bash
# The zero-training frontier a learned head is judged against (docs/results.md, "against every zero-training rule"):
# SpecCascade OPT at alpha 0.05, 0.1, 0.2, 0.3, 0.5 and lossy SD at lenience 0.2, 0.5, 0.8, on Table 1's 150 rows
# (T = 1, N = 5, 512 new tokens, the batched sampler), beside the rules Table 1 already ran there. One `hf-diversed
# bench` invocation per rule, each resumable (rows already in docs/table1/<task> are skipped); with COMMIT=1 the
# records are committed after each rule. Only quality and acceptance are measured (no timing): it may share the CPU.
#
#   COMMIT=1 bash benchmarks/cascade_frontier.sh gsm8k    # from the repository root; gsm8k | mbpp
#
# Then `python benchmarks/table1_report.py` sets each head against the frontier of every zero-training rule.
set -euo pipefail
cd "$(dirname "$0")/.."
TASK=${1:?usage: bash benchmarks/cascade_frontier.sh gsm8k|mbpp [RULES]}
case "$TASK" in
gsm8k) DTYPE=float32 ;; # the dtype of Table 1's GSM8K rows at N = 5 (its heads' included)
mbpp) DTYPE=bfloat16 ;;
*)
    echo "unknown task '$TASK': pass gsm8k or mbpp" >&2
    exit 2
    ;;
esac
# cascade-opt 0.1 and lossy 0.5 already hold Table 1's 150 rows
RULES=${2:-cascade-opt:0.2,cascade-opt:0.05,lossy:0.8,cascade-opt:0.3,lossy:0.2,cascade-opt:0.5}
for rule in ${RULES//,/ }; do
    hf-diversed bench --tasks "$TASK" --methods "$rule" --num-examples 150 --temperature 1 --max-new-tokens 512 \
        --num-assistant-tokens 5 --timed-examples 0 --batch-size 128 --threads 2 --dtype "$DTYPE" \
        --output-dir "docs/table1/$TASK"
    if [[ "${COMMIT:-0}" == 1 ]]; then
        git add "docs/table1/$TASK" && git commit -q -m "docs/table1/$TASK: $rule on 150 rows (the zero-training frontier)" -- "docs/table1/$TASK" || true
    fi
done
