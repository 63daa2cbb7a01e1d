#!/usr/bin/env bash
# Versions of the package side by side on one GPU, in one sitting: the same benchmarks run
# from each version's own tree, alternating, so a change is measured against the code before
# it on the same card. Run after scripts/gpu/gpu_capture.sh has installed the wheel and unpacked
# the data (PARTS="" does only that).
#
#   VERSIONS=".gpu/v_old .gpu/v_adam ." OUT=$OUT bash scripts/gpu/gpu_ab.sh
#
# Each VERSIONS entry is a folder holding lightning_fedkg/, scripts/ and configs/ (for example
# `git archive <commit> lightning_fedkg scripts configs | tar -x -C .gpu/v_old`); "." is the
# checkout. Results: $OUT/ab_<name>_<bench>.json and the log on stdout.
set -u
OUT=$(realpath -m "${OUT:-runs/gpu_ab}")
VERSIONS=${VERSIONS:-.}
BENCHES=${BENCHES:-"fedlu fede"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ln -sfn "$(realpath ../shared)" .gpu/shared 2>/dev/null  # the trees under .gpu/ see ../shared too

# the path of benchmark $1 in the version's tree: one archived before scripts/ was sorted into
# folders has its benchmarks in scripts/ itself
bench_path() { if [[ -f scripts/benchmarks/$1 ]]; then echo "scripts/benchmarks/$1"; else echo "scripts/$1"; fi; }
step() { echo "== $*"; local t0=$(date +%s%N); "$@"; echo "== rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
for bench in $BENCHES; do
  for version in $VERSIONS; do
    name=$(basename "$(realpath "$version")")
    [[ $version == . ]] && name=checkout
    echo "#### $bench, version $name"
    case $bench in
      fedlu) (cd "$version" && export PYTHONPATH=$PWD:/tmp/site && step timeout 170 python3 "$(bench_path bench_fedlu.py)" --rounds 2 \
                --threads 1 --strategies fedlu --json-out "$OUT/ab_${name}_fedlu.json" 2>&1 | grep -v Warning | tail -12) ;;
      fede) (cd "$version" && export PYTHONPATH=$PWD:/tmp/site && step timeout 150 python3 "$(bench_path bench_fede.py)" --rounds 2 \
                --eval-every 2 --threads 1 --json-out "$OUT/ab_${name}_fede.json" 2>&1 | grep -v Warning | tail -12) ;;
      step) (cd "$version" && export PYTHONPATH=$PWD:/tmp/site && step timeout 60 python3 "$(bench_path bench_step.py)" \
                -c configs/fedlu/fb15k237_r10_fedlu.yaml --client 4 --threads 1 --batches 200 \
                --json-out "$OUT/ab_${name}_step_fedlu.json" 2>&1 | grep -v Warning | tail -9) ;;
      diag) (cd "$version" && export PYTHONPATH=$PWD:/tmp/site TORCH_LOGS=recompiles,graph_breaks && step timeout 60 \
                python3 "$(bench_path bench_step.py)" -c configs/fedlu/fb15k237_r10_fedlu.yaml --client 4 --threads 1 \
                --batches 50 --json-out "$OUT/ab_${name}_diag.json" >"$OUT/ab_${name}_diag.log" 2>&1; \
                grep -v Warning "$OUT/ab_${name}_diag.log" | tail -60; cat "$OUT/ab_${name}_diag.json") ;;
      profile) (cd "$version" && export PYTHONPATH=$PWD:/tmp/site && step timeout 60 python3 "$(bench_path bench_step.py)" \
                -c configs/fedlu/fb15k237_r10_fedlu.yaml --client 4 --threads 1 --batches 100 --profile \
                trainer.capture=false 2>&1 | grep -v Warning | tail -45) ;;
    esac
  done
done
