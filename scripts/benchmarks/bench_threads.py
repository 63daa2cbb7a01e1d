#!/usr/bin/env python
"""Time ``fedkg fit`` with different ``trainer.threads``, on a quiet machine and under load.

Every run is a fresh ``fedkg fit`` process (``python -m lightning_fedkg.cli fit -c CONFIG
--out <tmp> ...``): torch's thread pools are per process and fixed once work starts. For
each config, each load level and each thread variant it records

* ``wall s``: the whole command, imports, data loading and the final test included;
* ``cpu s``: the child's user + system CPU seconds (``os.wait4``);
* ``threads``: the intra-op thread count the child actually ran with (printed by a
  wrapper around ``lightning_fedkg.cli.main``), so ``unset`` shows what the default chose;
* the weighted test MRR from the run's ``metrics.json``;
* ``load1``: the 1-minute load average (``os.getloadavg``) when the run started;
* ``others``: the CPU seconds that other processes used during the run, read from
  ``/proc/stat`` (all CPU time of the machine minus the child's). On a quiet run this is
  what an unrelated job cost us; the load average lags by about a minute and includes our
  own previous run, so this is the sharper witness. A quiet run (``--load 0``) whose
  others exceed ``--disturbed`` x its wall seconds is marked disturbed and repeated (at most
  ``--retries`` times); the summary uses its undisturbed runs when it has any.

Variants: ``1``, ``2``, ... set ``trainer.threads``; ``unset`` leaves it to the default.
Load: ``--load N`` starts N busy-loop Python processes before a block of runs and kills
them after it (each also exits by itself after ``--load-seconds``); ``0`` is the quiet
machine. ``--duty 0.5`` makes each of them busy half of every 0.1 s (a 1-minute load
average of about 0.5 each). The order is repeat > load level > config > variant, and the
variant order rotates from repeat to repeat, so no variant always runs first (or right
after the load starts).

    python scripts/benchmarks/bench_threads.py --repeats 3                         # both UMLS quick starts, 10 rounds
    python scripts/benchmarks/bench_threads.py --load 0 --variants 1,2 -c configs/fede/umls_fede.yaml -- model.dim=512
    python scripts/benchmarks/bench_threads.py --load 1 --duty 0.5 --variants 1,2 --rounds 1 \\
        -c configs/fede/fb15k237_fed3_fede.yaml -- federated.local_epochs=1 model.dim=32
    python scripts/benchmarks/bench_threads.py --load 0,1 --warmup 60 --settle 0.3 \\
        --variants unset,1,2   # the default's choice

``--warmup`` lets the load average see the load before a block's first run (it trails by
about a minute), ``--settle`` lets it forget our own previous run before a quiet one: both
matter for ``unset``, whose thread count follows the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)
DEFAULT_CONFIGS = [str(REPO / "configs" / "fede" / "umls_fede.yaml"),
                   str(REPO / "configs" / "fedlu" / "umls_fedlu.yaml")]

#: Runs the CLI and reports the thread count the run used (the pools are fixed by then).
WRAPPER = """
import sys, torch
from lightning_fedkg.cli import main
status = main(sys.argv[1:])
print("BENCH_THREADS", torch.get_num_threads(), flush=True)
sys.exit(status)
"""

#: One load process: busy for ``duty`` of every 0.1 s (1.0 = always), for at most ``seconds``.
BUSY = """
import time
end, period, duty = time.monotonic() + {seconds}, 0.1, {duty}
while time.monotonic() < end:
    start = time.monotonic()
    while time.monotonic() - start < duty * period:
        pass
    if duty < 1:
        time.sleep((1 - duty) * period)
"""


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal (guest time is counted in user)
    values = [int(v) for v in fields[1:9]]
    busy = values[0] + values[1] + values[2] + values[5] + values[6] + values[7]
    return busy / os.sysconf("SC_CLK_TCK")


def start_load(n: int, seconds: float, duty: float = 1.0) -> list[subprocess.Popen]:
    code = BUSY.format(seconds=seconds, duty=duty)
    return [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def settle(level: float, max_seconds: float) -> None:
    """Wait until the 1-minute load average is at most ``level`` (at most ``max_seconds``)."""
    deadline = time.monotonic() + max_seconds
    while os.getloadavg()[0] > level and time.monotonic() < deadline:
        time.sleep(2.0)


def run_once(config: str, variant: str, overrides: list[str], work: Path, tag: str, timeout: float) -> dict:
    """One ``fedkg fit`` in a fresh process; its wall/CPU seconds, threads and test MRR."""
    out = work / tag
    cmd = [sys.executable, "-c", WRAPPER, "fit", "-c", config, "--out", str(out), *overrides]
    if variant != "unset":
        cmd.append(f"trainer.threads={int(variant)}")
    log_path = work / f"{tag}.log"
    load1 = os.getloadavg()[0]
    busy0 = busy_cpu_seconds()
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
        deadline = start + timeout
        status, usage = 0, None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    busy1 = busy_cpu_seconds()
    cpu = usage.ru_utime + usage.ru_stime
    text = log_path.read_text(errors="replace")
    threads = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("BENCH_THREADS")), None)
    why = next((line.split("threads: ", 1)[1] for line in text.splitlines()
                if "lightning_fedkg.runtime" in line and "threads: " in line), None)
    mrr = None
    metrics = out / "metrics.json"
    if proc.returncode == 0 and metrics.is_file():
        mrr = json.loads(metrics.read_text()).get("test", {}).get("mrr")
    return {
        "config": config, "variant": variant, "returncode": proc.returncode, "wall_s": wall, "cpu_s": cpu,
        "threads": threads, "threads_why": why, "test_mrr": mrr, "load1_start": load1,
        "load1_end": os.getloadavg()[0],
        "others_cpu_s": None if busy0 is None or busy1 is None else max(0.0, busy1 - busy0 - cpu),
        "log": str(log_path) if proc.returncode else None,
        "log_tail": text[-2000:] if proc.returncode else None,
    }


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    keys = []
    for r in runs:
        k = (r["config"], r["load"], r["variant"])
        if k not in keys:
            keys.append(k)
    for config, load, variant in keys:
        group = [r for r in runs if (r["config"], r["load"], r["variant"]) == (config, load, variant)
                 and r["returncode"] == 0]
        clean = [r for r in group if not r.get("disturbed")]
        use = clean or group
        if not use:
            rows.append({"config": config, "load": load, "variant": variant, "n": 0})
            continue
        mrrs = sorted({round(r["test_mrr"], 4) for r in use if r["test_mrr"] is not None})
        rows.append({
            "config": config, "load": load, "variant": variant, "n": len(use),
            "disturbed_left_out": len(group) - len(clean) if clean else 0,
            "all_disturbed": not clean,
            "threads": sorted({r["threads"] for r in use if r["threads"] is not None}),
            "wall_s_median": statistics.median(r["wall_s"] for r in use),
            "wall_s_min": min(r["wall_s"] for r in use), "wall_s_max": max(r["wall_s"] for r in use),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in use),
            "test_mrr": mrrs,
            "load1": [min(r["load1_start"] for r in use), max(r["load1_start"] for r in use)],
            "others_cpu_s_max": max((r["others_cpu_s"] or 0.0) for r in use),
        })
    return rows


def print_summary(rows: list[dict]) -> None:
    header = (f"{'config':<22}{'load':>5}{'variant':>8}{'threads':>8}{'n':>3}{'wall s (median, min-max)':>27}"
              f"{'cpu s':>8}{'test MRR':>16}{'load1':>12}{'others':>8}")
    print("\nsummary (medians over the undisturbed runs; others = max CPU s of other processes in a run)")
    print(header)
    print("-" * len(header))
    for r in rows:
        name = Path(r["config"]).stem
        if not r["n"]:
            print(f"{name:<22}{r['load']:>5}{r['variant']:>8}{'-':>8}{0:>3}  all runs failed")
            continue
        wall = f"{r['wall_s_median']:.1f} ({r['wall_s_min']:.1f}-{r['wall_s_max']:.1f})"
        mrr = "/".join(f"{m:.4f}" for m in r["test_mrr"]) or "-"
        load = f"{r['load1'][0]:.1f}-{r['load1'][1]:.1f}"
        flag = " !" if r["all_disturbed"] else ""
        threads = ",".join(str(t) for t in r["threads"]) or "?"
        print(f"{name:<22}{r['load']:>5}{r['variant']:>8}{threads:>8}{r['n']:>3}{wall:>27}{r['cpu_s_median']:>8.1f}"
              f"{mrr:>16}{load:>12}{r['others_cpu_s_max']:>8.1f}{flag}")
    if any(r.get("all_disturbed") for r in rows):
        print("! every quiet run of this row was disturbed by other processes: its figures overstate the time")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", action="append", help="fedkg config; repeatable "
                   "(default: configs/fede/umls_fede.yaml and configs/fedlu/umls_fedlu.yaml)")
    p.add_argument("--variants", default="1,2,unset", help="trainer.threads values, 'unset' = the default "
                   "(default: %(default)s)")
    p.add_argument("--load", default="0,2", help="busy-loop processes beside the run, per block "
                   "(default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="runs per config, load and variant (default: 2)")
    p.add_argument("--rounds", type=int, default=10, help="sets federated.rounds; 0 = the config's (default: 10)")
    p.add_argument("--duty", type=float, default=1.0,
                   help="fraction of the time each load process is busy, in 0.1 s periods; 1 = a "
                        "busy loop, 0.5 = a core half used (default: %(default)s)")
    p.add_argument("--warmup", type=float, default=2.0,
                   help="seconds between starting the load and the first run of its block; 60 puts "
                        "a busy process at about 0.6 in the 1-minute load average (default: %(default)s)")
    p.add_argument("--settle", type=float, default=None, metavar="LOAD",
                   help="before each quiet run, wait until the 1-minute load average is at most LOAD "
                        "(our own previous run is in it for a minute or two; default: no wait)")
    p.add_argument("--settle-max", type=float, default=240.0,
                   help="longest wait for --settle, seconds (default: %(default)s)")
    p.add_argument("--load-seconds", type=float, default=1800.0,
                   help="each busy-loop process exits by itself after this long (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a run is killed (default: 900)")
    p.add_argument("--disturbed", type=float, default=0.25,
                   help="a quiet run is disturbed when other processes used more than this x its wall "
                        "seconds of CPU (default: %(default)s)")
    p.add_argument("--retries", type=int, default=2, help="extra attempts of a disturbed quiet run (default: 2)")
    p.add_argument("--work", help="folder for the run directories and logs (default: a temporary one)")
    p.add_argument("--json", dest="json_out", help="write every run and the summary here")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (after --)")
    args = p.parse_args(argv)
    configs = args.config or DEFAULT_CONFIGS
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v != "unset" and not (v.isdigit() and int(v) >= 1):
            p.error(f"--variants: {v!r} is neither a positive integer nor 'unset'")
    loads = [int(x) for x in args.load.split(",")]
    if not 0 < args.duty <= 1:
        p.error("--duty must be in (0, 1]")
    overrides = ([f"federated.rounds={args.rounds}"] if args.rounds else []) + list(args.overrides)

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_threads_"))
    work.mkdir(parents=True, exist_ok=True)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import torch  # only for the facts line; the runs are separate processes

    machine = {"cpus": cpus, "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
               "python": platform.python_version(), "torch": torch.__version__,
               "torch_default_threads": torch.get_num_threads()}
    print(f"{cpus} CPUs usable ({os.cpu_count()} in all), torch {torch.__version__} "
          f"(default {torch.get_num_threads()} threads), python {platform.python_version()}; work {work}")
    print(f"configs {', '.join(configs)}; variants {variants}; load {loads} (duty {args.duty}); "
          f"repeats {args.repeats}; "
          f"overrides {' '.join(overrides)}", flush=True)

    runs = []
    counter = 0
    for rep in range(args.repeats):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for load in loads:
            procs = start_load(load, args.load_seconds, args.duty) if load else []
            try:
                if procs:
                    time.sleep(args.warmup)  # the busy loops get going (and into the load average)
                for config in configs:
                    for variant in order:
                        for attempt in range(1 + (args.retries if load == 0 else 0)):
                            if load == 0 and args.settle is not None:
                                settle(args.settle, args.settle_max)
                            counter += 1
                            tag = f"run{counter:03d}_{Path(config).stem}_load{load}_t{variant}"
                            rec = run_once(config, variant, overrides, work, tag, args.timeout)
                            rec.update(repeat=rep, load=load, attempt=attempt)
                            others = rec["others_cpu_s"]
                            rec["disturbed"] = bool(load == 0 and others is not None
                                                    and others > args.disturbed * rec["wall_s"])
                            runs.append(rec)
                            mrr = f"{rec['test_mrr']:.4f}" if rec["test_mrr"] is not None else "-"
                            print(f"{Path(config).stem:<22} load {load} threads={variant:<6} -> {rec['threads']} "
                                  f"wall {rec['wall_s']:6.1f}s cpu {rec['cpu_s']:6.1f}s MRR {mrr} "
                                  f"load1 {rec['load1_start']:.2f} others {others if others is None else round(others, 1)}s"
                                  + (" DISTURBED" if rec["disturbed"] else "")
                                  + (f" [{rec['threads_why']}]" if variant == "unset" and rec["threads_why"] else "")
                                  + (f" FAILED rc={rec['returncode']} log {rec['log']}" if rec["returncode"] else ""),
                                  flush=True)
                            if not rec["disturbed"]:
                                break
            finally:
                stop_load(procs)

    rows = summarize(runs)
    print_summary(rows)
    if args.json_out:
        measure.write_json(args.json_out, {"machine": machine, "argv": sys.argv[1:], "overrides": overrides,
                                           "duty": args.duty, "runs": runs, "summary": rows}, indent=2)
        print(f"written {args.json_out}")
    return 1 if any(r["returncode"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
