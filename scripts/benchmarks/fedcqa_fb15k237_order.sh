#!/usr/bin/env bash
# The paper's ordering on FB15k-237 in 3 or 5 clients (GQE, the configs' loss): Local, FedR-style,
# FedE-style and FedCQA at the same steps per client, 3 seeds each, two single-thread runs at
# a time (a 2-core machine), then one JSON under docs/results/fedcqa/. Runs already finished
# in OUT are reused.
#
#   scripts/benchmarks/fedcqa_fb15k237_order.sh [ROUNDS [STEPS [OUT]]]     (from the repository root)
#
# Every client takes ROUNDS x STEPS steps of 512 queries (default 4 x 50 = 200), FedCQA and
# the FedE/FedR-style baselines aggregating after each round; one validation at the end, then
# the test (in-graph and cross-graph). PYTHON picks the interpreter; EXTRA adds overrides to
# every run, e.g. EXTRA="data.name=/abs/path/FB15k-237-Fed3 task.cache_dir=runs/qcache".
# CLIENTS=5 runs the fb15k237_fed5_* configs (FB15k-237-Fed5) instead of fed3. VARIANTS picks
# some of the four (default "local fedr fede fedcqa"), SEEDS the seeds (default "0 1 2"), JSON
# the summary's path; EXTRA's overrides come last, so they win (e.g. task.loss=negative_sampling,
# which this script forced until 2026-11-27).
# Every run's start, end, wall seconds and load average go to OUT/runs.log; each run's output to
# OUT/VARIANT_seedS.log, appended at every start.
set -euo pipefail
rounds=${1:-4}
steps=${2:-50}
clients=${CLIENTS:-3}
suffix=$([[ $clients == 3 ]] || echo "_fed$clients")  # the 3-client folder keeps its name
out=${3:-runs/fedcqa_fb_order_$((rounds * steps))$suffix}
py=${PYTHON:-python}
common=(federated.rounds="$rounds" task.steps_per_epoch="$steps" federated.eval_every="$rounds"
        trainer.threads=1 ${EXTRA:-})
variants=()
for v in ${VARIANTS:-local fedr fede fedcqa}; do variants+=("fb15k237_fed${clients}_${v}_gqe"); done
seeds=(${SEEDS:-0 1 2})
json=${JSON:-docs/results/fedcqa/fb15k237_fed${clients}_order_$((rounds * steps))steps.json}
mkdir -p "$out"

run() {  # run VARIANT SEED
    local start=$SECONDS
    echo "$(date -u +%FT%T) start $1 seed $2 load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/runs.log"
    # appended, not overwritten: a resumed run's log keeps the rounds of its earlier starts
    echo "=== $(date -u +%FT%T) start" >> "$out/$1_seed$2.log"
    nice -n 10 "$py" scripts/benchmarks/bench_fedcqa.py quality --variants "$1" --seeds "$2" \
        --out "$out" "${common[@]}" >> "$out/$1_seed$2.log" 2>&1
    echo "$(date -u +%FT%T) end $1 seed $2 wall $((SECONDS - start)) s load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/runs.log"
}

# seed by seed, so that a session cut short leaves whole seeds; two workers, each takes every
# other run of the list
jobs=()
for seed in "${seeds[@]}"; do for v in "${variants[@]}"; do jobs+=("$v $seed"); done; done
( for ((i = 0; i < ${#jobs[@]}; i += 2)); do run ${jobs[i]}; done ) &
( for ((i = 1; i < ${#jobs[@]}; i += 2)); do run ${jobs[i]}; done ) &
wait

"$py" scripts/benchmarks/bench_fedcqa.py quality --variants "${variants[@]}" --seeds "${seeds[@]}" --out "$out" \
    --json-out "$json" "${common[@]}"
