#!/usr/bin/env python
"""FedE at scale: seconds per batch and per round, evaluation seconds, memory and bytes, from
10^4 to 10^6 entities, dense Adam against the row-sparse optimizer (``train.optimizer``).

For each ``--sizes`` N it writes (once, under ``--data-dir``) a synthetic power-law KG of N
entities and ``--triples-per-entity`` x N triples (``fedkg data synth``), then runs, for each
``--optimizers`` value, one fresh process (its peak RSS is that configuration's) that builds
the FedE federation of ``--config`` over it (split by relation into ``--clients`` clients,
the config's E local epochs) at the batch shape of the issue's measurement (``--dim`` 64,
``--batch-size`` 256, ``--negatives`` 64 shared negatives) and runs two bounded rounds:
``--batches`` training batches per local epoch per client; round 1 is warm-up, round 2 is
measured; ``--repeat`` runs of each, whose medians the table shows. It reports:

* ``s_per_batch``: the median, over every batch of round 2 (clients x E x ``--batches``), of
  the time from one batch's end to the next one's (loader, step and Lightning's per-batch
  work), and ``step_s``, the median of the step alone (batch start to end); both wall clock.
  ``cpu_s_per_batch`` is the first in the process's CPU seconds: on a shared machine other
  jobs' time is in the wall-clock figure (docs/results/scale.md measured how much);
* ``round_s_extrapolated``: per client, its fits' fixed costs (the measured fit time less
  its batches) plus the median batch time x the batches of a full round (E x batches per
  epoch), summed over the clients, plus the round's time outside the fits (transport,
  aggregation). EXTRAPOLATED from bounded rounds, labelled so in the output and the JSON;
* evaluation (with ``--evaluate``, in the first run of the last optimizer; it does not depend
  on it): the test split of every client ranked in full over ``--eval-batches`` query
  batches each (``eval_full_s_extrapolated``, extrapolated to the whole split from its
  seconds per query), and against ``--eval-candidates`` sampled candidates
  (``train.eval_candidates``) over the whole split unless ``--sampled-eval-batches`` bounds it
  (``eval_sampled_s_extrapolated``: measured when the whole split ran);
* ``build_s`` (load, split, clients' modules, data modules and Trainers), ``align_s``,
  ``peak_rss_mib`` and ``bytes_per_round`` (every message of round 2 the Channel logged);
* ``checkpoint_s`` and ``checkpoint_bytes``: one resume point as ``fedkg fit`` commits after
  every round (every party's state, written atomically), after round 2.

``--reference`` adds the same measurement on a pre-split folder (FB15k-237-Fed3: the per-batch
figure to compare with). A JSON (``--json-out``) holds every run; a PNG of its curves is drawn
next to it when matplotlib is installed (the ``plot`` extra; otherwise the script says so).
``--plot JSON ...`` runs nothing and draws the curves of recorded JSONs into one PNG
(``--plot-out``). Timings are wall clock on a machine that may be shared: repeat, and read
medians.

    python scripts/benchmarks/bench_scale.py --sizes 10000 100000 1000000 --batches 3 --repeat 3 --threads 1 \\
        --evaluate --reference ../shared/data/FB15k-237-Fed3 --json-out docs/results/scale/scale.json
    python scripts/benchmarks/bench_scale.py --plot docs/results/scale/scale.json \
        docs/results/scale/scale_cpu_10clients.json --plot-out docs/results/scale/scale_curves.png
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)

DEFAULT_CONFIG = REPO / "configs" / "fede" / "fb15k237_fed3_fede.yaml"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="entity counts")
    p.add_argument("--triples-per-entity", type=float, default=10.0)
    p.add_argument("--relations", type=int, default=200)
    p.add_argument("--exponent", type=float, default=0.75, help="Zipf exponent of the synthetic KGs")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--optimizers", nargs="+", default=["adam", "sparse_adam"])
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--negatives", type=int, default=64)
    p.add_argument("--batches", type=int, default=10, help="training batches per local epoch per client")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each size and optimizer, each a fresh process; the table shows their medians")
    p.add_argument("--evaluate", action="store_true", help="time full and sampled evaluation (last optimizer)")
    p.add_argument("--eval-batches", type=int, default=2, help="query batches per client ranked in full")
    p.add_argument("--sampled-eval-batches", type=int, default=0,
                   help="query batches per client ranked against sampled candidates (0: the whole test split)")
    p.add_argument("--eval-candidates", type=int, default=500, help="K of the sampled protocol")
    p.add_argument("--reference", help="a pre-split federated folder measured the same way (FB15k-237-Fed3)")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "fedkg-scale"),
                   help="where the synthetic KGs are written (kept between runs)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take before it is stopped")
    p.add_argument("--json-out")
    p.add_argument("--plot", nargs="+", metavar="JSON",
                   help="run nothing: draw the curves of these bench_scale JSONs into --plot-out")
    p.add_argument("--plot-out", default=str(REPO / "docs" / "results" / "scale" / "scale_curves.png"))
    p.add_argument("--one", nargs=2, metavar=("DATA", "OPTIMIZER"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------- one run (a fresh process)
def measure(args: argparse.Namespace, data: str, optimizer: str, evaluate: bool) -> dict:
    import lightning as L
    import torch

    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.checkpoint import CHECKPOINT_DIR, commit_round
    from lightning_fedkg.federated.federation import FederatedRun
    from lightning_fedkg.runtime import seed_process

    class BatchClock(L.Callback):
        """Per batch: the step alone (start to end) and the cycle (previous end to this end),
        in wall seconds and in the process's CPU seconds (``*_cpu``: what other jobs on a
        shared machine do not inflate)."""

        def __init__(self) -> None:
            self.steps: list[float] = []
            self.cycles: list[float] = []
            self.steps_cpu: list[float] = []
            self.cycles_cpu: list[float] = []
            self._start = self._last = (0.0, 0.0)

        @staticmethod
        def now() -> tuple[float, float]:
            return time.perf_counter(), time.process_time()

        def clear(self) -> None:
            for values in (self.steps, self.cycles, self.steps_cpu, self.cycles_cpu):
                values.clear()

        def on_train_epoch_start(self, trainer, module) -> None:
            self._last = self.now()

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            self._start = self.now()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            now = self.now()
            self.steps.append(now[0] - self._start[0])
            self.cycles.append(now[0] - self._last[0])
            self.steps_cpu.append(now[1] - self._start[1])
            self.cycles_cpu.append(now[1] - self._last[1])
            self._last = now

    torch.set_num_threads(args.threads)
    overrides = [f"data.name={data}", f"data.num_clients={args.clients}", f"model.dim={args.dim}",
                 f"train.batch_size={args.batch_size}", f"train.num_negatives={args.negatives}",
                 "train.negative_mode=shared", f"train.optimizer={optimizer}", f"trainer.threads={args.threads}",
                 "trainer.progress_bar=false"]
    cfg = load_config(args.config, overrides)
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as run_dir:
        start = time.perf_counter()
        seed_process(cfg.seed)
        run = FederatedRun(cfg, run_dir)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        run.align()
        align_s = time.perf_counter() - start
        clocks, fit_s = {}, {}
        for party in run.learners:
            party.trainer.limit_train_batches = args.batches
            clocks[party.name] = BatchClock()
            party.trainer.callbacks.append(clocks[party.name])
            original = party.fit

            def timed_fit(epochs, _name=party.name, _original=original):
                began = time.perf_counter()
                out = _original(epochs)
                fit_s[_name] += time.perf_counter() - began
                return out

            party.fit = timed_fit
        rounds = []
        for r in (1, 2):  # round 1 warms up (first fits, indexes); round 2 is measured
            for clock in clocks.values():
                clock.clear()
            fit_s.update({name: 0.0 for name in clocks})
            start = time.perf_counter()
            run.train_round(r)
            rounds.append({"train_s": time.perf_counter() - start,
                           "bytes": sum(int(rec.bytes) for rec in run.channel.records(round=r))})
        # a resume point as `fedkg fit` commits one after every round: every party's state
        start = time.perf_counter()
        manifest = commit_round(Path(run_dir) / CHECKPOINT_DIR, "round_0002", run.party_states(), {"round": 2})
        checkpoint_s = time.perf_counter() - start
        checkpoint_bytes = sum(f.stat().st_size for f in manifest.parent.rglob("*") if f.is_file())
        epochs = cfg.federated.local_epochs
        clients = {}
        for party in run.learners:
            clock = clocks[party.name]
            full = party.datamodule.num_train_batches * epochs
            median = statistics.median(clock.cycles)
            fixed = fit_s[party.name] - sum(clock.cycles)
            clients[party.name] = {
                "entities": party.kg.num_entities, "train_triples": int(party.kg.triples("train").shape[0]),
                "test_queries": int(party.kg.triples("test").shape[0]), "batches_measured": len(clock.cycles),
                "s_per_batch": median, "step_s": statistics.median(clock.steps), "fit_s": fit_s[party.name],
                "fit_fixed_s": fixed, "full_round_batches": full, "round_s_extrapolated": fixed + median * full}
        outside = rounds[1]["train_s"] - sum(fit_s.values())
        cycles = [c for clock in clocks.values() for c in clock.cycles]
        steps = [s for clock in clocks.values() for s in clock.steps]
        cycles_cpu = [c for clock in clocks.values() for c in clock.cycles_cpu]
        steps_cpu = [c for clock in clocks.values() for c in clock.steps_cpu]
        result = {
            "data": data, "optimizer": optimizer, "entities": run.fkg.num_entities if hasattr(run, "fkg") else None,
            "clients": clients, "build_s": build_s, "align_s": align_s,
            "s_per_batch": statistics.median(cycles), "step_s": statistics.median(steps),
            "cpu_s_per_batch": statistics.median(cycles_cpu), "step_cpu_s": statistics.median(steps_cpu),
            "batches_measured": len(cycles), "bounded_round_s": rounds[1]["train_s"],
            "warmup_round_s": rounds[0]["train_s"],
            "outside_fit_s": outside, "extrapolated": True,
            "round_s_extrapolated": sum(c["round_s_extrapolated"] for c in clients.values()) + outside,
            "bytes_per_round": rounds[1]["bytes"], "local_epochs": epochs,
            "checkpoint_s": checkpoint_s, "checkpoint_bytes": checkpoint_bytes,
        }
        if evaluate:
            result["evaluation"] = measure_evaluation(run, args)
        result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return result


def measure_evaluation(run, args: argparse.Namespace) -> dict:
    """Seconds per test query of every client, ranked in full over ``--eval-batches`` batches
    each and against K sampled candidates over ``--sampled-eval-batches`` (0: all); each
    extrapolated to the whole test splits (the sampled figure is measured when it ran all)."""
    out = {"eval_candidates": args.eval_candidates, "eval_batches": args.eval_batches,
           "sampled_eval_batches": args.sampled_eval_batches or "all", "extrapolated": True}
    for protocol, k, batches in (("full", None, args.eval_batches),
                                 ("sampled", args.eval_candidates, args.sampled_eval_batches or 1.0)):
        seconds, queries, total, mrr = 0.0, 0, 0, []
        for party in run.learners:
            party.module.hparams.eval_candidates = k
            party.trainer.limit_test_batches = batches
            start = time.perf_counter()
            party.run_evaluation("test")
            seconds += time.perf_counter() - start
            metrics = party.module.last_metrics["test"]
            queries += metrics["count"]
            total += int(party.kg.triples("test").shape[0]) * (2 if run.cfg.train.eval_sides == "both" else 1)
            mrr.append(metrics["mrr"])
        out[f"{protocol}_s"] = seconds
        out[f"{protocol}_queries"] = queries
        out[f"{protocol}_s_per_1k_queries"] = 1000 * seconds / queries
        out[f"eval_{protocol}_s_extrapolated"] = seconds / queries * total
        out[f"{protocol}_mrr_after_two_bounded_rounds"] = mrr
        out["test_queries"] = total
    return out


# ---------------------------------------------------------------------------- the driver
def synthetic_folder(args: argparse.Namespace, entities: int) -> tuple[Path, float | None]:
    from lightning_fedkg.data.synthetic import write_synthetic

    triples = int(round(args.triples_per_entity * entities))
    folder = Path(args.data_dir) / f"synth-{entities}-{args.relations}-{triples}-a{args.exponent:g}"
    if (folder / "test.txt").is_file():
        return folder, None
    start = time.perf_counter()
    write_synthetic(folder, entities, min(args.relations, entities), triples, args.exponent, seed=0)
    return folder, time.perf_counter() - start


#: The figures of a row that are medians over its repeats.
MEDIANS = ("s_per_batch", "step_s", "cpu_s_per_batch", "step_cpu_s", "round_s_extrapolated", "build_s", "align_s",
           "peak_rss_mib", "bytes_per_round", "checkpoint_s", "checkpoint_bytes")


def run_repeats(args: argparse.Namespace, data: str, optimizer: str, evaluate: bool) -> dict:
    """``--repeat`` runs (only the first evaluates); the row holds their medians and every run."""
    runs = [run_one(args, data, optimizer, evaluate and i == 0) for i in range(args.repeat)]
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    row = {key: statistics.median(r[key] for r in ok) for key in MEDIANS if all(key in r for r in ok)}
    row.update(optimizer=optimizer, data=data, repeats=runs, extrapolated=True)
    row["loadavg"] = [r["loadavg"] for r in ok]
    if "evaluation" in ok[0]:
        row["evaluation"] = ok[0]["evaluation"]
    return row


def run_one(args: argparse.Namespace, data: str, optimizer: str, evaluate: bool) -> dict:
    command = [sys.executable, __file__, "--one", data, optimizer, "--threads", str(args.threads),
               "--clients", str(args.clients), "--config", args.config, "--dim", str(args.dim),
               "--batch-size", str(args.batch_size), "--negatives", str(args.negatives),
               "--batches", str(args.batches), "--eval-batches", str(args.eval_batches),
               "--sampled-eval-batches", str(args.sampled_eval_batches),
               "--eval-candidates", str(args.eval_candidates)] + (["--evaluate"] if evaluate else [])
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"data": data, "optimizer": optimizer, "error": f"stopped after {args.timeout:.0f} s"}
    if done.returncode != 0:
        return {"data": data, "optimizer": optimizer, "error": done.stderr.strip().splitlines()[-1:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    # The 1-minute load average before and after: the machine may be shared (other jobs' load
    # slows every figure, multi-threaded ones most).
    result["loadavg"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result


def report(row: dict) -> str:
    if "error" in row:
        return f"{row['label']:>10} {row['optimizer']:>11}  failed: {row['error']}"
    cpu = f" (CPU {row['cpu_s_per_batch']:.4f})" if "cpu_s_per_batch" in row else ""
    checkpoint = (f"  checkpoint {row['checkpoint_s']:.1f} s / {row['checkpoint_bytes'] / 2**20:,.0f} MiB"
                  if "checkpoint_s" in row else "")
    line = (f"{row['label']:>10} {row['optimizer']:>11} {row['s_per_batch']:9.4f}{cpu} {row['step_s']:9.4f} "
            f"{row['round_s_extrapolated']:10.1f}* {row['build_s']:8.1f} {row['peak_rss_mib']:9,.0f} "
            f"{row['bytes_per_round'] / 2**20:9.1f}{checkpoint}  load {'/'.join(f'{a:.1f}-{b:.1f}' for a, b in row['loadavg'])}")
    ev = row.get("evaluation")
    if ev:
        line += (f"   eval full {ev['eval_full_s_extrapolated']:,.0f}* s, sampled K={ev['eval_candidates']} "
                 f"{ev['eval_sampled_s_extrapolated']:,.1f}* s ({ev['test_queries']:,} queries)")
    return line


def series(sources: list[tuple[str, dict]]) -> list[dict]:
    """The curves of one or more bench_scale JSONs: per (source, optimizer), the synthetic rows'
    entities against their wall seconds per batch, extrapolated round seconds and peak RSS, and
    the reference folder's (FB15k-237-Fed3) seconds per batch at the same shape, if measured."""
    curves = []
    for name, report in sources:
        rows = [r for r in report["rows"] if "error" not in r]
        clients = report["settings"]["clients"]
        for optimizer in dict.fromkeys(r["optimizer"] for r in rows):
            mine = sorted((r for r in rows if r["optimizer"] == optimizer and r.get("entities")),
                          key=lambda r: r["entities"])
            reference = [r["s_per_batch"] for r in rows if r["optimizer"] == optimizer and not r.get("entities")]
            if not mine:
                continue
            curves.append({"label": f"{optimizer}, {clients} clients ({name})",
                           "entities": [r["entities"] for r in mine],
                           "s_per_batch": [r["s_per_batch"] for r in mine],
                           "round_s": [r["round_s_extrapolated"] for r in mine],
                           "peak_rss_mib": [r["peak_rss_mib"] for r in mine],
                           "reference_s_per_batch": reference[0] if reference else None})
    return curves


def plot(sources: list[tuple[str, dict]], path: Path) -> str:
    """Draw :func:`series` of ``sources`` into ``path`` (PNG): seconds per batch, extrapolated
    seconds per round and peak RSS against entities, log-log; a dashed line per curve at the
    reference folder's seconds per batch. Returns what was done (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'lightning-fedkg[plot]'): no plot, the JSON only"
    curves = series(sources)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("s_per_batch", "seconds per batch (wall)"), ("round_s", "seconds per round (extrapolated)"),
              ("peak_rss_mib", "peak RSS (MiB)"))
    for ax, (key, title) in zip(axes, panels):
        for c in curves:
            line, = ax.plot(c["entities"], c[key], marker="o", label=c["label"])
            if key == "s_per_batch" and c["reference_s_per_batch"] is not None:
                ax.axhline(c["reference_s_per_batch"], color=line.get_color(), linestyle="--", linewidth=0.8)
        ax.set(xscale="log", yscale="log", xlabel="entities", title=title)
        ax.grid(True, which="both", linewidth=0.3)
    axes[0].legend(fontsize=7, title="dashed: FB15k-237-Fed3, same shape", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot:
        sources = [(Path(f).stem, json.loads(Path(f).read_text())) for f in args.plot]
        print(plot(sources, Path(args.plot_out)))
        return 0
    if args.one:
        print(json.dumps(measure(args, *args.one, evaluate=args.evaluate)))
        return 0
    import platform

    import torch

    rows, generated = [], {}
    print(f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}; "
          f"dim {args.dim}, batch {args.batch_size}, {args.negatives} shared negatives, {args.clients} clients, "
          f"{args.batches} batches per local epoch", flush=True)
    print(f"{'data':>10} {'optimizer':>11} {'s/batch':>9} {'step s':>9} {'round s':>11} {'build s':>8} "
          f"{'peak MiB':>9} {'MiB/round':>9}  (* extrapolated; medians of {args.repeat} runs; 1-min load "
          f"before-after each)", flush=True)
    targets = [(f"{n:.0e}".replace("+0", ""), n) for n in args.sizes]
    if args.reference:
        targets.append((Path(args.reference).name, None))
    for label, entities in targets:
        if entities is None:
            data = args.reference
        else:
            folder, seconds = synthetic_folder(args, entities)
            data, generated[label] = str(folder), seconds
        for i, optimizer in enumerate(args.optimizers):
            evaluate = args.evaluate and i == len(args.optimizers) - 1
            row = run_repeats(args, data, optimizer, evaluate)
            row["label"] = label
            if entities is not None:
                row["entities"] = entities
            rows.append(row)
            print(report(row), flush=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("one", "json_out")}
    out = {"settings": settings, "synthetic_generation_s": generated, "rows": rows,
           "torch": torch.__version__, "note": "round_s_extrapolated and eval_*_extrapolated are extrapolated "
                                               "from bounded rounds and bounded evaluations"}
    if args.json_out:
        path = Path(args.json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        print(f"wrote {path}; " + plot([(path.stem, out)], path.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
