#!/usr/bin/env python
"""Seconds per round with the clients one after the other vs side by side (``federated.clients``).

Runs one config ``--repeats`` times in each mode, alternating (local, ray, local, ray, ...)
in this process (``--modes``; ``ray-unpinned`` is the control that leaves every worker to
the OS, without :func:`~lightning_fedkg.runtime.place_workers`), Ray started once for all of
them (its start-up and the actors' are not in the figures). For each run it times every training round (``FederatedRun.train_round``: the
clients' local training and the server's aggregation) and every validation
(``FederatedRun.evaluate``), and prints the median training round over rounds 2.. (round 1
warms up; its time is printed too), the median validation, the test MRR (the two modes must agree exactly), each
worker's thread count, and the machine's 1-minute load average before and after. Sequential
runs also print each client's CPU seconds of local training per round, whose sum over the
largest bounds what running them side by side can gain, whatever the machine's load, and
what the same rounds would take side by side if the OS time-sliced those CPU seconds evenly
over the cores and no worker slowed another (the model); the summary says what share of the
model's speed each side-by-side mode reached. Every run also prints how busy the machine's
cores were during its training rounds 2.. (``/proc/stat``, all processes, Linux only): near
100% side by side means the rounds lose to slower work, not to idle cores.

    python scripts/benchmarks/bench_side_by_side.py -c configs/fede/umls_fede.yaml --rounds 12
    python scripts/benchmarks/bench_side_by_side.py -c configs/fedlu/umls_fedlu.yaml --rounds 12
    python scripts/benchmarks/bench_side_by_side.py --modes local,ray,ray-unpinned --repeats 3
    python scripts/benchmarks/bench_side_by_side.py -c configs/fede/fb15k237_fed10_fede.yaml --rounds 6 \
        --modes control,local,ray --control trainer.compile=false \
        data.name=../shared/data/FB15k-237-Fed10 model.dim=32

``control`` is a sequential run with the ``--control`` overrides added (e.g. the previous
default, to time a change of default against it); when it is among the modes, the summary's
ratios are against it instead of ``local``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)


def queued_exchange(self, round, stage, messages, wire, channel, timeout):
    """A trial form of ``RayClients.exchange``: the addressed clients start largest first
    (training triples), at most one per slot of ``self.threads`` cores, each on the slot the
    last one to finish freed; the replies are then read as there (``RayClients.replies``)."""
    from lightning_fedkg.federated.message import encode

    sent = {name: None if m.is_empty() else encode(m) for name, m in messages.items()}
    cores = self.core_ids or list(range(os.cpu_count() or 1))
    slots = [cores[i:i + self.threads] for i in range(0, len(cores) - self.threads + 1, self.threads)] or [cores]
    if not self.core_ids:
        slots = [None] * len(slots)
    queue = sorted(sent, key=lambda n: -self.work[n])
    free, pending, answers = list(slots), {}, {}
    while queue or pending:
        while queue and free:
            name, slot = queue.pop(0), free.pop(0)
            pending[self.actors[name].handle.remote(stage, sent[name], round, slot)] = (name, slot)
        (ref,), _ = self.ray.wait(list(pending), num_returns=1)
        name, slot = pending.pop(ref)
        answers[name] = self.ray.get(ref)
        free.append(slot)
    return self.replies(round, stage, sent, answers, wire, channel, timeout)


def cpu_jiffies() -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks of the whole machine so far (``/proc/stat``'s first line;
    idle and iowait count as not busy), or None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def timed_runs(config: str, overrides: list[str], mode: str, out: Path, control: list[str]) -> dict:
    import lightning_fedkg.runtime as runtime
    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.federation import FederatedRun
    from lightning_fedkg.run import fit

    from lightning_fedkg.federated.party import Party

    rounds, evals, fit_cpu, round_cpu, busy = [], [], {}, {}, [0, 0]
    train_round, evaluate, party_fit = FederatedRun.train_round, FederatedRun.evaluate, Party.fit

    def timed_fit(self, epochs):  # CPU seconds of each client's local training (this process only)
        start = time.process_time()
        try:
            return party_fit(self, epochs)
        finally:
            fit_cpu.setdefault(self.name, []).append(time.process_time() - start)
            round_cpu.setdefault(len(rounds), []).append(fit_cpu[self.name][-1])  # rounds ended so far

    def timed_train(self, r):
        start, ticks = time.perf_counter(), cpu_jiffies()
        try:
            return train_round(self, r)
        finally:
            rounds.append(time.perf_counter() - start)
            if ticks is not None and r > 1:  # how busy the machine's cores were, rounds 2 on
                now = cpu_jiffies()
                busy[0], busy[1] = busy[0] + now[0] - ticks[0], busy[1] + now[1] - ticks[1]

    def timed_evaluate(self, split, r, download=None):
        start = time.perf_counter()
        try:
            return evaluate(self, split, r, download)
        finally:
            if split == "val":
                evals.append(time.perf_counter() - start)

    clients = "ray" if mode.startswith("ray") else "local"
    extra = control if mode == "control" else []
    cfg = load_config(config, [*overrides, *extra, "trainer.progress_bar=false", f"federated.clients={clients}"])
    core_ids = runtime.machine_core_ids
    FederatedRun.train_round, FederatedRun.evaluate, Party.fit = timed_train, timed_evaluate, timed_fit
    if mode == "ray-unpinned":  # the control: the OS schedules the workers, as before placement
        runtime.machine_core_ids = lambda: None
    from lightning_fedkg.backends.ray.clients import RayClients

    exchange = RayClients.exchange
    if mode == "ray-queued":  # the trial: no more workers at once than cores, largest first
        RayClients.exchange = queued_exchange
    try:
        metrics = fit(cfg, out)
    finally:
        FederatedRun.train_round, FederatedRun.evaluate, Party.fit = train_round, evaluate, party_fit
        runtime.machine_core_ids = core_ids
        RayClients.exchange = exchange
    cpu = {name: statistics.median(v[1:] or v) for name, v in sorted(fit_cpu.items())}
    # What the same rounds would take side by side if the OS time-sliced the clients evenly
    # over the cores and no worker slowed another: each round's clients' CPU seconds through
    # shared_finish, plus the rest of the round (driver, aggregation) as measured.
    cores = len(runtime.machine_core_ids() or range(os.cpu_count() or 1))
    model = [runtime.shared_finish(round_cpu[i], cores) + rounds[i] - sum(round_cpu[i])
             for i in range(len(rounds)) if i in round_cpu]
    return {"round": statistics.median(rounds[1:] or rounds), "first": rounds[0], "all": rounds, "rounds": len(rounds), "fit_cpu": cpu,
            "model": statistics.median(model[1:] or model) if model else None, "model_cores": cores,
            "validation": statistics.median(evals) if evals else float("nan"),
            "mrr": metrics["test"]["mrr"], "threads": metrics.get("client_workers", {}).get("threads"),
            "cores": metrics.get("client_workers", {}).get("cores"),
            "busy": busy[0] / busy[1] if busy[1] else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", default=str(REPO / "configs" / "fede" / "umls_fede.yaml"))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default="local,ray", help="comma-separated, alternated in this order: local "
                        "(sequential), ray (side by side, placed on cores by place_workers), ray-unpinned "
                        "(side by side, scheduled by the OS), ray-queued (a trial: side by side, no more at "
                        "once than cores, largest first), control (sequential, with --control)")
    parser.add_argument("--control", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of the control mode (repeatable), e.g. --control trainer.compile=false")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = parser.parse_args()

    import torch

    import ray
    from lightning_fedkg.backends.ray.peer import ray_session
    from lightning_fedkg.runtime import machine_load

    overrides = [f"federated.rounds={args.rounds}", f"federated.eval_every={args.eval_every}",
                 "federated.patience=1000", *args.overrides]
    load_before = machine_load()
    modes = args.modes.split(",")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with ray_session(ray, num_cpus=os.cpu_count() or 2), tempfile.TemporaryDirectory() as work:
        for i in range(args.repeats):
            for mode in modes:
                r = timed_runs(args.config, overrides, mode, Path(work) / f"{mode}{i}", args.control)
                results[mode].append(r)
                print(f"{mode:5s} run {i}: {r['round']:.3f} s/round (median of rounds 2-{r['rounds']}; round 1 {r['first']:.3f} s), "
                      f"validation {r['validation']:.3f} s, test MRR {r['mrr']:.6f}, "
                      f"driver threads {torch.get_num_threads()}, worker threads {r['threads']}"
                      + (f", cores {r['cores']}" if r["cores"] else ""), flush=True)
                print(f"      every round: {' '.join(f'{t:.2f}' for t in r['all'])} s"
                      + (f"; the machine's cores busy {r['busy']:.0%} of rounds 2-{r['rounds']}" if r["busy"] is not None
                         else ""), flush=True)
                if r["model"] is not None:
                    print(f"      the same rounds side by side, time-sliced evenly on {r['model_cores']} cores with no "
                          f"worker slowing another: {r['model']:.3f} s/round (the model)", flush=True)
                if r["fit_cpu"]:
                    cpu = list(r["fit_cpu"].values())
                    print(f"      CPU seconds of each client's local training per round: "
                          f"{' / '.join(f'{c:.3f}' for c in cpu)}; a round side by side can be at most "
                          f"{sum(cpu) / max(cpu):.2f}x shorter (sum / largest)", flush=True)
    load_after = machine_load()
    median = {m: statistics.median(r["round"] for r in rs) for m, rs in results.items()}
    same = {r["mrr"] for m, rs in results.items() if m != "control" for r in rs}
    control_mrr = sorted({r["mrr"] for r in results.get("control", [])})
    base_mode = "control" if "control" in median else "local"
    base = median.get(base_mode)
    rows = ", ".join(f"{m} {t:.3f} s/round" + (f" ({base / t:.2f}x)" if base and m != base_mode else "")
                     for m, t in median.items())
    print(f"{Path(args.config).name}: {rows}; test MRR {'identical' if len(same) == 1 else 'DIFFERS: ' + str(sorted(same))}"
          + (f" (control: {', '.join(f'{v:.6f}' for v in control_mrr)})" if control_mrr else "") + "; "
          f"load average {load_before:.2f} before, {load_after:.2f} after; {os.cpu_count()} cores")
    models = [r["model"] for r in results.get(base_mode, []) if r.get("model") is not None]
    if models and base:
        model = statistics.median(models)
        print(f"the model from the {base_mode} runs: {model:.3f} s/round ({base / model:.2f}x); side by side reached "
              + ", ".join(f"{m} {model / t:.0%} of it" for m, t in median.items() if m.startswith("ray")))


if __name__ == "__main__":
    main()
