#!/usr/bin/env bash
# Softmax against negative sampling on FB15k-237 in 3 clients, Central GQE, the same optimiser
# steps for both losses: 3 seeds per loss, two single-thread runs at a time (a 2-core machine),
# then one JSON per loss under docs/results/fedcqa/. Runs already finished in OUT are reused.
#
#   scripts/benchmarks/fedcqa_fb15k237_loss.sh [STEPS [OUT]]        (from the repository root)
#
# PYTHON picks the interpreter; EXTRA adds overrides to every run, e.g.
#   EXTRA="data.name=/abs/path/FB15k-237-Fed3 task.cache_dir=runs/qcache" scripts/benchmarks/fedcqa_fb15k237_loss.sh 100
# Every run's start, end, wall seconds and load average go to OUT/runs.log.
set -euo pipefail
steps=${1:-40}
out=${2:-runs/fedcqa_fb_loss}
py=${PYTHON:-python}
# one round of STEPS steps: one validation, then the test (in-graph and cross-graph)
common=(task.steps_per_epoch="$steps" federated.rounds=1 federated.eval_every=1 trainer.threads=1 ${EXTRA:-})
mkdir -p "$out"

run() {  # run LOSS SEED
    local start=$SECONDS
    echo "$(date -u +%FT%T) start $1 seed $2 load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/runs.log"
    nice -n 10 "$py" scripts/benchmarks/bench_fedcqa.py quality --variants fb15k237_fed3_central_gqe --seeds "$2" \
        --out "$out/$1" "${common[@]}" task.loss="$1" > "$out/$1_seed$2.log" 2>&1
    echo "$(date -u +%FT%T) end $1 seed $2 wall $((SECONDS - start)) s load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/runs.log"
}

# a softmax step costs ~20 negative-sampling steps on CPU (an L1 distance to all 14,505
# entities and its backward), so one worker takes two softmax runs, the other the rest
( run softmax 0; run softmax 1 ) &
( run softmax 2; run negative_sampling 0; run negative_sampling 1; run negative_sampling 2 ) &
wait

for loss in softmax negative_sampling; do
    "$py" scripts/benchmarks/bench_fedcqa.py quality --variants fb15k237_fed3_central_gqe --seeds 0 1 2 \
        --out "$out/$loss" \
        --json-out "docs/results/fedcqa/fb15k237_fed3_central_$loss.json" "${common[@]}" task.loss="$loss"
done
