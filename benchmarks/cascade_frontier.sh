#!/usr/bin/env bash
# The zero-training frontier a learned head is judged against (docs/results.md, "against every zero-training rule"):
# SpecCascade OPT at alpha 0.05, 0.1, 0.2, 0.3, 0.5 and lossy SD at lenience 0.2, 0.5, 0.8, on Table 1's 150 rows
# (T = 1, N = 5, 512 new tokens, the batched sampler), beside the rules Table 1 already ran there. One `hf-diversed
# bench` invocation for all the rules: the sampler keeps its 128 rows full across them and prefills each prompt once
# for all, and writes each sequence as it finishes, so a killed run keeps what it drew and a rerun resumes (rows
# already in docs/table1/<task> are skipped). With COMMIT=1 the records are committed every COMMIT_EVERY seconds
# (default 1200) and at the end. Only quality and acceptance are measured (no timing): it may share the CPU.
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
OUT=docs/table1/$TASK
commit() {
    git add "$OUT" && git commit -q -m "$OUT: the zero-training frontier ($RULES) on 150 rows, $1" -- "$OUT" || true
}
if [[ "${COMMIT:-0}" == 1 ]]; then
    (while sleep "${COMMIT_EVERY:-1200}"; do commit "records so far"; done) &
    committer=$!
    trap 'pkill -P $committer 2>/dev/null; kill $committer 2>/dev/null || true' EXIT # its sleep too
fi
${DRY:+echo} hf-diversed bench --tasks "$TASK" --methods "$RULES" --num-examples 150 --temperature 1 \
    --max-new-tokens 512 --num-assistant-tokens 5 --timed-examples 0 --batch-size 128 --threads 2 --dtype "$DTYPE" \
    --output-dir "$OUT"
if [[ "${COMMIT:-0}" == 1 ]]; then
    commit "every row"
fi
