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

step() { echo "== $*"; local t0=$(date +%s.%N); "$@"; echo "== rc $? in $(echo "$(date +%s.%N) - $t0" | bc) s"; }

step timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_captured_step.py -k cuda 2>&1 | tail -5
for capture in null false; do
  step timeout 150 python3 scripts/bench_fede.py --rounds 2 --eval-every 2 --threads 1 \
      --json-out "$OUT/fede_capture-$capture.json" trainer.capture=$capture 2>&1 | grep -v Warning | tail -8
done
for capture in null false; do
  step timeout 170 python3 scripts/bench_fedlu.py --rounds 2 --threads 1 --strategies fedlu \
      --json-out "$OUT/fedlu_capture-$capture.json" trainer.capture=$capture 2>&1 | grep -v Warning | tail -8
done
step timeout 120 python3 scripts/bench_fede.py --rounds 2 --eval-every 2 --threads 1 \
    --json-out "$OUT/fede_capture-null_bf16.json" trainer.capture=null trainer.precision=bf16-mixed 2>&1 | grep -v Warning | tail -8
for capture in null false; do
  step timeout 90 python3 scripts/bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 0 --threads 1 \
      --batches 200 trainer.capture=$capture --json-out "$OUT/step_fede_capture-$capture.json" 2>&1 | grep -v Warning | tail -4
done
