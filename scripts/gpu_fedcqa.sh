#!/usr/bin/env bash
# FedCQA on one GPU (issue 36): the in-graph ordering on FB15k-237-Fed3 (Local against FedCQA,
# GQE, width 400, the paper's softmax loss) at a budget the 2-core CPU cannot reach.
#
#   OUT=$OUT ROUNDS=20 STEPS=100 SEEDS="0" scripts/gpu_fedcqa.sh      (from the repository root)
#
# Steps, each under a timeout: a 2-round UMLS FedCQA run on the GPU (FedCQA's first CUDA
# run: a device bug shows here in seconds); then, per seed, Local and FedCQA on FB15k-237-Fed3
# for ROUNDS x STEPS softmax steps of 512 queries per client, validated every EVAL rounds (the
# first run builds the query sets into QCACHE, ~5 min on 2 CPU cores); then one JSON with the
# in-graph validation MRR per evaluated round and the test in-graph / cross-graph MRR. Only
# JSON and logs go to $OUT (default runs/gpu_fedcqa); the runs' folders to RUNS.
#
# Beside the checkout it needs what scripts/gpu_capture.sh needs, in .gpu/: data.tgz with the
# FB15k-237-Fed3 folder, this package as a wheel and any wheel the machine lacks (omegaconf).
# On the CPU (to check the plumbing): INSTALL=0 PYTHON=.venv/bin/python PREFIX=umls ROUNDS=2 STEPS=5 EVAL=1 \
#   OUT=/tmp/gf RUNS=/tmp/gf_runs scripts/gpu_fedcqa.sh
set -u
OUT=${OUT:-runs/gpu_fedcqa}
RUNS=${RUNS:-runs/gpu_fedcqa_runs}
QCACHE=${QCACHE:-runs/qcache}
ROUNDS=${ROUNDS:-20}
STEPS=${STEPS:-100}
EVAL=${EVAL:-5}
SEEDS=${SEEDS:-0}
LIMIT=${LIMIT:-240}      # seconds per FB15k-237 run
PREFIX=${PREFIX:-fb15k237_fed3}
mkdir -p "$OUT" "$RUNS"
export PYTHONUNBUFFERED=1
if [[ ${INSTALL:-1} == 1 ]]; then
  mkdir -p ../shared/data
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/*.whl \
      && export PYTHONPATH=$PWD:/tmp/site || exit 1
  tar xzf .gpu/data.tgz -C ../shared/data || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
py=${PYTHON:-python3}
$py -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__,
        torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

step() { echo "== $*"; local t0=$(date +%s%N); "$@"; echo "== rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }

step timeout 120 $py scripts/bench_fedcqa.py quality --variants umls_fedcqa_gqe --seeds 0 --out "$RUNS/umls_smoke" \
    --json-out "$OUT/umls_smoke.json" federated.rounds=2 federated.eval_every=2 2>&1 | grep -v -i warning | tail -4

common=(federated.rounds="$ROUNDS" task.steps_per_epoch="$STEPS" federated.eval_every="$EVAL"
        federated.patience=1000 task.loss=softmax task.cache_dir="$QCACHE" ${EXTRA:-})
for seed in $SEEDS; do
  for v in local fedcqa; do
    # the first run also builds the query sets (unless QCACHE has them): 6 more minutes
    limit=$LIMIT; [[ -n $(ls -A "$QCACHE" 2>/dev/null) ]] || limit=$((LIMIT + 360))
    step timeout "$limit" $py scripts/bench_fedcqa.py quality --variants "${PREFIX}_${v}_gqe" --seeds "$seed" \
        --out "$RUNS/order" "${common[@]}" > "$OUT/${PREFIX}_${v}_seed$seed.log" 2>&1
    grep -E "^${PREFIX}_${v}_gqe " "$OUT/${PREFIX}_${v}_seed$seed.log"
  done
done
step timeout 120 $py scripts/bench_fedcqa.py quality --variants "${PREFIX}_local_gqe" "${PREFIX}_fedcqa_gqe" --seeds $SEEDS \
    --out "$RUNS/order" --json-out "$OUT/${PREFIX}_order_softmax_$((ROUNDS * STEPS))steps.json" "${common[@]}" 2>&1 \
    | grep -v -i warning | tail -30
