#!/usr/bin/env bash
# Table 1 for MBPP, CNN/DM or XSum: every invocation of the run, in order, into docs/table1/<task>. Each resumes
# where it stopped (records already in results.jsonl are skipped), so rerun this script until it prints the report;
# commit docs/table1 as records come in. The records are bfloat16 (an AVX512-BF16 CPU runs them ~3x faster than
# float32): keep DTYPE=bfloat16 so that they pool, and run it where the CPU has AVX512-BF16 or AMX.
#
#   bash benchmarks/table1_task.sh mbpp             # from the repository root; ~1.5 h of a 2-core AVX512-BF16 CPU
#   bash benchmarks/table1_task.sh cnndm            # (table1_mbpp.sh / table1_cnndm.sh call this)
#   bash benchmarks/table1_task.sh xsum
set -euo pipefail
cd "$(dirname "$0")/.."
TASK=${1:?usage: bash benchmarks/table1_task.sh mbpp|cnndm|xsum}
case "$TASK" in
# rows at full size, max new tokens, Chow's alpha (each from docs/table1/<task>-pilot), and the learned head's run:
# started as the speculative cascade that lies beyond the task's static frontier (step 1: OPT 0.1 on MBPP; OPT 0.3,
# 50 rows, on CNN/DM)
mbpp) ROWS=150 MAX_NEW=512 CHOW=0.3 HEAD_RUN=opt0.1-lambda-0.01 ;;
# CNN/DM: stories 0-99; the heads and the distilled draft train on 100-355
cnndm) ROWS=100 MAX_NEW=128 CHOW=0.5 HEAD_RUN=opt0.3-lambda-0.01 ;;
# XSum: documents 0-99; its head trains on 100-269, started as the CNN/DM head was
xsum) ROWS=100 MAX_NEW=128 CHOW=0.5 HEAD_RUN=opt0.3-lambda-0.01 ;;
*)
    echo "unknown task '$TASK': pass mbpp, cnndm or xsum (GSM8K: bash benchmarks/table1_gsm8k.sh)" >&2
    exit 2
    ;;
esac
DTYPE=${DTYPE:-bfloat16}
OUT=docs/table1/$TASK
LORA_DIR=docs/training/distill-$TASK # python training/train.py --mode distill_draft --config training/recipes/distill_$TASK.yaml
COMMON=(--tasks "$TASK" --max-new-tokens "$MAX_NEW" --num-assistant-tokens 5 --timed-examples 0 --batch-size 160
    --threads 2 --dtype "$DTYPE" --output-dir "$OUT")

# 1. T = 1, full size: the target alone (= exact SD), the static sweep, one lenience and one alpha.
hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples "$ROWS" --static-sweep 0,0.1,0.3,0.5,0.7,0.9 \
    --methods exact,lossy:0.5,cascade-opt:0.1

# 2. T = 1, 50 rows: a second lenience and alpha, Chow and Diff, and exact SD with the LoRA-distilled draft once it
#    is trained.
EXTRA=lossy:0.2,cascade-opt:0.3,cascade-chow:$CHOW,cascade-diff:0.1
if [[ "$TASK" == xsum ]]; then # the token-class rule for news: docs/table1/xsum-pilot
    EXTRA=$EXTRA,token-class:digits:0.3
fi
if [[ -f "$LORA_DIR/adapter_config.json" ]]; then
    hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 50 --lora-draft "$LORA_DIR" \
        --methods "$EXTRA,exact+lora-draft"
else
    hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 50 --methods "$EXTRA"
fi

# 3. T = 0, 50 rows: greedy exact SD emits the target's greedy tokens, so its row is the target alone.
hf-diversed bench "${COMMON[@]}" --temperature 0 --num-examples 50 --methods exact,static:0.5,static:0.9,cascade-opt:0.1

# 4. The task's learned head on the full rows, once it is trained (records are keyed by the head).
HEAD_DIR=docs/training/$TASK-full/$HEAD_RUN
if [[ -f "$HEAD_DIR/model.safetensors" ]]; then
    hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples "$ROWS" --head "$HEAD_DIR" --methods diversed
fi

# 5. Cross-task (the paper's cross-task table): the GSM8K head on MBPP (50 rows), the CNN/DM head on XSum (every row).
if [[ "$TASK" == mbpp ]]; then
    hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 50 \
        --head docs/training/gsm8k-full/opt0.1-lambda-0.01 --methods diversed
fi
if [[ "$TASK" == xsum ]]; then
    hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples "$ROWS" \
        --head docs/training/cnndm-full/opt0.3-lambda-0.01 --methods diversed
fi

python benchmarks/table1_report.py
