#!/usr/bin/env python
"""Regenerate the published results, and render the pages' tables from what it wrote.

    python scripts/reproduce.py run --tier quick          # the UMLS quick starts, 5 seeds (~30 min, 2 cores)
    python scripts/reproduce.py render                    # rewrite every marked block from the JSONs
    python scripts/reproduce.py render --check            # exit 1 where a page differs (a test runs this)
    python scripts/reproduce.py tiers                     # what each tier runs and costs (larger tiers too)

``run`` runs each experiment of a tier as a user does (``fedkg fit -c CONFIG seed=S`` in a
fresh process, the config's own settings), reads its ``metrics.json`` and keeps what it
printed; it writes ``docs/results/reproduce/<tier>.json`` with the commit, the commands, the
machine and the wall times, then renders. A run folder that holds a ``metrics.json`` is
reused (``--fresh`` runs it again). ``render`` replaces the text between
``<!-- reproduce:NAME -->`` and ``<!-- /reproduce:NAME -->`` in README.md and docs/**/*.md,
so no published number is typed: NAME is ``<tier>.<experiment>.<what>`` (:data:`FIELDS`, or
``wall``: seed 0's seconds), ``<tier>.diff.<a>.<b>`` (the difference of two means),
``<tier>.printed.<experiment>`` (the table seed 0 printed), ``<tier>.table``, or
``json:PATH#/pointer:FORMAT`` (a number of any results JSON, or the ratio of two: :func:`pointer`).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)
RESULTS = REPO / "docs" / "results" / "reproduce"
PAGES = ("README.md", "docs")

#: Each tier: what it runs, its seeds and cost. An experiment is ``name: (config, overrides)``.
TIERS = {
    "quick": {
        "about": "the UMLS quick starts as shipped, seeds 0-4: about 30 min on 2 cores",
        "seeds": [0, 1, 2, 3, 4],
        "experiments": {
            "umls_fede": ("configs/fede/umls_fede.yaml", []),
            "umls_fedr": ("configs/fedr/umls_fedr.yaml", []),
            "umls_single": ("configs/single/umls_single.yaml", []),
            "umls_entire": ("configs/entire/umls_entire.yaml", []),
            "umls_fedlu": ("configs/fedlu/umls_fedlu.yaml", []),
            "umls_fedprox": ("configs/fedprox/umls_fedprox.yaml", []),
            "umls_fedec": ("configs/fedec/umls_fedec.yaml", []),
            "umls_fedcqa_gqe": ("configs/fedcqa/umls_fedcqa_gqe.yaml", []),
            "umls_local_gqe": ("configs/fedcqa/umls_local_gqe.yaml", []),
        },
    },
}

#: The larger tiers: the benchmarks behind the other published figures, hours on 2 cores, so
#: ``run`` does not start them: ``tiers`` lists each one's commands (run them as written), the
#: JSONs they rewrite (then ``render``), the configs they read (a test parses each) and the
#: cost, summed from the wall seconds the JSONs they rewrite recorded (``cost``: pointers,
#: everything they gather added up; ``None`` where a JSON kept no time).
BENCH = "python scripts/benchmarks/"
SAMEDAY = "docs/results/scale/sameday"  # the scale_sameday tier's folder
LARGER_TIERS = {
    "fb15k237": {
        "about": "FedE on FB15k-237-Fed3 (FedE's hyperparameters), one round, twice: "
                 "docs/results/fede.md's first table and README's FedE ratio (the official code's side needs its checkout)",
        "configs": ["configs/fede/fb15k237_fed3_fede.yaml"],
        "commands": [f"{BENCH}bench_fede.py --rounds 1 --threads 2 --json-out docs/results/fede/fb15k237_fed3_round_{i}.json"
                     for i in (1, 2)],
        "writes": ["docs/results/fede/fb15k237_fed3_round_1.json", "docs/results/fede/fb15k237_fed3_round_2.json"],
        "cost": [f"docs/results/fede/fb15k237_fed3_round_{i}.json#/rounds/*/{k}" for i in (1, 2)
                 for k in ("train_s", "eval_s")],
    },
    "fkge": {
        "about": "FKGE's UMLS quick start beside its random-translation and mode: none controls, "
                 "5 seeds: README's FKGE headline, docs/results/fkge.md's first table",
        "configs": ["configs/fkge/umls_fkge.yaml", "configs/fkge/umls_fkge_random.yaml"],
        "commands": [f"{BENCH}bench_fkge.py --config configs/fkge/umls_fkge.yaml --seeds 0,1,2,3,4 "
                     "--variants fkge,random_fkge,control_fkge --runs-dir runs/bench_fkge_umls_random "
                     "--json-out docs/results/fkge/bench_fkge_umls_random.json"],
        "writes": ["docs/results/fkge/bench_fkge_umls_random.json"],
        "cost": ["docs/results/fkge/bench_fkge_umls_random.json#/runs/*/*/wall_seconds"],
    },
    "fkge_fb15k237": {
        "about": "FKGE on FB15k-237 (reduced: 1 handshake per KG, 5 update epochs), supervised release "
                 "beside its controls, seeds 0-2 (seed 2 with the exact release), after the pre-training of "
                 "bench_fkge_fb15k237_controls (its command with --pretrain makes it), merged into one report",
        "configs": ["configs/fkge/fb15k237_fkge.yaml"],
        "commands": [f"{BENCH}bench_fkge.py --config configs/fkge/fb15k237_fkge.yaml --pretrained-from "
                     f"runs/bench_fkge_fb15k237_controls/pretrain --reuse --seeds {seeds} --runs-dir runs/bench_fkge_fb15k237_u5 "
                     f"--variants sup4_average,random_sup4_average,control_sup4_average{exact} "
                     f"--json-out docs/results/fkge/bench_fkge_fb15k237_controls_{out}.json "
                     "federated.fkge.holdout_fraction=0.2 federated.fkge.handshakes_per_kg=1"
                     for seeds, exact, out in (("0,1", "", "u5"), ("2", ",sup_exact_average", "u5_seed2"))] + [
            f"{BENCH}bench_fkge.py --merge docs/results/fkge/bench_fkge_fb15k237_controls_u5.json "
            "docs/results/fkge/bench_fkge_fb15k237_controls_u5_seed2.json "
            "--json-out docs/results/fkge/bench_fkge_fb15k237_controls_u5_seeds0-2.json"],
        "writes": [f"docs/results/fkge/bench_fkge_fb15k237_controls_{out}.json"
                   for out in ("u5", "u5_seed2", "u5_seeds0-2")],
        "cost": ["docs/results/fkge/bench_fkge_fb15k237_controls_u5_seeds0-2.json#/runs/*/*/wall_seconds"],
    },
    "fkge_nell995": {
        "about": "FKGE on NELL-995 in 3 sources: converged pre-training, 1 handshake per KG, 5 update epochs, "
                 "seeds 0-2: the supervised release beside its two controls and the exact release "
                 "(docs/results/fkge.md)",
        "configs": ["configs/fkge/fb15k237_fkge.yaml"],
        "commands": [f"{BENCH}bench_fkge.py --config configs/fkge/fb15k237_fkge.yaml --pretrain --runs-dir "
                     "runs/bench_fkge_nell995_controls --reuse --seeds 0,1,2 --variants "
                     "sup4_average,random_sup4_average,control_sup4_average,sup_exact_average "
                     "--json-out docs/results/fkge/bench_fkge_nell995_controls.json data.name=../shared/data/NELL-995 "
                     "name=nell995_fkge federated.fkge.holdout_fraction=0.2 federated.fkge.handshakes_per_kg=1"],
        "writes": ["docs/results/fkge/bench_fkge_nell995_controls.json"],
        "cost": ["docs/results/fkge/bench_fkge_nell995_controls.json#/runs/*/*/wall_seconds",
                 "docs/results/fkge/bench_fkge_nell995_controls.json#/pretrain/*/seconds"],
    },
    "fkge_fb15k237_full": {
        "about": "FKGE on FB15k-237 in 3 sources, the full schedule: converged pre-training (--pretrain), 3 handshakes "
                 "hosted per KG x 5 update epochs, seeds 0-4, the supervised release beside its two controls and the "
                 "exact release; seeds run in four calls on one runs folder (s3 and s4 at once) and merged "
                 "(docs/results/fkge.md)",
        "configs": ["configs/fkge/fb15k237_fkge.yaml"],
        "commands": [f"{BENCH}bench_fkge.py --config configs/fkge/fb15k237_fkge.yaml --pretrain --runs-dir "
                     f"runs/bench_fkge_fb15k237_full --reuse --seeds {seeds} --threads 1 --variants "
                     "sup4_average,random_sup4_average,control_sup4_average,sup_exact_average --json-out "
                     f"docs/results/fkge/bench_fkge_fb15k237_full_{part}.json federated.fkge.holdout_fraction=0.2"
                     for seeds, part in (("0,1", "s01"), ("2", "s2"), ("3", "s3"), ("4", "s4"))] + [
            f"{BENCH}bench_fkge.py --merge "
            + " ".join(f"docs/results/fkge/bench_fkge_fb15k237_full_{part}.json" for part in ("s01", "s2", "s3", "s4"))
            + " --json-out docs/results/fkge/bench_fkge_fb15k237_full.json"],
        "writes": [f"docs/results/fkge/bench_fkge_fb15k237_full{part}.json" for part in ("_s01", "_s2", "_s3", "_s4", "")],
        "cost": ["docs/results/fkge/bench_fkge_fb15k237_full.json#/runs/*/*/wall_seconds",
                 "docs/results/fkge/bench_fkge_fb15k237_full.json#/pretrain/0/*/seconds"],
    },
    "fkge_nell995_full": {
        "about": "FKGE on NELL-995 in 3 sources, the issue's full schedule: converged pre-training (that of "
                 "fkge_nell995), 3 handshakes hosted per KG x 5 update epochs, seeds 0-2, the supervised release "
                 "beside its two controls and the exact release, seeds run in two calls and merged "
                 "(docs/results/fkge.md)",
        "configs": ["configs/fkge/fb15k237_fkge.yaml"],
        "commands": [f"{BENCH}bench_fkge.py --config configs/fkge/fb15k237_fkge.yaml --pretrained-from "
                     "runs/bench_fkge_nell995_controls/pretrain --runs-dir runs/bench_fkge_nell995_full --reuse "
                     f"--seeds {seeds} --threads 1 --variants sup4_average,random_sup4_average,control_sup4_average,"
                     f"sup_exact_average --json-out docs/results/fkge/bench_fkge_nell995_full_{part}.json "
                     "data.name=../shared/data/NELL-995 name=nell995_fkge federated.fkge.holdout_fraction=0.2"
                     for seeds, part in (("0,1", "a"), ("2", "b"))] + [
            f"{BENCH}bench_fkge.py --merge docs/results/fkge/bench_fkge_nell995_full_a.json "
            "docs/results/fkge/bench_fkge_nell995_full_b.json --json-out docs/results/fkge/bench_fkge_nell995_full.json"],
        "writes": [f"docs/results/fkge/bench_fkge_nell995_full{part}.json" for part in ("_a", "_b", "")],
        "cost": ["docs/results/fkge/bench_fkge_nell995_full.json#/runs/*/*/wall_seconds"],
    },
    "fedlu_r3": {
        "about": "FedLU on UMLS-R3, 26 rounds, seeds 0-4, defaults and parity, beside the official code "
                 "(3 runs, needs its checkout: docs/results/fedlu.md): README's FedLU headline",
        "configs": [],  # bench_fedlu.py builds FedLU's config from --data and overrides
        "commands": ["python scripts/tools/make_fedlu_split.py --kg umls --clients 3 --seed 12345 --out data/umls-R3"] + [
            f"{BENCH}bench_fedlu.py --data data/umls-R3 --rounds 26 --threads 1 --strategies fedlu --json-out "
            f"docs/results/fedlu/umls_r3/ours{tag}_s{seed}.json trainer.accelerator=cpu train.lr=0.001 "
            f"federated.best=client{extra} seed={seed}"
            for tag, extra in (("", ""), ("_parity", " train.fixed_negatives=true train.negative_mode=per_triple "
                                            "train.subsampling=true federated.fedlu.avatar_eval=before_aggregation"))
            for seed in range(5)] + [
            f"python scripts/reference/compare_fedlu.py --ours docs/results/fedlu/umls_r3/ours{tag}_s?.json "
            f"--official docs/results/fedlu/umls_r3/official_h*.json --json-out docs/results/fedlu/umls_r3/compare_{name}.json"
            for tag, name in (("", "ours"), ("_parity", "parity"))],
        "writes": ["docs/results/fedlu/umls_r3/compare_ours.json", "docs/results/fedlu/umls_r3/compare_parity.json"],
        "cost": [f"docs/results/fedlu/umls_r3/ours{tag}_s{seed}.json#/results/*/rounds/*/seconds"
                 for tag in ("", "_parity") for seed in range(5)],
    },
    "unlearn": {
        "about": "FedLU unlearning of 5% of UMLS from converged sources beside an equal-budget retrain, "
                 "seeds 0-4: README's unlearning figures, docs/results/fedlu.md",
        "configs": ["configs/fedlu/umls_unlearn.yaml"],
        "commands": [f"{BENCH}bench_unlearn_seeds.py -c configs/fedlu/umls_unlearn.yaml --seeds 0 1 2 3 4 "
                     "--sources runs/unl/sources --out runs/unl/ours --json docs/results/fedlu/unlearn/umls_ours.json "
                     "trainer.threads=1"],
        "writes": ["docs/results/fedlu/unlearn/umls_ours.json"],
        "cost": ["docs/results/fedlu/unlearn/umls_ours.json#/summary/seconds/*/per_seed"],
    },
    "privacy": {
        "about": "the audit's reconstruction attack on UMLS FedE, plain, secure, hidden, DP, seeds 0-4: "
                 "README's privacy figures, docs/results/privacy.md",
        "configs": ["configs/fede/umls_fede.yaml"],
        "commands": [f"{BENCH}bench_privacy.py --seeds 0 1 2 3 4 --threads 1 --out runs/privacy_umls "
                     "--json-out docs/results/privacy/umls_audit.json"],
        "writes": ["docs/results/privacy/umls_audit.json"],
        "cost": None,
        "cost_note": "its JSON keeps no wall time: 10 variants x 5 seeds of a ~30 s UMLS run, each with its audit",
    },
    "flower": {
        "about": "a FedE round of FB15k-237-Fed3 in process, simulated and deployed under Flower: "
                 "README's Flower overhead, docs/results/flower.md",
        "configs": ["configs/fede/fb15k237_fed3_fede.yaml"],
        "commands": [f"{BENCH}bench_flower.py -c configs/fede/fb15k237_fed3_fede.yaml --rounds 1 --modes {mode}"
                     for mode in ("local", "simulation", "deployment")] + [
            f"{BENCH}bench_flower.py -c configs/fede/fb15k237_fed3_fede.yaml --rounds 1 --modes deployment "
            "--work runs/bench_flower_control federated.flower.client_workers=false"],
        "writes": ["docs/results/flower/fb15k237_fed3_overhead.json"],
        "cost": ["docs/results/flower/fb15k237_fed3_overhead.json#/results/*/wall_seconds"],
    },
    "fedcqa_fb15k237": {
        "about": "FedCQA and Local on FB15k-237 in 3 and 5 clients, 4,000 steps per client, width 32, "
                 "seeds 0-2, retested on the paper's test-set sizes: README's FedCQA figures, docs/results/fedcqa.md",
        "configs": [f"configs/fedcqa/fb15k237_fed{n}_{v}_gqe.yaml" for n in (3, 5) for v in ("local", "fedcqa")],
        "commands": ['C="task.cache_dir=runs/qcache task.loss=softmax model.dim=32 train.lr=0.0125 '
                     'federated.eval_every=5 federated.patience=100 train.reset_optimizer=false"; '
                     'VARIANTS="local fedcqa" SEEDS="0 1 2" JSON=docs/results/fedcqa/'
                     'fb15k237_fed3_softmax_dim32_4000steps_persistent_adamw.json EXTRA="$C" '
                     'scripts/benchmarks/fedcqa_fb15k237_order.sh 80 50 runs/fedcqa_fb_sm32_4000_persist',
                     f"{BENCH}bench_fedcqa.py retest --variants fb15k237_fed3_local_gqe fb15k237_fed3_fedcqa_gqe "
                     "--seeds 0 1 2 --out runs/fedcqa_fb_sm32_4000_persist --tag paper_sizes --json-out "
                     "docs/results/fedcqa/fb15k237_fed3_softmax_dim32_4000steps_paper_test_sizes.json "
                     "task.eval_per_type=5000 task.cross_per_type=5000",
                     "# 5 clients likewise (CLIENTS=5): docs/results/fedcqa.md lists each JSON"],
        "writes": ["docs/results/fedcqa/fb15k237_fed3_softmax_dim32_4000steps_paper_test_sizes.json",
                   "docs/results/fedcqa/fb15k237_fed5_softmax_dim32_4000steps_seed0_again_paper_test_sizes.json",
                   "docs/results/fedcqa/fb15k237_fed5_softmax_dim32_4000steps_seeds1-2_paper_test_sizes.json"],
        "cost": ["docs/results/fedcqa/fb15k237_fed3_softmax_dim32_4000steps_persistent_adamw.json#/variants/*/per_seed/*/seconds",
                 "docs/results/fedcqa/fb15k237_fed5_softmax_dim32_4000steps_seed0.json#/variants/*/per_seed/*/seconds",
                 "docs/results/fedcqa/fb15k237_fed5_softmax_dim32_4000steps_seeds1-2.json#/variants/*/per_seed/*/seconds"],
    },
    "scale_sameday": {
        "about": "FedE on FB15k-237-Fed3 beside the official code on one day, quiet, 2 threads, dim 256 and 128, "
                 "dense and row-sparse Adam, and where a batch goes: docs/results/scale.md (the official side needs "
                 "its checkout)",
        "configs": ["configs/fede/fb15k237_fed3_fede.yaml"],
        "commands": [
            f"python scripts/reference/bench_official_fede.py --fede-dir PATH/TO/FedE --mode bounded --batches 30 "
            f"--eval-limit 0 --threads 2 --dim 128 --json-out {SAMEDAY}/official_dim128_bounded.json",
            f"python scripts/reference/bench_official_fede.py --fede-dir PATH/TO/FedE --mode full --rounds 1 "
            f"--eval-limit 0 --threads 2 --json-out {SAMEDAY}/official_dim256_full.json"] + [
            f"{BENCH}bench_fede.py --rounds 2 --threads 2{dim} --json-out {SAMEDAY}/ours_dim{d}_{opt}.json "
            f"train.optimizer={opt}"
            for d, dim in ((128, " --dim 128"), (256, "")) for opt in ("adam", "sparse_adam")] + [
            f"{BENCH}bench_fede.py --rounds 2 --threads 2 --eval-every 0 --json-out "
            f"{SAMEDAY}/ours_dim256_sparse_adam_compile_cpu.json train.optimizer=sparse_adam trainer.compile_cpu=true"] + [
            f"{BENCH}bench_fede.py --rounds 2 --threads 2{dim} --json-out {SAMEDAY}/ours_dim{d}_{opt}_native_l1.json "
            f"train.optimizer={opt} trainer.native_l1=true"
            for d, dim, opt in ((256, "", "adam"), (256, "", "sparse_adam"), (128, " --dim 128", "sparse_adam"))] + [
            f"{BENCH}bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 1 --batches 60 --threads 2 "
            f"--profile --json-out {SAMEDAY}/step_dim256_sparse_adam{tag}.json train.optimizer=sparse_adam{extra}"
            for tag, extra in (("", ""), ("_compile_cpu", " trainer.compile_cpu=true"),
                               ("_native_l1", " trainer.native_l1=true"))],
        "writes": [f"{SAMEDAY}/{name}.json" for name in (
            "official_dim128_bounded", "official_dim256_full", "ours_dim128_adam", "ours_dim128_sparse_adam",
            "ours_dim256_adam", "ours_dim256_sparse_adam", "ours_dim256_sparse_adam_compile_cpu",
            "ours_dim256_adam_native_l1", "ours_dim256_sparse_adam_native_l1", "ours_dim128_sparse_adam_native_l1",
            "step_dim256_sparse_adam", "step_dim256_sparse_adam_compile_cpu", "step_dim256_sparse_adam_native_l1")],
        "cost": [f"{SAMEDAY}/official_dim256_full.json#/rounds/*/wall_s"] + [
            f"{SAMEDAY}/ours_dim{d}_{opt}.json#/rounds/*/{k}" for d in (128, 256) for opt in ("adam", "sparse_adam")
            for k in ("train_s", "eval_s")],
    },
    "scale_quality": {
        "about": "FedE on FB15k-237-Fed3 (FedE's hyperparameters), dense beside row-sparse Adam, 6 rounds, "
                 "seeds 0-2: docs/results/scale.md's quality table",
        "configs": ["configs/fede/fb15k237_fed3_fede.yaml"],
        "commands": [f"{BENCH}bench_fede.py --rounds 6 --eval-every 3 --threads 1 --json-out "
                     f"docs/results/scale/fb15k237_fed3_quality/{opt}_seed{seed}.json seed={seed} train.optimizer={opt}"
                     for seed in range(3) for opt in ("sparse_adam", "adam")],
        "writes": [f"docs/results/scale/fb15k237_fed3_quality/{opt}_seed{seed}.json"
                   for seed in range(3) for opt in ("sparse_adam", "adam")],
        "cost": [f"docs/results/scale/fb15k237_fed3_quality/{opt}_seed{seed}.json#/rounds/{k}"
                 for seed in range(3) for opt in ("sparse_adam", "adam")
                 for k in ("*/train_s", "2/eval_s", "5/eval_s")],  # evaluated after rounds 3 and 6
    },
}


def tier_cost_s(tier: dict) -> float | None:
    """What a larger tier took when its JSONs were written: every wall second they recorded."""
    if tier.get("cost") is None:
        return None

    def total(value):
        return sum(total(v) for v in value) if isinstance(value, list) else value

    return sum(total(_value(spec, {})) for spec in tier["cost"])


def _duration(seconds: float) -> str:
    return f"~{seconds / 3600:.1f} h" if seconds >= 5400 else f"~{seconds / 60:.0f} min"


#: What an inline block of one experiment renders: ``<tier>.<experiment>.<what>``.
FIELDS = {
    "mean": lambda s: _f(s["mrr_mean"]),
    "mean_std": lambda s: f"{_f(s['mrr_mean'])} ± {_f(s['mrr_std'])}",
    "seeds": lambda s: " ".join(_f(m) for m in s["mrrs"]),
    "cross_mean": lambda s: _f(s["cross_mrr_mean"], 3),
    "in_mean": lambda s: _f(s["mrr_mean"], 3),
}


def _f(x: float, digits: int = 4) -> str:
    """``.7410``: the pages' form of a metric in [0, 1]."""
    return f"{x:.{digits}f}".lstrip("0") if x >= 0 else f"-{-x:.{digits}f}".replace("-0", "-", 1)


# ---------------------------------------------------------------- running
def printed_table(stdout: str) -> str:
    """The results table a ``fedkg fit`` printed: from its summary line (``strategy=...``) to
    the line before ``metrics written to``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("strategy="))
    end = next(i for i, line in enumerate(lines) if line.startswith("metrics written to"))
    return "\n".join(lines[start:end])


def fit_command(config: str, seed: int, overrides: list[str], out: Path) -> list[str]:
    return ["fedkg", "fit", "-c", config, f"seed={seed}", *overrides, "--out", str(out)]


def run_one(config: str, seed: int, overrides: list[str], out: Path, fresh: bool) -> dict:
    """One ``fedkg fit`` (or its earlier result): metrics, what it printed, wall seconds."""
    record = out / "reproduce_run.json"
    if record.is_file() and (out / "metrics.json").is_file() and not fresh:
        print(f"    seed {seed}: reusing {out}", flush=True)
        return json.loads(record.read_text())
    if fresh and out.exists():
        import shutil

        shutil.rmtree(out)
    command = fit_command(config, seed, overrides, out)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "lightning_fedkg.cli", *command[1:]], cwd=REPO,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    result = {"seed": seed, "command": " ".join(command), "wall_s": round(wall, 1), "test": metrics["test"],
              "cross_graph": {k: v for k, v in (metrics.get("cross_graph") or {}).items() if not isinstance(v, dict)},
              "printed": printed_table(proc.stdout)}
    measure.write_json(record, result)
    print(f"    seed {seed}: test MRR {metrics['test']['mrr']:.4f} ({wall:.0f} s)", flush=True)
    return result


def summary(runs: list[dict]) -> dict:
    mrrs = [r["test"]["mrr"] for r in runs]
    out = {"mrrs": mrrs, "mrr_mean": statistics.mean(mrrs), "mrr_std": statistics.stdev(mrrs) if len(mrrs) > 1 else 0.0,
           "hits@10_mean": statistics.mean(r["test"]["hits@10"] for r in runs),
           "wall_s_mean": round(statistics.mean(r["wall_s"] for r in runs), 1)}
    cross = [r["cross_graph"]["mrr"] for r in runs if "mrr" in r.get("cross_graph", {})]
    if cross:
        out["cross_mrr_mean"] = statistics.mean(cross)
    return out


def run_tier(name: str, seeds: list[int] | None, out: Path, fresh: bool) -> Path:
    tier = TIERS[name]
    seeds = tier["seeds"] if seeds is None else seeds
    # the code that runs: read before the first run, as the checkout may move on during a tier
    started, clock, measured = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter(), measure.code_version(REPO)
    results = {}
    for exp, (config, overrides) in tier["experiments"].items():
        print(f"  {exp} ({config})", flush=True)
        runs = [run_one(config, s, overrides, out / name / exp / f"seed_{s}", fresh) for s in seeds]
        results[exp] = {"config": config, "overrides": overrides, "runs": runs, "summary": summary(runs)}
    payload = {"tier": name, "about": tier["about"], "command": f"python scripts/reproduce.py run --tier {name}",
               "code": measured, "machine": measure.machine(), "started": started,
               "wall_s": round(time.perf_counter() - clock, 1), "seeds": seeds, "results": results}
    path = measure.write_json(RESULTS / f"{name}.json", payload)
    print(f"wrote {path}")
    return path


# ---------------------------------------------------------------- rendering
BLOCK = re.compile(r"<!-- reproduce:(?P<name>[^>]+?) -->(?P<body>.*?)<!-- /reproduce:(?P=name) -->", re.S)


def load(tier: str) -> dict:
    path = RESULTS / f"{tier}.json"
    if not path.is_file():
        raise SystemExit(f"no {path}: run python scripts/reproduce.py run --tier {tier}")
    return json.loads(path.read_text())


def current_path(config: str) -> str:
    """Where a recorded config lives today: ``configs/MOVED.txt`` (``old<TAB>new`` lines) maps
    a path a results JSON recorded before configs moved to the same config's path now
    (scripts/tools/config_identity.py checks that a move left each config's resolved form as it was)."""
    moved = REPO / "configs" / "MOVED.txt"
    if moved.is_file():
        for line in moved.read_text(encoding="utf-8").splitlines():
            old, _, new = line.partition("\t")
            if new and old == config:
                return new
    return config


def table(data: dict) -> str:
    """The tier's summary table: per experiment mean ± std of test MRR, Hits@10, per seed."""
    rows = ["| experiment | test MRR (mean ± std) | Hits@10 | per seed | s per run |", "| --- | --- | --- | --- | ---: |"]
    for exp, res in data["results"].items():
        s = res["summary"]
        rows.append(f"| `{current_path(res['config'])}` | {FIELDS['mean_std'](s)} | {_f(s['hits@10_mean'])} | "
                    f"{FIELDS['seeds'](s)} | {s['wall_s_mean']:.0f} |")
    c = data["code"]
    rows.append("")
    rows.append(f"Seeds {', '.join(map(str, data['seeds']))}; `{data['command']}` at "
                f"{(c['commit'] or '?')[:10]}{' (with uncommitted changes)' if c['dirty'] else ''}, "
                f"{data['machine']['cpus']} CPUs, torch {data['machine']['torch']}, {data['started'][:10]}.")
    return "\n".join(rows)


#: Reductions a pointer may apply to the numbers a ``*`` gathers (over the innermost list).
REDUCERS = {
    "mean": statistics.mean, "min": min, "max": max, "sum": sum, "count": len,
    "positive": lambda xs: sum(1 for x in xs if x > 0),  # how many are above 0 ("5/5 seeds gain")
}
_OPERATOR = re.compile(r" ([/-]) ")


def pointer(spec: str, sources: dict[str, str] | None = None) -> str:
    """A number of any results JSON: ``PATH#/a/b/0:FORMAT`` (a JSON pointer into the file at
    ``PATH``, relative to the repository; segments percent-encoded where a key holds a space,
    ``-`` or ``:``). A ``*`` segment gathers every item (of a list or a dict's values);
    ``mean(...)`` (or ``min``, ``max``, ``sum``, ``count``, ``positive``: how many > 0)
    reduces the innermost gathered list (of one pointer, or of several with ``, `` between). ``A / B`` and ``A - B`` (spaces around) combine two
    such terms, or a term and a number typed from a source that has no JSON, element by
    element. ``PATH`` may be a name the page defines once, ``<!-- reproduce-source: NAME =
    PATH -->``, so that a block stays short (``sources``). The format spec follows the last ``:``: a Python spec (``.1f``, ``,d``, ``.1%``),
    ``m`` / ``m3`` for a metric written ``.7410`` / ``.741``, ``+m`` / ``+m3`` the same signed
    (``+.061``, ``−.017``); default ``.1f`` for a ratio, ``g`` otherwise. A gathered list
    renders space-separated."""
    body, fmt = spec, None
    if ":" in spec.rsplit("#", 1)[-1]:
        body, fmt = spec.rsplit(":", 1)
    parts = _OPERATOR.split(body)
    value = _term(parts[0], sources or {})
    for op, term in zip(parts[1::2], parts[2::2]):
        value = _combine(value, _term(term, sources or {}), (lambda a, b: a / b) if op == "/" else (lambda a, b: a - b))
    if fmt is None:
        fmt = ".1f" if " / " in body else "g"
    return _format(value, fmt)


def _term(text: str, sources: dict[str, str]):
    text = text.strip()
    reducer = re.fullmatch(r"(\w+)\((.*)\)", text)
    if reducer:
        name, inner = reducer.groups()
        if name not in REDUCERS:
            raise ValueError(f"unknown reduction {name!r} (known: {', '.join(REDUCERS)})")
        # several pointers, ", " between them, are gathered into one list (seeds kept in two files)
        gathered = [_value(part, sources) for part in inner.split(", ")]
        return _reduce(REDUCERS[name], gathered[0] if len(gathered) == 1 else
                       [x for g in gathered for x in (g if isinstance(g, list) else [g])])
    if "#" not in text:
        return float(text)  # a number typed beside its source (a page's figure with no JSON)
    return _value(text, sources)


def _reduce(fn, value):
    if not isinstance(value, list):
        raise ValueError("a reduction needs a '*' in its pointer")
    return fn(value) if not any(isinstance(v, list) for v in value) else [_reduce(fn, v) for v in value]


def _combine(a, b, op):
    if isinstance(a, list) or isinstance(b, list):
        if isinstance(a, list) and isinstance(b, list) and len(a) != len(b):
            raise ValueError(f"lists of {len(a)} and {len(b)} numbers")
        a_items = a if isinstance(a, list) else [a] * len(b)
        b_items = b if isinstance(b, list) else [b] * len(a)
        return [_combine(x, y, op) for x, y in zip(a_items, b_items)]
    return op(a, b)


def _format(value, fmt: str) -> str:
    if isinstance(value, list):
        return " ".join(_format(v, fmt) for v in value)
    metric = re.fullmatch(r"(\+?)m(\d?)", fmt)
    if metric:
        sign, digits = metric.group(1), int(metric.group(2) or 4)
        text = _f(abs(value), digits)
        return (("+" if value >= 0 else "\u2212") if sign else ("-" if value < 0 else "")) + text
    return format(value, fmt)


def _value(spec: str, sources: dict[str, str]):
    """The number (or, under ``*``, the nested list of numbers) at ``PATH#/pointer``."""
    path, _, ptr = spec.partition("#")
    path = sources.get(path.strip(), path.strip())
    return _walk(json.loads((REPO / path).read_text()), [unquote(p) for p in ptr.split("/") if p])


def _walk(node, parts: list[str]):
    if not parts:  # a list of numbers is gathered as a '*' would
        return [_walk(item, []) for item in node] if isinstance(node, list) else float(node)
    head, rest = parts[0], parts[1:]
    if head == "*":
        return [_walk(item, rest) for item in (node if isinstance(node, list) else node.values())]
    return _walk(node[int(head)] if isinstance(node, list) else node[head], rest)


def render_block(name: str, sources: dict[str, str] | None = None) -> str:
    if name.startswith("json:"):
        return pointer(name[len("json:"):], sources)
    tier, _, rest = name.partition(".")
    data = load(tier)
    if rest == "table":
        return "\n" + table(data) + "\n"
    if rest.startswith("printed."):
        run = data["results"][rest.split(".", 1)[1]]["runs"][0]
        return f"\n```\n{run['printed']}\n```\n"
    if rest.startswith("diff."):  # the signed difference of two experiments' mean test MRR
        a, b = rest.split(".")[1:]
        d = data["results"][a]["summary"]["mrr_mean"] - data["results"][b]["summary"]["mrr_mean"]
        return ("+" if d >= 0 else "-") + _f(abs(d), 3)
    exp, what = rest.rsplit(".", 1)
    if what == "wall":  # seconds of seed 0's run
        return f"{data['results'][exp]['runs'][0]['wall_s']:.0f}"
    return FIELDS[what](data["results"][exp]["summary"])


SOURCE = re.compile(r"<!-- reproduce-source: *(?P<name>\S+) *= *(?P<path>\S+) *-->")


def render_text(text: str) -> str:
    sources = {m["name"]: m["path"] for m in SOURCE.finditer(text)}
    return BLOCK.sub(lambda m: f"<!-- reproduce:{m['name']} -->{render_block(m['name'], sources)}"
                               f"<!-- /reproduce:{m['name']} -->", text)


def pages() -> list[Path]:
    out = []
    for entry in PAGES:
        path = REPO / entry
        out += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return out


def render(check: bool) -> int:
    differ = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        if "<!-- reproduce:" not in text:
            continue
        new = render_text(text)
        if new != text:
            differ.append(page)
            if not check:
                page.write_text(new, encoding="utf-8")
    for page in differ:
        print(f"{'differs' if check else 'rendered'}: {page.relative_to(REPO)}")
    if check and differ:
        print("run python scripts/reproduce.py render", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a tier and write its JSON, then render")
    run.add_argument("--tier", required=True, choices=sorted(TIERS))
    run.add_argument("--seeds", type=int, nargs="+", help="seeds (default: the tier's)")
    run.add_argument("--out", default="runs/reproduce", help="root of the run folders (default: %(default)s)")
    run.add_argument("--fresh", action="store_true", help="run again what a run folder already holds")
    check = sub.add_parser("render", help="rewrite the marked blocks of the pages from the JSONs")
    check.add_argument("--check", action="store_true", help="only compare; exit 1 where a page differs")
    sub.add_parser("tiers", help="list the tiers")
    args = parser.parse_args(argv)
    if args.command == "tiers":
        for name, tier in TIERS.items():
            print(f"{name} (run --tier {name}): {tier['about']}; {', '.join(tier['experiments'])}")
        for name, tier in LARGER_TIERS.items():
            cost = tier_cost_s(tier)
            cost = (f"{_duration(cost)} on 2 cores, from its JSONs' wall times" if cost is not None
                    else tier["cost_note"])
            print(f"\n{name} ({cost}; run by hand): {tier['about']}")
            for command in tier["commands"]:
                print(f"    {command}")
            print(f"  writes: {', '.join(tier['writes'])}; then python scripts/reproduce.py render")
        return 0
    if args.command == "render":
        return render(args.check)
    run_tier(args.tier, args.seeds, REPO / args.out, args.fresh)
    return render(check=False)


if __name__ == "__main__":
    sys.exit(main())
