#!/usr/bin/env bash
# Table 1's real speed: the batch-1 loop on a task's first 10 examples, every method side by side in one run, into
# docs/table1/<task>-timed. Resumable like the sampler runs (timed records already there are skipped), but a
# resumed run mixes two machines' timings: finish a task's run on one machine, and rerun from scratch (delete the
# folder) if it must move. It needs the machine to itself: a second job on the CPU slows the timed loop.
#
#   bash benchmarks/table1_timed.sh gsm8k    # ~1 h of a 2-core AVX512-BF16 CPU (512 new tokens)
#   bash benchmarks/table1_timed.sh mbpp     # ~1 h (512 new tokens)
#   bash benchmarks/table1_timed.sh cnndm    # ~30 min (128 new tokens)
#   bash benchmarks/table1_timed.sh xsum     # 128 new tokens; the CNN/DM head and the XSum head (train it first)
#
# Further arguments go to `hf-diversed bench`, e.g. `--remeasure-costs` to time c and v again on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
TASK=${1:?usage: bash benchmarks/table1_timed.sh gsm8k|mbpp|cnndm|xsum [hf-diversed bench arguments]}
shift
METHODS=ar,exact,lossy:0.5,cascade-opt:0.1
case "$TASK" in
gsm8k)
    MAX_NEW=512 EXTRA=(--head docs/training/gsm8k-full/lambda-0.1 --head docs/training/gsm8k-full/opt0.1-lambda-0.01)
    METHODS=$METHODS,token-class:digits:0,token-class:digits:0.3,diversed
    ;;
mbpp)
    MAX_NEW=512 EXTRA=(--head docs/training/mbpp-full/opt0.1-lambda-0.01)
    METHODS=$METHODS,diversed
    ;;
cnndm)
    MAX_NEW=128 EXTRA=(--head docs/training/cnndm-full/opt0.3-lambda-0.01)
    METHODS=$METHODS,diversed
    ;;
xsum) # every method in one run, so the XSum head must exist before it starts
    XSUM_HEAD=docs/training/xsum-full/opt0.3-lambda-0.01
    if [[ ! -f "$XSUM_HEAD/model.safetensors" ]]; then
        echo "no XSum head in $XSUM_HEAD: train it first (training/recipes/xsum-full.yaml names the command)" >&2
        exit 2
    fi
    MAX_NEW=128 EXTRA=(--head docs/training/cnndm-full/opt0.3-lambda-0.01 --head "$XSUM_HEAD")
    METHODS=$METHODS,token-class:digits:0.3,diversed
    ;;
*)
    echo "unknown task '$TASK': pass gsm8k, mbpp, cnndm or xsum" >&2
    exit 2
    ;;
esac
hf-diversed bench --tasks "$TASK" --methods "$METHODS" "${EXTRA[@]}" --static-sweep 0,0.1,0.3,0.5,0.7,0.9 \
    --temperature 1 --num-examples 10 --timed-examples 10 --max-new-tokens "$MAX_NEW" --num-assistant-tokens 5 \
    --batch-size 64 --threads 2 --dtype "${DTYPE:-bfloat16}" --output-dir "docs/table1/$TASK-timed" "$@"
python benchmarks/table1_report.py
