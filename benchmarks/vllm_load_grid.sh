#!/usr/bin/env bash
# Every rule at every load in vLLM (docs/vllm.md, "Under load"): the target alone, exact SD, cascade-opt 0.1 and the
# task's bundled head at fixed N = 5, the same three with the draft-length policy, and vLLM's own batch-size schedule
# (K drafts up to CUT requests in flight, none beyond): a small grid (CUT in CUTS, K 3 or 5) on one rule (GRID_RULE),
# and the schedules chosen from it (SCHEDULES, e.g. sched:4:5) for every rule. One bench_vllm invocation per concurrency,
# so that a rule's phases and the target alone's at that concurrency run minutes apart in one sitting. Each
# invocation resumes where it stopped (phases already in the directory are skipped); with COMMIT=1 the records are
# committed after each one. The policy's server writes its step log beside the phases (policy-steps.jsonl).
#
#   bash benchmarks/vllm_load_grid.sh gsm8k 1,2,4,8,16,32    # from the repository root, after docs/vllm.md's install
#   COMMIT=1 SCHEDULES=sched:4:5 bash benchmarks/vllm_load_grid.sh mbpp 1,8,32
#
# 8 prompts at 1 and 2 in flight, 32 from 4 on; T = 1, 256 new tokens. A schedule with CUT >= c drafts K at every step
# of a phase at concurrency c, so at c its cuts from c on are one configuration: the grid runs each (CUT, K) only at
# the concurrencies where it differs from every smaller cut (CUT = c is the one that drafts throughout).
#
# From BESIDE in flight on (default 4; empty: never), where the target alone is the one to beat, each rule's policy
# phase is timed again beside a target alone of its own ($OUT/<task>-c<c>-beside/<rule>/, one invocation each, which
# of the two runs first alternating from rule to rule): the machine's pace drifts by several per cent over the hour
# an invocation takes, so a ratio against the target alone of its first minutes is read against another pace.
set -euo pipefail
cd "$(dirname "$0")/.."
TASK=${1:?usage: bash benchmarks/vllm_load_grid.sh gsm8k|mbpp CONCURRENCIES [RULES]}
LOADS=${2:?give the concurrencies, e.g. 1,2,4,8,16,32}
RULES=${3:-exact,cascade-opt:0.1,diversed}
OUT=${OUT:-docs/vllm/load-grid}
COSTS=${COSTS:-docs/vllm/policy/step_costs-256tok.json}
CUTS=${CUTS:-2,4,8,16}
GRID_RULE=${GRID_RULE-cascade-opt:0.1}
SCHEDULES=${SCHEDULES:-}
BESIDE=${BESIDE-4}
export VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0 OMP_NUM_THREADS=2

bench() { # DIR METHODS, at the loop's concurrency c with its prompts
    ${DRY:+echo} python benchmarks/bench_vllm.py --tasks "$TASK" --max-new-tokens 256 --num-prompts "$prompts" \
        --concurrency "$c" --no-prefix-caching --policy-costs "$COSTS" --output-dir "$1" --methods "$2" \
        --policy-settings "{\"step_log\": \"$1/policy-steps.jsonl\"}"
}

for c in ${LOADS//,/ }; do
    prompts=$((c <= 2 ? 8 : 32))
    methods=ar
    for rule in ${RULES//,/ }; do
        methods+=",$rule,$rule@policy"
        for engine in ${SCHEDULES//,/ }; do
            IFS=: read -r _ cut k <<<"$engine"
            # a schedule drafting N = 5 up to a cut at or above c is fixed N = 5 there, run just above
            ((cut >= c && k == 5)) || methods+=",$rule@$engine"
        done
    done
    for rule in ${GRID_RULE//,/ }; do
        for k in 3 5; do
            for cut in ${CUTS//,/ }; do
                # cuts below c each differ (the phase drains through them); the smallest cut >= c drafts throughout
                if ((cut < c)); then
                    [[ ",$SCHEDULES," == *",sched:$cut:$k,"* ]] || methods+=",$rule@sched:$cut:$k"
                elif ((k == 3)); then # at K = 5 it is fixed N = 5, run above
                    [[ ",$SCHEDULES," == *",sched:$cut:$k,"* ]] || methods+=",$rule@sched:$cut:$k"
                    break
                else
                    break
                fi
            done
        done
    done
    bench "$OUT/$TASK-c$c" "$methods"
    if [[ "${COMMIT:-0}" == 1 ]]; then
        git add "$OUT/$TASK-c$c" && git commit -q -m "$OUT: $TASK at $c in flight" -- "$OUT/$TASK-c$c" || true
    fi
    if [[ -n "$BESIDE" ]] && ((c >= BESIDE)); then
        first=policy
        for rule in ${RULES//,/ }; do
            dir="$OUT/$TASK-c$c-beside/${rule//:/-}"
            if [[ $first == policy ]]; then
                bench "$dir" "$rule@policy" && bench "$dir" ar && first=ar
            else
                bench "$dir" ar && bench "$dir" "$rule@policy" && first=policy
            fi
        done
        if [[ "${COMMIT:-0}" == 1 ]]; then
            git add "$OUT/$TASK-c$c-beside" &&
                git commit -q -m "$OUT: $TASK at $c in flight, the policy beside a target alone of its own" -- "$OUT/$TASK-c$c-beside" || true
        fi
    fi
done
