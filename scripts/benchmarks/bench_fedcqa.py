#!/usr/bin/env python
"""FedCQA and its baselines: quality over seeds, and what a round and a retrieval cost.

``quality`` trains every variant (a config of ``configs/fedcqa``, plus overrides) for every
seed with ``fedkg fit``'s code and prints, per variant, the in-graph and cross-graph MRR
and HR@3 (means over seeds ± standard deviation), the rounds run and the seconds; where the
runs validated more than once (``federated.eval_every``), the in-graph validation MRR after
each evaluated round, and with two variants in how many seeds the second was at least the
first. Finished runs in ``--out`` are reused.

    python scripts/benchmarks/bench_fedcqa.py quality --seeds 0 1 2 3 4 --out runs/fedcqa_umls \\
        --json-out docs/results/fedcqa/umls_gqe.json
    python scripts/benchmarks/bench_fedcqa.py quality --variants umls_fedcqa_q2p umls_local_gqe -- task.encoder=q2p

``speed`` builds one federation from a config and times, on this machine: query sampling
per type (a fresh cache), training rounds (seconds per round, training queries per
second), one test evaluation (in-graph evaluation and cross-graph retrieval latency per
query type, per query), bytes per round and per retrieved query, and peak memory, with
secure aggregation on and off, and the paper's static masks (``secret: paper``), for ``fedcqa``.

    python scripts/benchmarks/bench_fedcqa.py speed -c configs/fedcqa/umls_fedcqa_gqe.yaml --rounds 3

``speed --retrieval`` times only the cross-graph retrieval of one test evaluation, under
``task.retrieval: paper`` and ``private`` after the same training: seconds and bytes (tensor
bytes, both ways, and as serialized) per query, per type and overall.

    python scripts/benchmarks/bench_fedcqa.py speed -c configs/fedcqa/umls_fedcqa_gqe.yaml --rounds 1 --retrieval

``retest`` evaluates finished runs of ``quality`` again, each at its best validation round
(what ``fedkg test --from RUN`` evaluates) with the run's own config plus overrides, e.g. the
paper's test-set sizes, and summarises them as ``quality`` does (per seed, means, and with
two variants the per-seed differences). Each run's metrics go to
``RUN/retest_<--tag>.json`` and are reused, so a cut-short batch resumes.

    python scripts/benchmarks/bench_fedcqa.py retest --variants fb15k237_fed5_local_gqe fb15k237_fed5_fedcqa_gqe \
        --seeds 0 1 2 --out runs/fedcqa_fb5_sm32_4000_persist --tag paper_sizes \
        task.eval_per_type=5000 task.cross_per_type=5000

``step`` times one client's training steps (``Party.fit``), GQE's training scores through
cdist and compiled (``trainer.compile_cpu``) alternately in one process.

    python scripts/benchmarks/bench_fedcqa.py step -c configs/fedcqa/fb15k237_fed5_local_gqe.yaml --client client_0 \
        task.cache_dir=runs/qcache model.dim=32 task.steps_per_epoch=20 trainer.threads=1
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from lightning_fedkg import measure
from lightning_fedkg.atomic import write_atomic
from lightning_fedkg.config import load_config
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.methods.fedcqa import CQAFedE
from lightning_fedkg.run import fit
from lightning_fedkg.runtime import config_table_elements, configure_torch

REPO = measure.repo_root(__file__)
CONFIGS = REPO / "configs" / "fedcqa"
DEFAULT_VARIANTS = ["umls_local_gqe", "umls_central_gqe", "umls_fede_gqe", "umls_fedr_gqe", "umls_fedcqa_gqe"]
KEYS = (("in MRR", "in_graph", "mrr"), ("in HR@3", "in_graph", "hits@3"), ("in HR@10", "in_graph", "hits@10"),
        ("cross MRR", "cross_graph", "mrr"), ("cross HR@3", "cross_graph", "hits@3"),
        ("cross HR@10", "cross_graph", "hits@10"))


def quality(args) -> None:
    rows = {}
    for variant in args.variants:
        runs = []
        for seed in args.seeds:
            run_dir = Path(args.out) / variant / f"seed{seed}"
            metrics_path = run_dir / "metrics.json"
            if not metrics_path.is_file():
                cfg = load_config(CONFIGS / f"{variant}.yaml", [f"seed={seed}", *args.overrides])
                fit(cfg, run_dir)
            runs.append(json.loads(metrics_path.read_text()))
        row = {"seeds": list(args.seeds), **_means(runs)}
        row["rounds"] = statistics.mean(m["rounds"] for m in runs)
        row["seconds"] = statistics.mean(m["seconds"] for m in runs)
        row["cross_by_type_mrr"] = {t: statistics.mean(m["cross_graph"]["by_type"][t]["mrr"] for m in runs)
                                    for t in runs[0].get("cross_graph", {}).get("by_type", {})}
        row["in_by_type_mrr"] = {t: statistics.mean(m["in_graph"]["by_type"][t]["mrr"] for m in runs)
                                 for t in runs[0].get("in_graph", {}).get("by_type", {})}
        # every seed's own numbers, so a reader can count in how many seeds one variant wins
        row["per_seed"] = [_seed_row(seed, m) for seed, m in zip(args.seeds, runs)]
        # the in-graph validation MRR after each evaluated round (federated.eval_every), mean over seeds
        curves = [{v["round"]: v["mrr"] for v in m.get("validation", [])} for m in runs]
        shared = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        row["validation_by_round"] = {r: statistics.mean(c[r] for c in curves) for r in shared}
        rows[variant] = row
    print(f"{'variant':24s}" + "".join(f"{label:>18s}" for label, _, _ in KEYS) + f"{'rounds':>8s}{'s':>8s}")
    for variant, row in rows.items():
        cells = "".join(f"{'-':>18s}" if row[label] is None else f"{row[label][0]:>11.4f} ±{row[label][1]:.4f}"
                        for label, _, _ in KEYS)
        print(f"{variant:24s}{cells}{row['rounds']:>8.1f}{row['seconds']:>8.1f}")
    _print_curves(rows)
    if args.json_out:
        measure.write_json(args.json_out, {"overrides": args.overrides, "variants": rows})


def retest(args) -> None:
    from lightning_fedkg.run import evaluate

    rows = {}
    for variant in args.variants:
        runs = []
        for seed in args.seeds:
            run_dir = Path(args.out) / variant / f"seed{seed}"
            if not (run_dir / "metrics.json").is_file():
                raise SystemExit(f"{run_dir} has not finished (no metrics.json): train it with `quality` first")
            path = run_dir / f"retest_{args.tag}.json"
            if not path.is_file():
                cfg = load_config(run_dir / "config.yaml", args.overrides)
                start = time.perf_counter()
                metrics = evaluate(cfg, run_dir)
                metrics["seconds"] = time.perf_counter() - start
                metrics["overrides"] = args.overrides
                # atomic: a batch killed mid-write leaves no half file for the next one to reuse
                write_atomic(path, lambda f, m=metrics: f.write(json.dumps(m, indent=1).encode()))
            runs.append(json.loads(path.read_text()))
            if runs[-1].get("overrides") != args.overrides:
                raise SystemExit(f"{path} was evaluated with {runs[-1].get('overrides')}, not {args.overrides}: "
                                 "give these overrides another --tag")
            logging.getLogger("lightning_fedkg").info("%s seed %d (round %s): in-graph %.4f, cross-graph %.4f",
                                                     variant, seed, runs[-1].get("round"),
                                                     runs[-1]["in_graph"]["mrr"], runs[-1]["cross_graph"]["mrr"])
        rows[variant] = {"seeds": list(args.seeds), **_means(runs),
                         "test_queries": {block: {t: v["queries"] for t, v in runs[0][block]["by_type"].items()}
                                          for block in ("in_graph", "cross_graph")},
                         # "round": the evaluated (best) round; "seconds": the evaluation's
                         "per_seed": [{**_seed_row(seed, m), "round": m.get("round")}
                                      for seed, m in zip(args.seeds, runs)]}
    print(f"{'variant':28s}" + "".join(f"{label:>18s}" for label, _, _ in KEYS))
    for variant, row in rows.items():
        print(f"{variant:28s}" + "".join(f"{row[label][0]:>11.4f} ±{row[label][1]:.4f}" for label, _, _ in KEYS))
    report = {"overrides": args.overrides, "tag": args.tag, "variants": rows}
    if len(rows) == 2:
        # the paired comparison the ordering claims rest on: second minus first, seed by seed
        first, second = rows.values()
        report["second_minus_first"] = {label: [b[label] - a[label] for a, b in zip(first["per_seed"], second["per_seed"])]
                                        for label in ("in MRR", "cross MRR")}
        print("second minus first, by seed:", {k: [round(x, 4) for x in v]
                                               for k, v in report["second_minus_first"].items()})
    if args.json_out:
        measure.write_json(args.json_out, report)


def _print_curves(rows: dict) -> None:
    """Validation MRR by round, one column per variant, where runs validated more than once;
    with two variants over the same seeds, also in how many seeds the second was at least
    the first after that round."""
    rounds = sorted(set.union(*(set(row["validation_by_round"]) for row in rows.values())))
    if len(rounds) < 2:
        return
    pair = list(rows.values()) if len(rows) == 2 else None
    if pair and [s["seed"] for s in pair[0]["per_seed"]] != [s["seed"] for s in pair[1]["per_seed"]]:
        pair = None
    print("\nin-graph validation MRR after each evaluated round (mean over seeds)")
    print(f"{'round':>6s}" + "".join(f"{variant:>26s}" for variant in rows)
          + (f"{'seeds 2nd >= 1st':>18s}" if pair else ""))
    for r in rounds:
        line = f"{r:>6d}" + "".join(f"{row['validation_by_round'].get(r, float('nan')):>26.4f}" for row in rows.values())
        if pair:
            wins = sum(b["validation"].get(r, -1.0) >= a["validation"].get(r, float("inf"))
                       for a, b in zip(pair[0]["per_seed"], pair[1]["per_seed"]))
            line += f"{wins:>14d} of {len(pair[0]['per_seed'])}"
        print(line)


def _means(runs: list[dict]) -> dict:
    """``{label: [mean, population sd]}`` over runs of each of :data:`KEYS` (None where no
    run has its block)."""
    out = {}
    for label, block, key in KEYS:
        values = [m[block][key] for m in runs if block in m]
        out[label] = [statistics.mean(values), statistics.pstdev(values)] if values else None
    return out


def _seed_row(seed: int, metrics: dict) -> dict:
    """One run's overall metrics and, per block, MRR and HR@10 by query type."""
    row = {"seed": seed, "seconds": metrics["seconds"], "rounds": metrics.get("rounds"),
           "validation": {v["round"]: v["mrr"] for v in metrics.get("validation", [])}}
    for label, block, key in KEYS:
        row[label] = metrics[block][key] if block in metrics else None
    for block in ("in_graph", "cross_graph"):
        if block in metrics:
            row[f"{block}_by_type"] = {t: {"mrr": v["mrr"], "hits@10": v["hits@10"]}
                                       for t, v in metrics[block]["by_type"].items()}
    return row


def speed_once(cfg, rounds: int) -> dict:
    run = FederatedRun(cfg, None)
    run.align()
    channel = run.channel
    seconds = []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        selected = run.train_round(r)
        seconds.append(time.perf_counter() - start)
    train_bytes = sum(rec.bytes for rec in channel.records() if rec.round >= 1) / rounds
    queries_per_round = len(selected) * cfg.task.steps_per_epoch * cfg.federated.local_epochs * cfg.train.batch_size
    before = len(channel.records())
    start = time.perf_counter()
    run.evaluate("test", rounds)
    evaluation = time.perf_counter() - start
    records = channel.records()[before:]
    cross = run.server.cross_graph() or {}
    retrieved = sum(m["queries"] for m in cross.get("by_type", {}).values())
    retrieval_bytes = sum(r.bytes for r in records if r.name.startswith("cq_step"))
    out = {
        "seconds_per_round": statistics.mean(seconds[1:] if len(seconds) > 1 else seconds),
        "training_queries_per_second": queries_per_round / statistics.mean(seconds[1:] if len(seconds) > 1 else seconds),
        "bytes_per_round": train_bytes,
        "test_evaluation_seconds": evaluation,
        "retrieval_seconds_per_query": {t: cross["seconds"][t] / max(cross["by_type"][t]["queries"], 1)
                                        for t in cross.get("seconds", {})},
        "retrieval_bytes_per_query": retrieval_bytes / max(retrieved, 1),
        "cross_graph_queries": retrieved,
        "peak_rss_mib": measure.peak_rss_mib(),
    }
    run.close()
    return out


class PlainFedCQA(CQAFedE):
    """FedCQA's groups (entity rows and operators; relations stay) averaged in clear: the
    "secret aggregation off" side of the cost comparison."""

    name = "plain_fedcqa"
    groups = ("entity", "operators")


def retrieval_once(cfg, rounds: int) -> dict:
    """One test evaluation's cross-graph retrieval after ``rounds`` rounds: seconds and bytes."""
    run = FederatedRun(cfg, None)
    for r in range(1, rounds + 1):
        run.train_round(r)
    before = len(run.channel.records())
    run.evaluate("test", rounds)
    steps = [r for r in run.channel.records()[before:] if r.name.startswith("cq_step")]
    cross = run.server.cross_graph()
    queries = sum(m["queries"] for m in cross["by_type"].values())
    out = {
        "queries": queries,
        "unanswered": cross["unanswered"],
        "mrr": cross["mrr"],
        "seconds": sum(cross["seconds"].values()),
        "ms_per_query": 1e3 * sum(cross["seconds"].values()) / max(queries, 1),
        "ms_per_query_by_type": {t: 1e3 * s / max(cross["by_type"][t]["queries"], 1)
                                 for t, s in cross["seconds"].items()},
        "bytes_per_query": sum(r.bytes for r in steps) / max(queries, 1),
        "wire_bytes_per_query": sum(r.wire_bytes for r in steps) / max(queries, 1),
        "messages": len(steps),
    }
    run.close()
    return out


def speed(args) -> None:
    from lightning_fedkg.methods.fedcqa.query_sets import graph_query_sets
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.methods.fedcqa.config import query_settings

    cfg = load_config(args.config, args.overrides)
    report = {"config": str(args.config), "overrides": args.overrides,
              "threads": configure_torch(cfg.trainer, config_table_elements(cfg))}
    if args.retrieval:
        for mode in ("paper", "private"):
            report[mode] = retrieval_once(load_config(args.config, [*args.overrides, f"task.retrieval={mode}"]),
                                          args.rounds)
        report["private_over_paper"] = {k: report["private"][k] / report["paper"][k]
                                        for k in ("ms_per_query", "bytes_per_query", "wire_bytes_per_query")}
        _write(report, args.json_out)
        return
    # sampling per type on client 0 (train, valid and test sets of the type), fresh caches
    fkg = load_federated_kg(cfg)
    settings = query_settings(cfg.task)
    report["sampling_seconds_client_0"] = {}
    for t in settings.types:
        one = replace(settings, types=(t,), train_types=(t,) if t in settings.train_types else ())
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            graph_query_sets(fkg.clients[0], one, cfg.data.num_clients, cache, label="client_0")
            report["sampling_seconds_client_0"][t] = time.perf_counter() - start
    report["secure_on" if cfg.federated.secure_aggregation.enabled else "plain"] = speed_once(cfg, args.rounds)
    if cfg.federated.strategy == "fedcqa":
        plain = load_config(args.config, [*args.overrides, "federated.secure_aggregation.enabled=false",
                                          "federated.strategy=__main__:PlainFedCQA"])
        report["secure_off"] = speed_once(plain, args.rounds)
        paper = load_config(args.config, [*args.overrides, "federated.secure_aggregation.enabled=false",
                                          "federated.fedcqa.secret=paper"])
        report["paper_masks"] = speed_once(paper, args.rounds)
    _write(report, args.json_out)


def step(args) -> None:
    """Seconds per training step of one client (``Party.fit`` of one epoch, i.e.
    ``task.steps_per_epoch`` steps, as in a round), GQE's training scores through cdist
    (``trainer.compile=false``) and compiled (``trainer.compile_cpu=true``) in turn,
    ``--repeats`` times each in one process: both forms see the same data and the same load.
    Each form's first fit (the compiled one compiling) is reported apart; ``compiled_ran``
    says whether the compiled form ran at all (without a C++ compiler it falls back to cdist)."""
    from lightning_fedkg.models.kge import families
    from lightning_fedkg.federated.party import build_client_parties, load_federated_kg
    from lightning_fedkg.federated.tasks import TASKS

    cfg = load_config(args.config, args.overrides)
    threads = configure_torch(cfg.trainer, config_table_elements(cfg))
    fkg = load_federated_kg(cfg)
    task = TASKS.get(cfg.federated.task)()
    (party,) = build_client_parties(cfg, task, fkg, only=args.client)
    encoder = party.module.encoder
    if not hasattr(encoder, "compile_distances"):
        raise SystemExit(f"{cfg.task.encoder}: only GQE's scores have a compiled form")
    steps = cfg.task.steps_per_epoch
    forms = {"cdist": (False, False), "compiled": (None, True)}

    def fit(form: str) -> float:
        encoder.compile_distances, encoder.compile_on_cpu = forms[form]
        start = time.perf_counter()
        party.fit(1)
        return (time.perf_counter() - start) / steps

    first = {"cdist": fit("cdist"), "compiled": fit("compiled")}  # warm-up; the compilation
    seconds: dict[str, list[float]] = {"cdist": [], "compiled": []}
    for r in range(args.repeats):
        for form in (("cdist", "compiled") if r % 2 == 0 else ("compiled", "cdist")):
            seconds[form].append(fit(form))
            logging.getLogger("lightning_fedkg").info("repeat %d %s: %.1f ms a step", r + 1, form,
                                                      1000 * seconds[form][-1])
    median = {f: statistics.median(v) for f, v in seconds.items()}
    report = {"config": str(args.config), "overrides": args.overrides, "client": args.client, "threads": threads,
              "entities": int(party.kg.num_entities), "steps_per_fit": steps, "first_fit_s_per_step": first,
              "compiled_ran": families._FUSED_L1.get("fn") not in (None, False),
              "s_per_step": seconds, "median_s_per_step": median,
              "cdist_over_compiled": median["cdist"] / median["compiled"], "peak_rss_mib": measure.peak_rss_mib()}
    _write(report, args.json_out)


def _write(report: dict, json_out: str | None) -> None:
    print(json.dumps(report, indent=1))
    if json_out:
        measure.write_json(json_out, report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    q.add_argument("--seeds", nargs="+", type=int, default=[0])
    q.add_argument("--out", default="runs/fedcqa")
    q.add_argument("--json-out")
    q.add_argument("overrides", nargs="*")
    s = sub.add_parser("speed")
    s.add_argument("-c", "--config", type=Path, required=True)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--json-out")
    s.add_argument("--retrieval", action="store_true",
                   help="time only the cross-graph retrieval, task.retrieval paper against private")
    s.add_argument("overrides", nargs="*")
    rt = sub.add_parser("retest", help="evaluate finished quality runs again (e.g. on larger test sets)")
    rt.add_argument("--variants", nargs="+", required=True)
    rt.add_argument("--seeds", nargs="+", type=int, default=[0])
    rt.add_argument("--out", required=True, help="the folder quality trained in")
    rt.add_argument("--tag", required=True, help="names each run's RUN/retest_<tag>.json")
    rt.add_argument("--json-out")
    rt.add_argument("overrides", nargs="*", help="key=value overrides of each run's own config")
    st = sub.add_parser("step")
    st.add_argument("-c", "--config", type=Path, required=True)
    st.add_argument("--client", default="client_0")
    st.add_argument("--repeats", type=int, default=4)
    st.add_argument("--json-out")
    st.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    # one line per round (seconds, and the validation MRR where the round validated), so a
    # log shows a run's curve while it trains, and keeps it if the run is cut short
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("lightning_fedkg").setLevel(logging.INFO)
    {"quality": quality, "retest": retest, "speed": speed, "step": step}[args.mode](args)


if __name__ == "__main__":
    main()
