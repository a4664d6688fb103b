#!/usr/bin/env bash
# Table 1, CNN/DM: every invocation of the run, in order, into docs/table1/cnndm. Each resumes where it stopped
# (records already in results.jsonl are skipped), so rerun this script until it prints the report; commit
# docs/table1 as records come in. The records are bfloat16 (an AVX512-BF16 CPU runs them ~3x faster than
# float32): keep DTYPE=bfloat16 so that they pool, and run it where the CPU has AVX512-BF16 or AMX.
#
#   bash benchmarks/table1_cnndm.sh                 # from the repository root; ~1.5 h of a 2-core AVX512-BF16 CPU
set -euo pipefail
cd "$(dirname "$0")/.."
DTYPE=${DTYPE:-bfloat16}
OUT=docs/table1/cnndm
LORA_DIR=docs/training/distill-cnndm # python training/train.py --mode distill_draft --config training/recipes/distill_cnndm.yaml
COMMON=(--tasks cnndm --max-new-tokens 128 --num-assistant-tokens 5 --timed-examples 0 --batch-size 160 --threads 2
    --dtype "$DTYPE" --output-dir "$OUT")

# 1. T = 1, 100 rows (stories 0-99; the heads and the distilled draft train on 100-355): the target alone (= exact
#    SD), the static sweep, one lenience and one alpha (values from docs/table1/cnndm-pilot).
hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 100 --static-sweep 0,0.1,0.3,0.5,0.7,0.9 \
    --methods exact,lossy:0.5,cascade-opt:0.1

# 2. T = 1, 50 rows: a second lenience and alpha, Chow and Diff (docs/table1/cnndm-pilot), and exact SD with the
#    LoRA-distilled draft once it is trained.
EXTRA=(--methods lossy:0.2,cascade-opt:0.3,cascade-chow:0.5,cascade-diff:0.1)
if [[ -f "$LORA_DIR/adapter_config.json" ]]; then
    EXTRA=(--lora-draft "$LORA_DIR" --methods lossy:0.2,cascade-opt:0.3,cascade-chow:0.5,cascade-diff:0.1,exact+lora-draft)
fi
hf-diversed bench "${COMMON[@]}" --temperature 1 --num-examples 50 "${EXTRA[@]}"

# 3. T = 0, 50 rows: greedy exact SD emits the target's greedy tokens, so its row is the target alone.
hf-diversed bench "${COMMON[@]}" --temperature 0 --num-examples 50 --methods exact,static:0.5,static:0.9,cascade-opt:0.1

python benchmarks/table1_report.py
