#!/usr/bin/env bash
# Table 1, GSM8K: every invocation of the run, in order, into docs/table1/gsm8k. Each resumes where it stopped
# (records already in results.jsonl are skipped), so rerun this script until it prints the report; commit
# docs/table1 as records come in. The records so far are float32: keep DTYPE=float32 so that they pool.
#
#   bash benchmarks/table1_gsm8k.sh                 # from the repository root; ~5 h of a 2-core CPU in float32
set -euo pipefail
cd "$(dirname "$0")/.."
DTYPE=${DTYPE:-float32}
OUT=docs/table1/gsm8k
HEAD_DIR=docs/training/gsm8k-full/lambda-0.1
LORA_DIR=docs/training/distill-gsm8k # python training/train.py --mode distill_draft --config training/recipes/distill_gsm8k.yaml --output_dir $LORA_DIR
COMMON=(--tasks gsm8k --max-new-tokens 512 --num-assistant-tokens 5 --timed-examples 0 --batch-size 128 --threads 2
    --dtype "$DTYPE" --output-dir "$OUT")

# 1. T = 1, 150 rows: the target alone (= exact SD), the static sweep, one lenience, one alpha, the token-class
#    rules and the lambda = 0.1 head.
hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 150 --head "$HEAD_DIR" --static-sweep 0,0.1,0.3,0.5,0.7,0.9 \
    --methods exact,lossy:0.5,cascade-opt:0.1,token-class:digits:0,token-class:digits:0.3,diversed

# 1b. The other GSM8K heads on the same rows, side by side (records are keyed by the head): lambda = 0.01, the head
#     started as SpecCascade OPT 0.1 (lambda = 0.01), and the MLP head once its run has finished.
HEADS=(--head docs/training/gsm8k-full/lambda-0.01 --head docs/training/gsm8k-full/opt0.1-lambda-0.01)
MLP_HEAD=docs/training/gsm8k-full/mlp64-lr5e-4-lambda-0.01
if [[ -f "$MLP_HEAD/model.safetensors" ]]; then
    HEADS+=(--head "$MLP_HEAD")
fi
# and the lenience head started as lossy SD 0.2 (training/recipes/gsm8k-lenience.yaml), once its run has finished.
LENIENCE_HEAD=docs/training/gsm8k-lenience/lossy0.2-lambda-0.01
if [[ -f "$LENIENCE_HEAD/model.safetensors" ]]; then
    HEADS+=(--head "$LENIENCE_HEAD")
fi
hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 150 "${HEADS[@]}" --methods diversed

# 2. T = 1, 50 rows: a second lenience and alpha, Chow and Diff (values from docs/table1/gsm8k-pilot), and exact SD
#    with the LoRA-distilled draft.
hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 50 --lora-draft "$LORA_DIR" \
    --methods lossy:0.2,cascade-opt:0.3,cascade-chow:0.3,cascade-diff:0.1,exact+lora-draft

# 3. T = 0, 50 rows: greedy exact SD emits the target's greedy tokens, so its row is the target alone.
hf-diversed bench "${COMMON[@]}" --temperature 0 --num-examples 50 --methods exact,static:0.5,static:0.9,cascade-opt:0.1

# 4. Cross-task (the paper's cross-task table), 50 rows: the MBPP head on GSM8K, once it is trained.
MBPP_HEAD=docs/training/mbpp-full/opt0.1-lambda-0.01
if [[ -f "$MBPP_HEAD/model.safetensors" ]]; then
    hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 50 --head "$MBPP_HEAD" --methods diversed
fi

python benchmarks/table1_report.py
