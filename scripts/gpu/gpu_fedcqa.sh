#!/usr/bin/env bash
# FedCQA on one GPU: the in-graph ordering on FB15k-237-Fed3 (Local against FedCQA,
# GQE, width 400, the paper's softmax loss) at a budget the 2-core CPU cannot reach.
#
#   OUT=$OUT ROUNDS=20 STEPS=100 SEEDS="0" scripts/gpu/gpu_fedcqa.sh      (from the repository root)
#
# Steps, each under a timeout: a 2-round UMLS FedCQA run on the GPU (FedCQA's first CUDA
# run: a device bug shows here in seconds, and the FB15k-237 runs are then skipped); the
# query sets sampled into QCACHE in parallel processes (`fedkg data stats --workers`; the
# cache is hundreds of MB, too large to carry); then, per seed, Local and FedCQA on
# FB15k-237-Fed3 side by side (two processes sharing the GPU) for ROUNDS x STEPS softmax
# steps of 512 queries per client, validated every EVAL rounds. Each run's log has one line
# per round (seconds, and the in-graph validation MRR where it validated), so a run cut by
# its LIMIT keeps its curve; a finished run also writes its metrics.json (test in-graph and
# cross-graph), copied to $OUT. Logs and JSON go to $OUT (default runs/gpu_fedcqa); the runs'
# folders to RUNS.
#
# Beside the checkout it needs what scripts/gpu/gpu_capture.sh needs, in .gpu/: data.tgz with the
# FB15k-237-Fed3 folder, this package as a wheel and the wheels the machine lacks: omegaconf,
# and for FedCQA's secure aggregation cryptography, pycryptodome, cffi and pycparser.
# Measured on one H100 (docs/results/fedcqa.md): the query sets take ~2 min with WORKERS=16;
# Local and FedCQA side by side ~20 and ~25 s per round of 3 x 100 steps.
# On the CPU (to check the plumbing): INSTALL=0 PYTHON=.venv/bin/python PREFIX=umls ROUNDS=2 STEPS=5 EVAL=1 \
#   OUT=/tmp/gf RUNS=/tmp/gf_runs scripts/gpu/gpu_fedcqa.sh
set -u
OUT=${OUT:-runs/gpu_fedcqa}
RUNS=${RUNS:-runs/gpu_fedcqa_runs}
QCACHE=${QCACHE:-runs/qcache}
ROUNDS=${ROUNDS:-20}
STEPS=${STEPS:-100}
EVAL=${EVAL:-5}
SEEDS=${SEEDS:-0}
LIMIT=${LIMIT:-240}      # seconds per pair of FB15k-237 runs
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

step() { echo "== $*"; local t0=$(date +%s%N); "$@"; local rc=$?; echo "== rc $rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; return $rc; }

step timeout 120 $py scripts/benchmarks/bench_fedcqa.py quality --variants umls_fedcqa_gqe --seeds 0 \
    --out "$RUNS/umls_smoke" \
    --json-out "$OUT/umls_smoke.json" federated.rounds=2 federated.eval_every=2 > "$OUT/umls_smoke.log" 2>&1
rc=$?
grep -v -i warning "$OUT/umls_smoke.log" | tail -12
[[ $rc == 0 ]] || { echo "UMLS smoke failed: FB15k-237 runs skipped"; exit 1; }

common=(federated.rounds="$ROUNDS" task.steps_per_epoch="$STEPS" federated.eval_every="$EVAL"
        federated.patience=1000 task.loss=softmax task.cache_dir="$QCACHE" ${EXTRA:-})
config=configs/fedcqa/${PREFIX}_local_gqe.yaml
step timeout 300 $py -m lightning_fedkg.cli data stats --workers "${WORKERS:-4}" -c "$config" "${common[@]}" 2>&1 \
    | grep -v -i warning | grep -E "sampl|cross-graph  |client_|rc " | tail -12
for seed in $SEEDS; do
  for v in local fedcqa; do
    (step timeout "$LIMIT" $py scripts/benchmarks/bench_fedcqa.py quality --variants "${PREFIX}_${v}_gqe" \
        --seeds "$seed" --out "$RUNS/order" "${common[@]}" > "$OUT/${PREFIX}_${v}_seed$seed.log" 2>&1) &
  done
  wait
  for v in local fedcqa; do
    echo "## ${PREFIX}_${v} seed $seed"
    grep -E "round [0-9]+/|^${PREFIX}_${v}_gqe |== rc" "$OUT/${PREFIX}_${v}_seed$seed.log" | tail -${TAIL:-30}
    metrics=$RUNS/order/${PREFIX}_${v}_gqe/seed$seed/metrics.json
    [[ -f $metrics ]] && cp "$metrics" "$OUT/${PREFIX}_${v}_seed${seed}_metrics.json"
  done
done
