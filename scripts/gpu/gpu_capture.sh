#!/usr/bin/env bash
# Recorded training steps (trainer.capture) against the eager step on one GPU, in one sitting:
# the CUDA tests, ms per batch of one client (Party.fit), and seconds per FedE round on
# FB15k-237-Fed3 and per FedLU round on FB15k-237-R10 with the MRR after 2 rounds, fp32 and
# bf16-mixed. Results go to $OUT (default runs/gpu_capture).
#
# Beside the checkout it needs, in the ignored folder .gpu/: data.tgz (FB15k-237-Fed3 and
# FB15k-237-R10 folders, 6.5 MB, unpacked to ../shared/data where the configs look), this
# package as a wheel (`pip wheel --no-deps -w .gpu .`, for its entry points) and any wheel the
# GPU image lacks (`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux_2_28_x86_64 ...`): omegaconf 2.4; for secure aggregation cryptography,
# pycryptodome, cffi, pycparser; for DP's CUDA test dp-accounting 0.6.0 and dm-tree 0.1.10.
# PARTS official also needs the official FedE code in .gpu/FedE (its six .py files at commit
# 46f5993) and its pickle gzipped as .gpu/fede.pkl.gz (written by bench_official_fede.py
# --work-dir). PARTS official_fedlu (alone: it needs most of a 600 s call) runs our FedLU
# rounds, then the official FedLU on the same card until its first round has trained: it needs
# the official Code/ folder in .gpu/FedLU (commit 43d8cb5: `git archive 43d8cb5 Code`) and the
# wheels of Levenshtein and rapidfuzz in .gpu/fedlu_wheels/. scripts/gpu/gpu_ab.sh runs the same
# benchmarks from several versions' trees (`git archive <commit> lightning_fedkg scripts
# configs` unpacked under .gpu/); scripts/gpu/gpu_fedcqa.sh uses the same folder. Figures:
# docs/results/speed.md.
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
# (also: official, official_fedlu, kernels, profile)
has() { [[ " $PARTS " == *" $1 "* ]]; }

if has tests; then  # the whole output in $OUT/tests.log; torch's DEBUG lines and the warnings summary once
  # filled a `tail -30` and hid a failure's traceback, so the console gets neither
  step timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings --tb=short -k "cuda or gpu" \
      tests/test_captured_step.py tests/test_device_batches.py tests/test_fedcqa.py tests/test_secure_aggregation.py \
      tests/test_fused_l1.py tests/test_resident.py 2>&1 | tee "$OUT/tests.log" | grep -v DEBUG | tail -80
fi
if has rounds; then
  for capture in ${CAPTURES:-null false}; do
    step timeout 150 python3 scripts/benchmarks/bench_fede.py --rounds 2 --eval-every 2 --threads 1 \
        --json-out "$OUT/fede_capture-$capture.json" trainer.capture=$capture 2>&1 | grep -v Warning | tail -8
  done
  for capture in ${CAPTURES:-null false}; do
    step timeout 170 python3 scripts/benchmarks/bench_fedlu.py --rounds 2 --threads 1 --strategies fedlu \
        --json-out "$OUT/fedlu_capture-$capture.json" trainer.capture=$capture 2>&1 | grep -v Warning | tail -8
  done
fi
has bf16 && step timeout 120 python3 scripts/benchmarks/bench_fede.py --rounds 2 --eval-every 2 --threads 1 \
    --json-out "$OUT/fede_capture-null_bf16.json" trainer.capture=null trainer.precision=bf16-mixed 2>&1 | grep -v Warning | tail -8
if has steps; then  # ms per batch of one client, where it goes, and operators dispatched per batch
  for capture in null false; do
    step timeout 60 python3 scripts/benchmarks/bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 0 \
        --threads 1 \
        --batches 200 trainer.capture=$capture --json-out "$OUT/step_fede_capture-$capture.json" 2>&1 | grep -v Warning | tail -9
    step timeout 60 python3 scripts/benchmarks/bench_step.py -c configs/fedlu/fb15k237_r10_fedlu.yaml --client 4 \
        --threads 1 \
        --batches 200 trainer.capture=$capture --json-out "$OUT/step_fedlu_capture-$capture.json" 2>&1 | grep -v Warning | tail -9
  done
fi
if has k8; then  # eight batches per Lightning step: the same updates in the same order
  run_k8() {  # name, seconds, script, overrides...
    local name=$1 limit=$2 script=$3; shift 3
    step timeout "$limit" python3 "scripts/benchmarks/$script" --rounds 2 --threads 1 --json-out "$OUT/$name.json" \
        "$@" train.batches_per_step=8 2>&1 | grep -v Warning | tail -8
  }
  run_k8 fede_capture-null_k8 80 bench_fede.py --eval-every 2 trainer.capture=null
  run_k8 fedlu_capture-null_k8 110 bench_fedlu.py --strategies fedlu trainer.capture=null
  run_k8 fedlu_capture-null_k8_fixed 110 bench_fedlu.py --strategies fedlu trainer.capture=null train.fixed_negatives=true
  run_k8 fede_capture-false_k8 80 bench_fede.py --eval-every 2 trainer.capture=false
  run_k8 fedlu_capture-false_k8 120 bench_fedlu.py --strategies fedlu trainer.capture=false
fi
# not in the default PARTS: the official FedE code (AnselCmy/FedE at 46f5993, in .gpu/FedE) on
# this card, one round of 40 batches per client (bench_official_fede.py's bounded mode), with
# the official pickle regenerated by bench_official_fede.py (--work-dir) and carried gzipped
if has official; then
  gunzip -c .gpu/fede.pkl.gz > /tmp/fede.pkl || exit 1
  step timeout 150 python3 scripts/reference/bench_official_fede.py --fede-dir .gpu/FedE --pkl /tmp/fede.pkl \
      --mode bounded --batches 40 --eval-limit 0 --threads 1 --device cuda --json-out "$OUT/official_fede.json" 2>&1 \
      | grep -v Warning | tail -14
fi
# not in the default PARTS: our FedLU rounds, then the official FedLU code (nju-websoft/FedLU at
# 43d8cb5, Code/ in .gpu/FedLU; its Levenshtein and rapidfuzz wheels in .gpu/fedlu_wheels) on the
# same card, stopped once its first round has trained. Its setup (pre-drawing every batch) and
# the test it runs before training took 90-112 s and 237 s on an H100, so the whole part needs
# most of a 600 s call (at most 100 s for ours, 470 s for theirs): run it alone
# (PARTS=official_fedlu). See docs/results/speed.md.
if has official_fedlu; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fedlu_site \
      .gpu/fedlu_wheels/*.whl || exit 1
  step timeout 100 python3 scripts/benchmarks/bench_fedlu.py --rounds 2 --threads 1 --strategies fedlu \
      --json-out "$OUT/fedlu_capture-null.json" trainer.capture=null 2>&1 | grep -v Warning | tail -8
  PYTHONPATH=$PYTHONPATH:/tmp/fedlu_site step timeout 470 python3 scripts/reference/bench_official_fedlu.py \
      --fedlu-dir .gpu/FedLU --data ../shared/data/FB15k-237-R10 --python python3 --rounds 1 --threads 1 \
      --pin none --time-limit ${FEDLU_LIMIT:-450} --out "$OUT/official_fedlu.json" --log "$OUT/official_fedlu.log" \
      --extra --cuda --test_batch_size 256 2>&1 | grep -v Warning | tail -20
fi
# not in the default PARTS: the step's pieces in candidate forms (bench_kernels.py)
has kernels && step timeout 90 python3 scripts/benchmarks/bench_kernels.py --json-out "$OUT/kernels.json" 2>&1 | grep -v Warning | tail -12
if has profile; then  # not in the default PARTS: which kernels the recorded step spends its GPU time in
  step timeout 60 python3 scripts/benchmarks/bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 0 \
      --threads 1 --batches 100 --profile 2>&1 | grep -v Warning | tail -40
  step timeout 60 python3 scripts/benchmarks/bench_step.py -c configs/fedlu/fb15k237_r10_fedlu.yaml --client 4 \
      --threads 1 --batches 100 --profile 2>&1 | grep -v Warning | tail -40
fi
