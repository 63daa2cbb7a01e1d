#!/usr/bin/env python
"""FKGE benchmarks: per-KG improvement against the control, PPAT vs KGEmb-Update time per
handshake (the paper's Fig. 6), bytes per PPAT batch, epsilon, ablations, and the
synchronous vs asynchronous wall time for the same handshake budget.

Each *variant* is a named list of config overrides on top of ``--config``; every variant
runs once per seed (``seed=<s>``; the sources stay those of ``data.partition_seed``), in a
fresh run directory, and the script prints one table of means over seeds and writes every
run's numbers to ``--json-out``:

* per KG: triple-classification accuracy and test MRR / Hits@10 before (after pre-training)
  and after the handshakes, and the gain;
* per variant: handshakes hosted / accepted, the mean seconds of PPAT and of the
  KGEmb-Update per handshake, tensor bytes per PPAT batch, the mean cosine between the
  translated rows and the host's own (``translation_cosine``: how well PPAT aligned the
  spaces) and with mismatched rows (``mismatched_cosine``: the level without alignment),
  the largest epsilon, the run's wall seconds (``wall s``: the whole ``run_federated`` call,
  Ray's start-up and the final evaluations included; ``run s``: the backend's own
  ``wall_seconds``, from the peers' start to the last delivery, the same measure for both
  backends).

Variants (``--variants``, comma-separated; ``all`` = every one):

* ``fkge``: the config as it is;
* ``control``: ``federated.fkge.mode=none`` -- the same handshakes, updates and backtracking,
  but the host trains without anything it received (the Independent baseline at equal
  training; the gain of ``fkge`` over ``control`` is what the federation adds);
* ``average``: ``mode=average`` (the official code's update);
* ``average_shuffled``: ``average`` with the received aligned rows permuted among the items
  (``shuffle_received``): same values, wrong items -- what ``average`` gains beyond this
  is knowledge about the items;
* ``nonprivate``: ``lam=100`` (PATE noise ``Lap(0.01)``: labels equal the teachers' vote);
* ``dp10``: ``max_epsilon=10`` (the budget of configs/fkge/umls_fkge_ppat_dp.yaml);
* ``entities`` / ``relations`` / ``both``: what PPAT aligns, on sources that share 30% of
  their relations (``shared_relations=0.3``; the three use the same sources);
* ``frac20`` / ``frac60``: 20% / 60% of the aligned entities (``align_fraction``);
* ``ray``: the config on ``federated.backend=ray`` (one process per KG) -- compare its wall
  seconds with ``fkge``'s for the same handshake budget;
* ``frozen``: PPAT with the generator frozen (``generator_lr=1e-12``): what a handshake gives
  with the client's random rotation W₀ as the translation;
* ``sup_exact`` / ``sup16`` / ``sup4`` / ``sup1``: the supervised DP alignment
  (``alignment=supervised``) exact or at ``dp_epsilon`` 16 / 4 / 1 per release;
  ``sup4_average``: ``sup4`` with ``mode=average``; ``sup_exact_average``: the exact release
  with ``mode=average`` and no epsilon budget (the upper bound of any translation learnt from
  the pairs);
* ``control_<variant>`` (after ``<variant>`` in the same call): ``<variant>``'s settings with
  ``mode=none`` and ``<variant>``'s handshake schedule replayed from its run of the same seed
  (``federated.fkge.schedule``); the script then prints, per seed, the variant's final MRR,
  Hits@10 and TC accuracy minus the control's, and whether the schedules were equal.
* ``random_<variant>`` (after ``<variant>``): the control that removes the alignment and
  keeps everything else: ``<variant>``'s settings (its ``mode``: the same averaging) with
  ``alignment=random``, a fresh Haar-random rotation per handshake, and ``<variant>``'s
  schedule replayed; compared per seed like ``control_<variant>``.

Commands (docs/results/fkge.md records their output; the first two are the review's controls):

    python scripts/benchmarks/bench_fkge.py --config configs/fkge/umls_fkge.yaml --seeds 0,1,2,3,4 \\
        --variants fkge,random_fkge,control_fkge --json-out docs/results/fkge/bench_fkge_umls_random.json
    python scripts/benchmarks/bench_fkge.py --config configs/fkge/fb15k237_fkge.yaml --pretrain --runs-dir runs/fb_controls \\
        --reuse --seeds 0,1,2 --variants sup4_average,random_sup4_average,control_sup4_average,sup_exact_average \\
        --json-out docs/results/fkge/bench_fkge_fb15k237_controls.json federated.fkge.holdout_fraction=0.2
    # seeds run in separate calls (same config, overrides and pre-training) as one report:
    python scripts/benchmarks/bench_fkge.py --merge A.json B.json --json-out AB.json

    python scripts/benchmarks/bench_fkge.py --seeds 0,1,2,3,4 \\
        --variants fkge,control_fkge,frozen,average,control_average,\
sup_exact,control_sup_exact,sup16,sup4,control_sup4,sup1,sup4_average,control_sup4_average \
        --json-out docs/results/fkge/bench_fkge_umls.json
    python scripts/benchmarks/bench_fkge.py --config configs/fkge/fb15k237_fkge.yaml --pretrain --runs-dir runs/bench_fkge_fb15k237 \
        --reuse --seeds 0,1,2 --variants sup4_average,control_sup4_average federated.fkge.max_epsilon=10 \
        --json-out docs/results/fkge/bench_fkge_fb15k237_sup4_average.json

    python scripts/benchmarks/bench_fkge.py --seeds 0,1,2,3,4 --variants fkge,control,average,nonprivate,dp10 \\
        --json-out docs/results/fkge/bench_fkge_umls.json
    python scripts/benchmarks/bench_fkge.py --seeds 0,1,2,3,4 --variants entities,relations,both,frac20,frac60 \\
        --json-out docs/results/fkge/bench_fkge_umls_ablations.json
    python scripts/benchmarks/bench_fkge.py --seeds 0,1,2,3,4 --variants average_shuffled --json-out docs/results/fkge/bench_fkge_umls_shuffled.json
    python scripts/benchmarks/bench_fkge.py --seeds 0,1,2,3,4 --variants dp10 --json-out docs/results/fkge/bench_fkge_umls_average_dp10.json \
        federated.fkge.mode=average
    python scripts/benchmarks/bench_fkge.py --seeds 0,1,2 --variants fkge,ray \\
        --json-out docs/results/fkge/bench_fkge_engines.json
    python scripts/benchmarks/bench_fkge.py --config configs/fkge/fb15k237_fkge.yaml --seeds 0 --variants fkge,average \
        --json-out docs/results/fkge/bench_fkge_fb15k237.json federated.fkge.pretrain_epochs=5 \
        federated.fkge.update_epochs=1 federated.fkge.handshakes_per_kg=1
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)

SHARED = ["federated.fkge.shared_relations=0.3"]
VARIANTS = {
    "fkge": [],
    "control": ["federated.fkge.mode=none"],
    "average": ["federated.fkge.mode=average"],
    "average_shuffled": ["federated.fkge.mode=average", "federated.fkge.shuffle_received=true"],
    "nonprivate": ["federated.fkge.lam=100"],
    "dp10": ["federated.fkge.max_epsilon=10"],
    "entities": [*SHARED, "federated.fkge.align=entities"],
    "relations": [*SHARED, "federated.fkge.align=relations"],
    "both": [*SHARED, "federated.fkge.align=both"],
    "frac20": ["federated.fkge.align_fraction=0.2"],
    "frac60": ["federated.fkge.align_fraction=0.6"],
    "ray": ["federated.backend=ray"],
    "frozen": ["federated.fkge.generator_lr=1e-12"],
    "sup_exact": ["federated.fkge.alignment=supervised", "federated.fkge.dp_epsilon=null"],
    "sup16": ["federated.fkge.alignment=supervised", "federated.fkge.dp_epsilon=16"],
    "sup4": ["federated.fkge.alignment=supervised", "federated.fkge.dp_epsilon=4"],
    "sup1": ["federated.fkge.alignment=supervised", "federated.fkge.dp_epsilon=1"],
    "sup4_average": ["federated.fkge.alignment=supervised", "federated.fkge.dp_epsilon=4",
                     "federated.fkge.mode=average"],
    "sup_exact_average": ["federated.fkge.alignment=supervised", "federated.fkge.dp_epsilon=null",
                          "federated.fkge.max_epsilon=null", "federated.fkge.mode=average"],
}
#: ``control_<variant>``: <variant>'s settings with nothing received used (``mode=none``) and
#: <variant>'s handshake schedule replayed (``schedule``: same hosts, partners, order and
#: update epochs, whatever the updates' outcomes); run after <variant> in the same call.
CONTROL = "control_"
#: ``random_<variant>``: <variant>'s settings with a Haar-random translation per handshake
#: (``alignment=random``: nothing aligned, nothing released) and its schedule replayed.
RANDOM = "random_"
CONTROLS = {CONTROL: ["federated.fkge.mode=none"], RANDOM: ["federated.fkge.alignment=random"]}
BLOCK_KEYS = ("accuracy", "mrr", "hits@10")


def run_one(config: str, overrides: list[str], out: Path, reuse: bool = False) -> dict:
    """Run one variant and seed into ``out`` (with ``reuse``, read a finished run there instead:
    its wall seconds are then those recorded by the run that made it, or None)."""
    from lightning_fedkg.config import load_config
    from lightning_fedkg.run import fit

    done = out / "metrics.json"
    if reuse and done.is_file():
        metrics = json.loads(done.read_text())
        wall = metrics.get("bench_wall_seconds")
    else:
        cfg = load_config(config, overrides)
        start = time.perf_counter()
        metrics = fit(cfg, out)
        wall = time.perf_counter() - start
        measure.write_json(done, {**metrics, "bench_wall_seconds": wall})
    # a handshake the partner declined (its budget spent) exchanged nothing: only counted
    hs = [h for h in metrics["handshakes"] if h.get("skipped") != "partner_epsilon"]
    ppat_batches = sum(h["ppat_batches"] for h in hs)
    return {
        "overrides": overrides,
        "wall_seconds": wall,
        "engine_wall_seconds": metrics.get("wall_seconds"),
        "kgs": [{k: kg.get(k) for k in ("name", "model", "before", "after", "epsilon", "privacy", "hosted",
                                         "accepted")} for kg in metrics["kgs"]],
        "pretrain": [kg.get("pretrain") for kg in metrics["kgs"]],
        "generator_moved": [s["generator_moved"] for kg in metrics["kgs"] for s in kg.get("served", [])],
        "schedule": sorted((h["host"], h["number"], h["client"]) for h in metrics["handshakes"]),
        "handshakes": len(metrics["handshakes"]),
        "declined": len(metrics["handshakes"]) - len(hs),
        "accepted": sum(bool(h["accepted"]) for h in hs),
        "seconds_ppat": [h["seconds_ppat"] for h in hs],
        "seconds_update": [h["seconds_update"] for h in hs],
        "translation_cosine": [h["translation_cosine"] for h in hs],
        "mismatched_cosine": [h["mismatched_cosine"] for h in hs],
        # the translation on held-out pairs (federated.fkge.holdout_fraction; None without)
        "heldout_cosine": [h.get("heldout_cosine") for h in hs],
        "heldout_hits1": [h.get("heldout_hits1") for h in hs],
        "heldout_hits10": [h.get("heldout_hits10") for h in hs],
        "bytes_per_ppat_batch": (sum(h["bytes_per_ppat_batch"] * h["ppat_batches"] for h in hs) / ppat_batches
                                 if ppat_batches else None),
        "bytes_sent": metrics["bytes_sent"],
        # None when a party released something exact (its epsilon is None: not private)
        "max_epsilon": (None if any(kg["epsilon"] is None for kg in metrics["kgs"])
                        else max(kg["epsilon"] for kg in metrics["kgs"])),
        "engine": metrics.get("engine", "local"),
    }


def pretrain_once(config: str, overrides: list[str], out: Path, threads: int) -> list[dict]:
    """Pre-train every KG alone into ``out`` (no handshakes) unless ``out`` already holds it;
    returns each KG's ``pretrain`` record (epochs, validation curve, seconds)."""
    from lightning_fedkg.config import load_config
    from lightning_fedkg.run import fit

    done = out / "metrics.json"
    if done.is_file():
        metrics = json.loads(done.read_text())
    else:
        cfg = load_config(config, ["seed=0", f"trainer.threads={threads}", "trainer.progress_bar=false",
                                   *overrides, "federated.fkge.handshakes_per_kg=0"])
        metrics = fit(cfg, out)
    records = [{"name": kg["name"], **kg["pretrain"]} for kg in metrics["kgs"]]
    for r in records:
        print(f"[pretrain] {r['name']}: {r['epochs']} epochs ({r['stopped']}), {r['seconds']:.0f} s, "
              f"validation MRR {r['valid_curve'][-1][1] if r['valid_curve'] else float('nan'):.4f}", flush=True)
    return records


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else float("nan")


def std(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarize(name: str, runs: list[dict]) -> dict:
    kgs = {}
    for run in runs:
        for kg in run["kgs"]:
            entry = kgs.setdefault(kg["name"], {"model": kg["model"], "before": {}, "after": {}})
            for block in ("before", "after"):
                for key in BLOCK_KEYS:
                    entry[block].setdefault(key, []).append(kg[block][key])
    for entry in kgs.values():
        for block in ("before", "after"):
            entry[block] = {k: {"mean": mean(v), "std": std(v)} for k, v in entry[block].items()}
        entry["gain_mrr"] = entry["after"]["mrr"]["mean"] - entry["before"]["mrr"]["mean"]
        entry["gain_accuracy"] = entry["after"]["accuracy"]["mean"] - entry["before"]["accuracy"]["mean"]
    return {
        "variant": name,
        "seeds": len(runs),
        "kgs": kgs,
        "handshakes": mean([r["handshakes"] for r in runs]),
        "accepted": mean([r["accepted"] for r in runs]),
        "seconds_ppat": mean([s for r in runs for s in r["seconds_ppat"]]),
        "seconds_update": mean([s for r in runs for s in r["seconds_update"]]),
        "translation_cosine": mean([c for r in runs for c in r["translation_cosine"]]),
        "mismatched_cosine": mean([c for r in runs for c in r["mismatched_cosine"]]),
        **{key: mean([c for r in runs for c in r.get(key, [])]) for key in
           ("heldout_cosine", "heldout_hits1", "heldout_hits10")},
        "bytes_per_ppat_batch": mean([r["bytes_per_ppat_batch"] for r in runs]),
        "max_epsilon": (None if any(r["max_epsilon"] is None for r in runs)
                        else mean([r["max_epsilon"] for r in runs])),
        "generator_moved": mean([g for r in runs for g in r["generator_moved"]]),
        "bytes_per_handshake": mean([r["bytes_sent"] / max(r["handshakes"], 1) for r in runs]),
        "gain": {key: mean([kg["after"][key] - kg["before"][key] for r in runs for kg in r["kgs"]])
                 for key in BLOCK_KEYS},
        "wall_seconds": mean([r["wall_seconds"] for r in runs]),
        "engine_wall_seconds": mean([r["engine_wall_seconds"] for r in runs]),
    }


def table(summaries: list[dict]) -> str:
    # Columns as wide as the longest name: a variant like control_sup4_average runs into the KG otherwise.
    vw = max([len("variant")] + [len(s["variant"]) for s in summaries]) + 2
    kw = max([len("KG")] + [len(name) for s in summaries for name in s["kgs"]]) + 2
    head = (f"{'variant':<{vw}}{'KG':<{kw}}{'acc before':>11}{'acc after':>10}{'MRR before':>11}{'MRR after':>10}"
            f"{'gain':>8}{'H@10 after':>11}")
    lines = [head, "-" * len(head)]
    for s in summaries:
        for name, kg in s["kgs"].items():
            b, a = kg["before"], kg["after"]
            lines.append(f"{s['variant']:<{vw}}{name:<{kw}}{b['accuracy']['mean']:>11.4f}{a['accuracy']['mean']:>10.4f}"
                         f"{b['mrr']['mean']:>11.4f}{a['mrr']['mean']:>10.4f}{kg['gain_mrr']:>+8.4f}"
                         f"{a['hits@10']['mean']:>11.4f}")
    head2 = (f"{'variant':<{vw}}{'seeds':>6}{'handshakes':>11}{'accepted':>9}{'s align':>9}{'s update':>9}"
             f"{'B/hs':>9}{'W moved':>8}{'cos':>7}{'cos mis':>8}{'epsilon':>9}{'gain MRR':>9}{'gain H10':>9}"
             f"{'gain acc':>9}{'wall s':>8}")
    lines += ["", head2, "-" * len(head2)]
    for s in summaries:
        eps = "exact" if s["max_epsilon"] is None else format(s["max_epsilon"], ".2f")
        lines.append(f"{s['variant']:<{vw}}{s['seeds']:>6}{s['handshakes']:>11.1f}{s['accepted']:>9.1f}"
                     f"{s['seconds_ppat']:>9.3f}{s['seconds_update']:>9.3f}{s['bytes_per_handshake']:>9.0f}"
                     f"{s['generator_moved']:>8.4f}{s['translation_cosine']:>7.3f}{s['mismatched_cosine']:>8.3f}"
                     f"{eps:>9}{s['gain']['mrr']:>+9.4f}{s['gain']['hits@10']:>+9.4f}"
                     f"{s['gain']['accuracy']:>+9.4f}{s['wall_seconds']:>8.1f}")
    return "\n".join(lines)


def versus_control(results: dict[str, list[dict]]) -> tuple[dict, str]:
    """Per variant with a ``control_<variant>`` or ``random_<variant>`` run: per seed, the mean
    over KGs of the variant's final metric minus the control's (same seed, same schedule).
    Keyed ``<variant>`` (against ``control_``, the older layout) and ``<variant> - random_<variant>``."""
    out, lines = {}, []
    for name, runs in results.items():
        for prefix in CONTROLS:
            control = results.get(prefix + name)
            if not control:
                continue
            per_seed = {key: [mean([a["after"][key] - b["after"][key] for a, b in zip(run["kgs"], ctrl["kgs"])])
                              for run, ctrl in zip(runs, control)] for key in BLOCK_KEYS}
            same = [run["schedule"] == ctrl["schedule"] for run, ctrl in zip(runs, control)]
            out[name if prefix == CONTROL else f"{name} - {prefix + name}"] = {"per_seed": per_seed,
                                                                               "same_schedule": same}
            for key, values in per_seed.items():
                lines.append(f"{name} - {prefix + name} {key}: mean {mean(values):+.4f}, per seed "
                             + " ".join(f"{v:+.4f}" for v in values)
                             + f" ({sum(v > 0 for v in values)}/{len(values)} positive; same schedule: {all(same)})")
    return out, "\n".join(lines)


def merge(paths: list[str]) -> dict:
    """One report of several of this script's JSONs that ran other seeds of the same config and
    overrides from the same pre-training (seeds run in separate calls): each variant's runs in
    the files' order, its seeds under ``variant_seeds``, summaries and controls recomputed."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    first = reports[0]
    for path, report in zip(paths[1:], reports[1:]):
        for key in ("config", "overrides", "threads"):
            if report[key] != first[key]:
                raise SystemExit(f"{path}: {key} {report[key]!r} differs from {paths[0]}'s {first[key]!r}")
    results, variant_seeds, before = {}, {}, {}
    for path, report in zip(paths, reports):
        for name, runs in report["runs"].items():
            seeds = report["seeds"][:len(runs)]
            taken = variant_seeds.setdefault(name, [])
            if set(seeds) & set(taken):
                raise SystemExit(f"{path}: {name} seeds {sorted(set(seeds) & set(taken))} are in an earlier file")
            taken.extend(seeds)
            results.setdefault(name, []).extend(runs)
            for run in runs:  # every run starts from the same pre-trained models: equal ranking metrics
                # before any handshake (triple classification draws its negatives by seed)
                for kg in run["kgs"]:
                    ranks = {k: v for k, v in kg["before"].items() if k == "mrr" or k.startswith("hits@")}
                    seen = before.setdefault(kg["name"], (path, ranks))
                    if seen[1] != ranks:
                        raise SystemExit(f"{path}: {kg['name']}'s metrics before any handshake differ from "
                                         f"{seen[0]}'s: not the same pre-training")
    controls, _ = versus_control(results)
    return {"merged_from": paths, "machine": first["machine"], "python": first["python"], "config": first["config"],
            "seeds": sorted({s for r in reports for s in r["seeds"]}), "variant_seeds": variant_seeds,
            "threads": first["threads"], "overrides": first["overrides"], "pretrain": [r["pretrain"] for r in reports],
            "summaries": [summarize(name, runs) for name, runs in results.items()], "versus_control": controls,
            "runs": results}


def _source(name: str) -> str | None:
    """The variant a ``control_`` or ``random_`` name controls (None for any other name)."""
    for prefix in CONTROLS:
        if name.startswith(prefix) and name not in VARIANTS:
            return name[len(prefix):]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "fkge" / "umls_fkge_ppat.yaml"),
                        help="the variants' overrides are relative to it (default: the paper's PPAT)")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--variants", default="fkge,control")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs-dir", help="where the runs go (default: a temporary folder)")
    parser.add_argument("--json-out")
    parser.add_argument("--reuse", action="store_true",
                        help="read a variant/seed whose run folder already holds metrics.json instead of running it "
                             "(finish an interrupted benchmark, or run seeds in parallel calls and collect them)")
    parser.add_argument("--pretrain", action="store_true",
                        help="first pre-train once (seed 0, the config and overrides, no handshakes) into "
                             "RUNS_DIR/pretrain (kept: a later call reuses it), then start every run from it")
    parser.add_argument("--pretrained-from", help="start every run from this run folder's pre-training "
                        "(federated.fkge.pretrained_from); '{seed}' in it is replaced by the run's seed")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="run nothing: merge these JSONs of other seeds of one experiment into --json-out")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = parser.parse_args()
    if args.merge:
        if not args.json_out:
            parser.error("--merge needs --json-out")
        report = merge(args.merge)
        print(table(report["summaries"]))
        print(versus_control(report["runs"])[1])
        measure.write_json(args.json_out, report)
        print(f"written {args.json_out}")
        return 0
    names = list(VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS and _source(v) not in names[:names.index(v)]]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}, or "
                     f"{CONTROL}<variant> / {RANDOM}<variant> after <variant>")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs_dir = Path(args.runs_dir or tempfile.mkdtemp(prefix="bench_fkge_"))
    results, summaries = {}, []
    pretrain = None
    if args.pretrain:
        if args.pretrained_from:
            parser.error("give --pretrain or --pretrained-from, not both")
        pretrain = pretrain_once(args.config, args.overrides, runs_dir / "pretrain", args.threads)
        args.pretrained_from = str(runs_dir / "pretrain")
    for name in names:
        runs = []
        for seed in seeds:
            if name not in VARIANTS:  # a control: the source's settings, its schedule replayed
                source = _source(name)
                prefix = name[: len(name) - len(source)]
                settings = [*VARIANTS[source], *args.overrides, *CONTROLS[prefix],
                            f"federated.fkge.schedule={runs_dir / f'{source}_seed{seed}'}"]
            else:
                settings = [*VARIANTS[name], *args.overrides]
            if args.pretrained_from:
                settings.append(f"federated.fkge.pretrained_from={args.pretrained_from.format(seed=seed)}")
            overrides = [f"seed={seed}", f"trainer.threads={args.threads}", "trainer.progress_bar=false", *settings]
            run = run_one(args.config, overrides, runs_dir / f"{name}_seed{seed}", reuse=args.reuse)
            wall = "?" if run["wall_seconds"] is None else f"{run['wall_seconds']:.1f}"
            eps = "not private" if run["max_epsilon"] is None else f"{run['max_epsilon']:.2f}"
            print(f"[{name} seed {seed}] {run['accepted']}/{run['handshakes']} accepted, "
                  f"wall {wall} s, epsilon {eps}", flush=True)
            runs.append(run)
        results[name] = runs
        summaries.append(summarize(name, runs))
    print(table(summaries))
    controls, text = versus_control(results)
    print(text)
    if args.json_out:
        report = {"machine": platform.platform(), "python": platform.python_version(), "config": args.config,
                  "seeds": seeds, "threads": args.threads, "overrides": args.overrides,
                  "pretrain": pretrain, "summaries": summaries, "versus_control": controls, "runs": results}
        measure.write_json(args.json_out, report)
        print(f"written {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
