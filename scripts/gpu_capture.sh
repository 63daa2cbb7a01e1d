#!/usr/bin/env bash
# Recorded training steps (trainer.capture) against the eager step on one GPU, in one sitting:
# the CUDA tests, ms per batch of one client (Party.fit), and seconds per FedE round on
# FB15k-237-Fed3 and per FedLU round on FB15k-237-R10 with the MRR after 2 rounds, fp32 and
# bf16-mixed. Results go to $OUT (default runs/gpu_capture).
#
# Beside the checkout it needs, in .gpu/: data.tgz (FB15k-237-Fed3 and FB15k-237-R10 folders,
# unpacked to ../shared/data where the configs look), this package as a wheel (its entry
# points) and any wheel the machine lacks (omegaconf 2.4). See docs/performance.md.
set -u
OUT=${OUT:-runs/gpu_capture}
mkdir -p "$OUT" ../shared/data
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site || exit 1
tar xzf .gpu/data.tgz -C ../shared/data || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, torch.cuda.get_device_name())"

step() { echo "== $*"; local t0=$(date +%s%N); "$@"; echo "== rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
PARTS=${PARTS-"tests rounds bf16 steps k8"}  # e.g. PARTS="tests k8" CAPTURES=null; PARTS="" only installs
has() { [[ " $PARTS " == *" $1 "* ]]; }

has tests && step timeout 60 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_captured_step.py -k cuda 2>&1 | tail -30
if has rounds; then
  for capture in ${CAPTURES:-null false}; do
    step timeout 150 python3 scripts/bench_fede.py --rounds 2 --eval-every 2 --threads 1 \
        --json-out "$OUT/fede_capture-$capture.json" trainer.capture=$capture 2>&1 | grep -v Warning | tail -8
  done
  for capture in ${CAPTURES:-null false}; do
    step timeout 170 python3 scripts/bench_fedlu.py --rounds 2 --threads 1 --strategies fedlu \
        --json-out "$OUT/fedlu_capture-$capture.json" trainer.capture=$capture 2>&1 | grep -v Warning | tail -8
  done
fi
has bf16 && step timeout 120 python3 scripts/bench_fede.py --rounds 2 --eval-every 2 --threads 1 \
    --json-out "$OUT/fede_capture-null_bf16.json" trainer.capture=null trainer.precision=bf16-mixed 2>&1 | grep -v Warning | tail -8
if has steps; then  # ms per batch of one client, where it goes, and operators dispatched per batch
  for capture in null false; do
    step timeout 60 python3 scripts/bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 0 --threads 1 \
        --batches 200 trainer.capture=$capture --json-out "$OUT/step_fede_capture-$capture.json" 2>&1 | grep -v Warning | tail -9
    step timeout 60 python3 scripts/bench_step.py -c configs/fedlu/fb15k237_r10_fedlu.yaml --client 4 --threads 1 \
        --batches 200 trainer.capture=$capture --json-out "$OUT/step_fedlu_capture-$capture.json" 2>&1 | grep -v Warning | tail -9
  done
fi
if has k8; then  # eight batches per Lightning step: the same updates in the same order
  run_k8() {  # name, seconds, script, overrides...
    local name=$1 limit=$2 script=$3; shift 3
    step timeout "$limit" python3 "scripts/$script" --rounds 2 --threads 1 --json-out "$OUT/$name.json" \
        "$@" train.batches_per_step=8 2>&1 | grep -v Warning | tail -8
  }
  run_k8 fede_capture-null_k8 80 bench_fede.py --eval-every 2 trainer.capture=null
  run_k8 fedlu_capture-null_k8 110 bench_fedlu.py --strategies fedlu trainer.capture=null
  run_k8 fedlu_capture-null_k8_fixed 110 bench_fedlu.py --strategies fedlu trainer.capture=null train.fixed_negatives=true
  run_k8 fede_capture-false_k8 80 bench_fede.py --eval-every 2 trainer.capture=false
  run_k8 fedlu_capture-false_k8 120 bench_fedlu.py --strategies fedlu trainer.capture=false
fi
# not in the default PARTS: the step's pieces in candidate forms (bench_kernels.py)
has kernels && step timeout 90 python3 scripts/bench_kernels.py --json-out "$OUT/kernels.json" 2>&1 | grep -v Warning | tail -12
if has profile; then  # not in the default PARTS: which kernels the recorded step spends its GPU time in
  step timeout 60 python3 scripts/bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 0 --threads 1 \
      --batches 100 --profile 2>&1 | grep -v Warning | tail -40
  step timeout 60 python3 scripts/bench_step.py -c configs/fedlu/fb15k237_r10_fedlu.yaml --client 4 --threads 1 \
      --batches 100 --profile 2>&1 | grep -v Warning | tail -40
fi
