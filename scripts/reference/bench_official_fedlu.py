#!/usr/bin/env python
"""Run the official FedLU code (nju-websoft/FedLU) unmodified on CPU and time it.

This is the reference side of the FedLU benchmarks. It contains none of the official code:
``--fedlu-dir`` names a checkout of https://github.com/nju-websoft/FedLU (the figures in
``docs/results/fedlu/official_fedlu_r10_transe.json`` are for commit 43d8cb5; the git blob ids of the files
that run are checked against that commit and reported). The harness starts
``<fedlu-dir>/Code/fedlu.py`` as a child process (``python -u``, working directory ``Code/``)
with the flags of the official ``Code/run_FedLU.sh`` (FedDist mode, co-distillation,
``--dist_mu 2.0 --agg weighted --max_epoch 3 --hidden_dim 256 --learning_rate 1e-4
--valid_iter 5 --early_stop_iter 3 --wait_iter 20 --test_batch_size 8 --batch_size 512``)
and ``--client_num 10 --cpu_num 2 --gamma <--gamma> --max_iter <--rounds>``, with
``--local_file_dir`` the split (``<k>/{entities,relations}.dict`` and
``{train,valid,test,unlearn}.txt``) and ``--save_dir`` a temporary folder (removed afterwards).
``--cuda`` is not passed. Every effective flag, as the official code itself prints it
(``args of client 0 Namespace(...)``), is recorded in the JSON.

Environment shim (nothing of the official files is edited or copied). The child gets a
generated ``sitecustomize.py`` in a temporary folder prepended to ``PYTHONPATH``; at
interpreter start it
  * sets ``torch.set_num_threads(--threads)`` and ``torch.set_num_interop_threads(--threads)``
    (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` are set to the same in the environment);
  * when ``torch.cuda.is_available()`` is false, replaces ``torch.Tensor.cuda`` and
    ``torch.nn.Module.cuda`` by functions that return ``self``: in FedDist mode the official
    ``KGEModel.__init__`` / ``update_model_embedding`` call ``.cuda()`` unconditionally
    (``entity_embedding.clone().cuda()``), which raises "Torch not compiled with CUDA enabled"
    on a CPU-only torch; with ``--cuda`` absent nothing else moves to a device;
  * wraps methods of the official ``Client`` (``__init__``, ``init_model``, ``train``,
    ``valid``, ``test``, ``update_model``, ``save_model``, ``load_model``) and ``Server``
    (``__init__``, ``generate_global_embedding``, ``assign_embedding``,
    ``aggregate_embedding``) right after ``client.py`` / ``server.py`` from ``Code/`` are
    imported, so that each call writes ``@@FEDLU_BENCH <Class.method>:<begin|end> <client>
    <unix time>`` to stderr. The wrappers pass arguments and results through untouched and
    draw no random numbers; they only mark phase boundaries that the official output does not
    print (the end of setup, aggregation, checkpoint saving, the final checkpoint reload).
  * only where they are missing (numpy >= 2, no Tk; e.g. on the GPU machine): aliases for
    what the official files import under old names: ``numpy.in1d`` (= ``numpy.isin``),
    ``numpy.lib.function_base.copy`` (= ``numpy.copy``), and an empty ``turtle.left`` (an
    unused import in ``server.py``).
``--extra --cuda`` runs it on the GPU as its authors did (no ``.cuda`` replacement then).
Also set for the child: ``PYTHONHASHSEED`` (``--hashseed``, default 0): ``Server.load_entities``
orders the global entity table by ``list(set(<entity names>))``, so without a fixed string hash
seed every run maps entities to different rows of the (seeded) global initial embedding.
With ``--pin auto`` (default) the child and its DataLoader worker processes are pinned to
``--threads`` CPU(s) (``sched_setaffinity``): ``--cpu_num 2`` gives every DataLoader one worker
process, which would otherwise prepare evaluation batches on a second core in parallel.

What is measured (child's stdout+stderr are read line by line and each line is timestamped):
  * setup: interpreter start and imports, ``Server`` (global entity index), data loading per
    client (``Client.__init__``), and per client ``init_model``, which builds the model and
    iterates every training DataLoader once: the official code pre-draws all training batches
    with their negatives (train, and the unlearn/retain sets of the unlearning stage) into
    Python lists at this point;
  * the test of all clients before training (``pipeline`` tests before the first round);
  * per round: each client's ``train`` (``max_epoch`` epochs over its pre-drawn batches,
    local step + global "transfer" step per batch), validation when ``iter % valid_iter == 0``
    (per client: local ``test_step`` and ``global_test`` on the validation set), checkpoint
    saving, and aggregation (``aggregate_embedding`` + ``assign_embedding`` + ``update_model``);
  * the final test (checkpoint reload + test of all clients), which the official code runs on
    the checkpoint of each client's best local validation MRR;
  * memory: the child's peak RSS (``VmHWM``, polled every second), the peak of the summed RSS
    of the child and its DataLoader workers, and ``getrusage(RUSAGE_CHILDREN).ru_maxrss``;
  * metrics parsed from the official log: the test blocks (weighted MRR / MR / Hits@1,3,10 of
    the local embeddings, what the paper reports), the local and global validation blocks,
    and each client's mean training losses per round.
``--time-limit S`` ends the child (SIGTERM to its process group) after S seconds and writes
what was measured so far; per-batch training cost is then extrapolated to a whole round from
the clients that finished (``2 * ceil(train / batch_size) * max_epoch`` batches per client).

``--reestimate JSON`` recomputes those estimates (and the data summary) in an existing JSON.

``docs/results/fedlu/official_fedlu_r10_transe.json`` came from (one thread, 45-minute limit; the run covers
setup, the complete initial test and two clients' training of round 0):

    python scripts/reference/bench_official_fedlu.py --fedlu-dir /work/fedlu_official \\
        --python /work/venv_fedlu/bin/python --rounds 1 --threads 1 --time-limit 2700 \\
        --out docs/results/fedlu/official_fedlu_r10_transe.json
    python scripts/reference/bench_official_fedlu.py --fedlu-dir /work/fedlu_official \\
        --reestimate docs/results/fedlu/official_fedlu_r10_transe.json

The interpreter given by ``--python`` needs what ``Code/fedlu.py`` imports: torch, numpy < 2
(``server.py`` imports ``numpy.lib.function_base``, ``dataloader.py`` uses ``np.in1d``),
scikit-learn, Levenshtein (and tkinter, for ``server.py``'s ``from turtle import left``).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from lightning_fedkg.measure import git_blob_id, repo_root, write_json

REPO = repo_root(__file__)

# git blob ids of the official files at nju-websoft/FedLU commit 43d8cb5ee32c4fbfb38304e67f777b9c3993ccb0
OFFICIAL_COMMIT = "43d8cb5ee32c4fbfb38304e67f777b9c3993ccb0"
OFFICIAL_BLOBS = {
    "fedlu.py": "95669fc1f1773d212c0f0fd7a07c737bf64547a0",
    "client.py": "eac75683365a34320ac757688d143d4018bb6c35",
    "model.py": "4ecbe8ea5e84df9b9661b62e1fe8750aa6d38953",
    "dataloader.py": "53c389ac893ee9b2c59e55c4a601d93bf8a883b7",
    "server.py": "31224913d5973a43496293a6ee8c78fb4488e4d6",
    "run_FedLU.sh": "cfd3a6c97a44c7f0239a09c7d1541078d7682e5a",
}

MARK = "@@FEDLU_BENCH"

SHIM = r'''
# Generated by lightning_fedkg scripts/reference/bench_official_fedlu.py; see its docstring.
import functools as _ft
import importlib.abc as _iabc
import os as _os
import sys as _sys
import time as _time


def _compat_imports():
    # The official code was written for numpy 1.x and a desktop Python: server.py imports
    # numpy.lib.function_base (private since numpy 2) and turtle (an unused IDE auto-import
    # that needs Tk), dataloader.py calls np.in1d (removed in numpy 2.4). Where these are
    # missing, provide exactly what it uses: the same functions under the old names.
    import types
    import numpy
    if not hasattr(numpy, "in1d"):
        numpy.in1d = numpy.isin
    try:
        import numpy.lib.function_base  # noqa: F401
    except Exception:
        module = types.ModuleType("numpy.lib.function_base")
        module.copy = numpy.copy
        _sys.modules["numpy.lib.function_base"] = module
    try:
        import turtle  # noqa: F401
    except Exception:
        module = types.ModuleType("turtle")
        module.left = None  # imported, never used
        _sys.modules["turtle"] = module


def _fedlu_bench_install():
    threads = int(_os.environ.get("FEDLU_BENCH_THREADS", "1"))
    code_dir = _os.path.realpath(_os.environ["FEDLU_BENCH_CODE_DIR"])
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass
    _compat_imports()
    if not torch.cuda.is_available():
        def _tensor_cuda(self, *args, **kwargs):
            return self

        def _module_cuda(self, *args, **kwargs):
            return self

        torch.Tensor.cuda = _tensor_cuda
        torch.nn.Module.cuda = _module_cuda

    def emit(event, who):
        # wall clock, and CPU seconds of this process plus its reaped children (DataLoader
        # workers are joined when their loader is exhausted)
        cpu = sum(_os.times()[:4])
        _sys.stderr.write("@@FEDLU_BENCH %s %s %.6f %.3f\n" % (event, who, _time.time(), cpu))
        _sys.stderr.flush()

    def wrap(cls, meth):
        orig = getattr(cls, meth)
        label = "%s.%s" % (cls.__name__, meth)

        @_ft.wraps(orig)
        def wrapper(self, *args, **kwargs):
            if meth == "__init__":
                who = args[0] if (cls.__name__ == "Client" and args) else "-"
            else:
                who = getattr(self, "name", "-")
            emit(label + ":begin", who)
            out = orig(self, *args, **kwargs)
            emit(label + ":end", who)
            return out

        setattr(cls, meth, wrapper)

    targets = {
        "client": ("Client", ["__init__", "init_model", "train", "valid", "test",
                              "update_model", "save_model", "load_model"]),
        "server": ("Server", ["__init__", "generate_global_embedding", "assign_embedding",
                              "aggregate_embedding"]),
    }

    class Finder(_iabc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in targets:
                return None
            for finder in _sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            origin = _os.path.realpath(spec.origin or "")
            if _os.path.dirname(origin) != code_dir or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module
            cls_name, meths = targets[name]

            def exec_and_wrap(module):
                exec_module(module)
                cls = getattr(module, cls_name)
                for meth in meths:
                    wrap(cls, meth)

            spec.loader.exec_module = exec_and_wrap
            return spec

    _sys.meta_path.insert(0, Finder())
    emit("shim:installed", "-")


if "FEDLU_BENCH_CODE_DIR" in _os.environ:
    _fedlu_bench_install()
'''

# run_FedLU.sh's flags (its --client_num is the number of client folders, here 10; --cpu_num 2).
RUN_FEDLU_FLAGS = [
    "--fed_mode", "FedDist",
    "--co_dist",
    "--dist_mu", "2.0",
    "--agg", "weighted",
    "--max_epoch", "3",
    "--hidden_dim", "256",
    "--learning_rate", "1e-4",
    "--valid_iter", "5",
    "--early_stop_iter", "3",
    "--wait_iter", "20",
    "--test_batch_size", "8",
    "--batch_size", "512",
    "--cpu_num", "2",
]

BLOCK_RE = re.compile(r"^(test|local valid|global valid) in Iter (\d+)$")
CLIENT_RE = re.compile(r"^Log of Client (\d+)$")
KV_BLOCK_RE = re.compile(r"^([A-Za-z@0-9_]+):([-+0-9.eEnaif]+)$")
TRAIN_RE = re.compile(r"^([a-z_]+): ([-+0-9.eEnaif]+)$")
TRANSFER_RE = re.compile(r"^tranfer ([a-z_]+):([-+0-9.eEnaif]+)$")
ARGS_RE = re.compile(r"^args of client (\d+) (Namespace\(.*\))$")


def parse_namespace(text: str) -> dict:
    call = ast.parse(text, mode="eval").body
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def proc_status(pid: int) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    key, val = line.split(":", 1)
                    out[key] = int(val.split()[0])  # kB
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
            except OSError:
                kids = []
            found.extend(kids)
            todo.extend(kids)
    return found


class MemPoller(threading.Thread):
    def __init__(self, pid: int, every: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.stop_evt = threading.Event()
        self.vm_hwm_kb = 0
        self.tree_rss_peak_kb = 0
        self.max_procs = 0

    def run(self):
        while not self.stop_evt.is_set():
            st = proc_status(self.pid)
            if not st:
                break
            self.vm_hwm_kb = max(self.vm_hwm_kb, st.get("VmHWM", 0))
            pids = descendants(self.pid)
            total = st.get("VmRSS", 0) + sum(proc_status(p).get("VmRSS", 0) for p in pids)
            self.tree_rss_peak_kb = max(self.tree_rss_peak_kb, total)
            self.max_procs = max(self.max_procs, 1 + len(pids))
            self.stop_evt.wait(self.every)


def child_versions(python: str) -> dict:
    code = ("import json,sys,numpy,torch,sklearn,scipy,Levenshtein;"
            "print(json.dumps({'python':sys.version.split()[0],'torch':torch.__version__,"
            "'numpy':numpy.__version__,'scipy':scipy.__version__,'scikit-learn':sklearn.__version__,"
            "'Levenshtein':getattr(Levenshtein,'__version__','?')}))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        return {"error": repr(exc)}


def summarize_data(data_dir: Path) -> dict:
    out = {}
    for k in sorted(int(p.name) for p in data_dir.iterdir() if p.is_dir() and p.name.isdigit()):
        d = data_dir / str(k)
        out[str(k)] = {n: count_lines(d / f"{n}.txt") for n in ("train", "valid", "test", "unlearn")}
        out[str(k)]["entities"] = count_lines(d / "entities.dict")
        out[str(k)]["relations"] = count_lines(d / "relations.dict")
    return out


def estimates(r: dict) -> dict:
    """Whole-run costs from the measured parts (for runs stopped by --time-limit)."""
    clients = r["data"]["clients"]
    n_test = sum(v["test"] for v in clients.values())
    n_valid = sum(v["valid"] for v in clients.values())
    args = r.get("effective_args") or {}
    valid_iter = int(args.get("valid_iter", 5))
    est: dict = {"note": "validation = local test_step + global_test over the validation triples "
                         "(both directions), so ~2 x the initial test scaled by valid/test triples; "
                         "final test ~ initial test; rounds at the measured s/batch of round 0, which "
                         "has no distillation (it switches on only after a validation without "
                         "improvement, and then adds a forward pass per step)"}
    it = r.get("initial_test")
    if it and it.get("complete"):
        rows = 2 * n_test
        est["eval_ranked_rows_test"] = rows
        est["eval_ms_per_ranked_row"] = round(it["total_s"] / rows * 1e3, 2)
        est["eval_cpu_ms_per_ranked_row"] = round(it["total_cpu_s"] / rows * 1e3, 2)
        est["validation_s"] = round(2 * it["total_s"] * n_valid / n_test, 1)
        est["validation_cpu_s"] = round(2 * it["total_cpu_s"] * n_valid / n_test, 1)
        est["final_test_s"] = it["total_s"]
    tc = r.get("training_cost")
    if tc:
        est["round_train_s"] = tc["estimated_train_s_per_round"]
        est["round_train_cpu_s"] = tc["estimated_train_cpu_s_per_round"]
    setup = (r.get("setup") or {}).get("total_s")
    if tc and setup is not None and "validation_s" in est:
        full = {}
        for rr in (1, 5, 6, 10, 200):
            nval = len(range(0, rr, valid_iter))
            full[str(rr)] = round(setup + it["total_s"] + rr * est["round_train_s"]
                                  + nval * est["validation_s"] + est["final_test_s"], 0)
        est["full_run_s_by_max_iter"] = full
    return est


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fedlu-dir", required=True, type=Path, help="official checkout root (holds Code/)")
    ap.add_argument("--data", type=Path, default=REPO / ".." / "shared" / "data" / "FB15k-237-R10")
    ap.add_argument("--model", default="TransE")
    ap.add_argument("--gamma", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=6, help="their --max_iter")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pin", default="auto",
                    help="'auto' (pin the child to the last --threads CPUs: give runs that overlap distinct "
                         "ids instead), 'none', or CPU ids '0,1'")
    ap.add_argument("--hashseed", default="0", help="PYTHONHASHSEED for the child")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the official code")
    ap.add_argument("--out", type=Path, default=None, help="JSON path")
    ap.add_argument("--log", type=Path, default=None, help="also write the timestamped child log here")
    ap.add_argument("--time-limit", type=float, default=0.0, help="seconds; 0 = none")
    ap.add_argument("--keep-save-dir", action="store_true")
    ap.add_argument("--reestimate", type=Path, default=None,
                    help="recompute the 'data' and 'estimates' sections of an existing JSON and rewrite it")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                    help="further flags for fedlu.py, appended last (argparse: last one wins)")
    return ap


def reestimate(path: Path, data: Path) -> int:
    """``--reestimate``: the data summary and the estimates of an existing JSON, recomputed."""
    res = json.loads(path.read_text())
    ddir = Path((res.get("effective_args") or {}).get("local_file_dir") or data).resolve()
    res["data"] = {"dir": str(ddir), "clients": summarize_data(ddir)}
    res["estimates"] = estimates(res)
    for rd in res.get("rounds", []):
        rd["losses"] = {k: v for k, v in rd["losses"].items() if v.get("local") or v.get("transfer")}
    write_json(path, res)
    print(json.dumps(res["estimates"], indent=1))
    return 0


def official_files(code_dir: Path) -> dict:
    """Each file of :data:`OFFICIAL_BLOBS` in ``code_dir``: its git blob id and whether it is
    the file at commit 43d8cb5."""
    blobs = {}
    for name, expected in OFFICIAL_BLOBS.items():
        p = code_dir / name
        got = git_blob_id(p) if p.is_file() else None
        blobs[name] = {"blob": got, "matches_43d8cb5": got == expected}
    return blobs


def write_shim(tmp: Path) -> Path:
    """The folder holding the generated ``sitecustomize.py`` (:data:`SHIM`)."""
    shim_dir = tmp / "shim"
    shim_dir.mkdir()
    (shim_dir / "sitecustomize.py").write_text(SHIM)
    return shim_dir


def fedlu_flags(a: argparse.Namespace, data_dir: Path, save_dir: Path, n_clients: int) -> list[str]:
    """``fedlu.py``'s flags: run_FedLU.sh's, then this run's, then ``--extra`` (the last wins)."""
    return (["--local_file_dir", str(data_dir), "--save_dir", str(save_dir), "--model", a.model]
            + RUN_FEDLU_FLAGS
            + ["--client_num", str(n_clients), "--gamma", str(a.gamma), "--max_iter", str(a.rounds)]
            + list(a.extra))


def child_env(a: argparse.Namespace, shim_dir: Path, code_dir: Path) -> dict:
    """The official code's environment: ours, with the shim's folder first on ``PYTHONPATH``
    (the interpreter imports its ``sitecustomize.py`` at start: the shim reaches the
    unmodified official code that way) and the thread, hash-seed and marker settings."""
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": str(shim_dir) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        "FEDLU_BENCH_CODE_DIR": str(code_dir),
        "FEDLU_BENCH_THREADS": str(a.threads),
        "OMP_NUM_THREADS": str(a.threads),
        "MKL_NUM_THREADS": str(a.threads),
        "PYTHONHASHSEED": str(a.hashseed),
        "PYTHONUNBUFFERED": "1",
    })
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def pinned_cpus(pin: str, threads: int) -> set[int] | None:
    """The CPUs ``--pin`` pins the child to (None: not pinned)."""
    if pin == "none":
        return None
    if pin == "auto":
        avail = sorted(os.sched_getaffinity(0))
        return set(avail[-threads:]) if threads < len(avail) else None
    return {int(x) for x in pin.split(",")}


class OfficialRun(NamedTuple):
    """What :func:`run_official` saw of the child: its timestamped output lines, its start and
    end (``time.time()``), its exit status, whether ``--time-limit`` stopped it, the memory
    poller and the harness's children's rusage."""

    lines: list[tuple[float, str]]
    t0: float
    t_end: float
    returncode: int
    stopped_by_limit: bool
    poller: MemPoller
    rusage: resource.struct_rusage


def kill_at(proc: subprocess.Popen, seconds: float) -> tuple[threading.Timer | None, dict]:
    """A timer that ends ``proc``'s process group (SIGTERM) after ``seconds`` (none if 0),
    and the flag it sets: ``{"by_limit": True}`` once it has fired."""
    killed = {"by_limit": False}

    def on_limit():
        killed["by_limit"] = True
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    timer = threading.Timer(seconds, on_limit) if seconds > 0 else None
    if timer:
        timer.daemon = True
        timer.start()
    return timer, killed


def follow(proc: subprocess.Popen, t0: float, n_clients: int, log: Path | None) -> list[tuple[float, str]]:
    """Read the child's output line by line until it ends: each line timestamped, written to
    ``log`` (seconds since ``t0``), and its progress (clients trained, tests, validations,
    metric blocks) printed."""
    lines: list[tuple[float, str]] = []
    logf = open(log, "w") if log else None
    n_train_done = 0
    assert proc.stdout is not None
    for raw in proc.stdout:
        t = time.time()
        line = raw.rstrip("\n")
        lines.append((t, line))
        if logf:
            logf.write(f"{t - t0:10.3f} {line}\n")
            logf.flush()
        if line.startswith(MARK):
            ev = line.split()[1]
            if ev == "Client.train:end":
                n_train_done += 1
                r, c = divmod(n_train_done - 1, n_clients)
                print(f"[{t - t0:8.1f}s] round {r} client {c} trained", flush=True)
            elif ev in ("Client.test:end", "Client.valid:end"):
                print(f"[{t - t0:8.1f}s] {ev} client {line.split()[2]}", flush=True)
        elif BLOCK_RE.match(line):
            print(f"[{t - t0:8.1f}s] {line}", flush=True)
    if logf:
        logf.close()
    return lines


def run_official(cmd: list[str], code_dir: Path, env: dict, cpus: set[int] | None, time_limit: float,
                 log: Path | None, n_clients: int) -> OfficialRun:
    """Start the official code in ``code_dir`` (its own session, pinned to ``cpus``), poll its
    memory, follow its output, and end it at ``time_limit`` (its workers too)."""
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=str(code_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1, start_new_session=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    poller = MemPoller(proc.pid)
    poller.start()
    timer, killed = kill_at(proc, time_limit)
    lines = follow(proc, t0, n_clients, log)
    rc = proc.wait()
    if timer:
        timer.cancel()
    # a limit may leave worker processes of the group behind
    if killed["by_limit"]:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    t_end = time.time()
    poller.stop_evt.set()
    poller.join(timeout=5)
    return OfficialRun(lines, t0, t_end, rc, killed["by_limit"], poller, resource.getrusage(resource.RUSAGE_CHILDREN))


def shim_record(env: dict, cpus: set[int] | None) -> dict:
    return {
        "sitecustomize": "Tensor.cuda/Module.cuda return self when CUDA is unavailable; "
                         "torch.set_num_threads/set_num_interop_threads(threads); "
                         "phase markers on Client/Server methods (stderr, no RNG, no changes)",
        "env": {k: env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED")},
        "pinned_cpus": sorted(cpus) if cpus else None,
    }


def memory_record(run: OfficialRun) -> dict:
    return {
        "child_peak_rss_mib_vmhwm": round(run.poller.vm_hwm_kb / 1024, 1),
        "tree_peak_rss_mib_summed": round(run.poller.tree_rss_peak_kb / 1024, 1),
        "ru_maxrss_children_mib": round(run.rusage.ru_maxrss / 1024, 1),
        "max_processes": run.poller.max_procs,
        "note": "VmHWM: the fedlu.py process (polled each second); summed: fedlu.py plus its "
                "DataLoader workers (shared-memory pages counted in each); ru_maxrss: largest "
                "single process among the harness's reaped children",
    }


def run_record(a: argparse.Namespace, cmd: list[str], flags: list[str], blobs: dict, versions: dict, env: dict,
               cpus: set[int] | None, run: OfficialRun, data_dir: Path, data_summary: dict) -> dict:
    """The JSON's fields beside :func:`analyse`'s: how the official code ran, where, and its memory."""
    return {
        "harness": "scripts/reference/bench_official_fedlu.py",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.t0)),
        "command": cmd,
        "fedlu_flags": flags,
        "official_code": {"repo": "https://github.com/nju-websoft/FedLU", "expected_commit": OFFICIAL_COMMIT,
                          "files": blobs, "unmodified": all(v["matches_43d8cb5"] for v in blobs.values())},
        "child_env": versions,
        "shim": shim_record(env, cpus),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": a.threads},
        "returncode": run.returncode,
        "stopped_by_time_limit": run.stopped_by_limit,
        "time_limit_s": a.time_limit or None,
        "wall_s": round(run.t_end - run.t0, 3),
        "cpu_s_children": round(run.rusage.ru_utime + run.rusage.ru_stime, 3),
        "timing_note": "wall times are affected by other jobs on this 2-core machine (the child is "
                       "pinned to one CPU); *_cpu_s are CPU seconds of fedlu.py plus its reaped "
                       "DataLoader workers over the same span (os.times in the shim's markers)",
        "memory": memory_record(run),
        "data": {"dir": str(data_dir), "clients": data_summary},
        "child_log_tail": [ln for _, ln in run.lines[-40:]],
    }


def main() -> int:
    ap = build_parser()
    a = ap.parse_args()
    if a.reestimate:
        return reestimate(a.reestimate, a.data)

    fedlu_dir = a.fedlu_dir.resolve()
    code_dir = fedlu_dir / "Code"
    data_dir = a.data.resolve()
    if not (code_dir / "fedlu.py").is_file():
        ap.error(f"{code_dir}/fedlu.py not found")
    clients = sorted(int(p.name) for p in data_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not clients:
        ap.error(f"no client folders in {data_dir}")
    blobs = official_files(code_dir)
    data_summary = summarize_data(data_dir)

    tmp = Path(tempfile.mkdtemp(prefix="bench_official_fedlu_"))
    shim_dir = write_shim(tmp)
    save_dir = tmp / "save"
    flags = fedlu_flags(a, data_dir, save_dir, len(clients))
    cmd = [a.python, "-u", str(code_dir / "fedlu.py")] + flags
    env = child_env(a, shim_dir, code_dir)
    cpus = pinned_cpus(a.pin, a.threads)

    versions = child_versions(a.python)
    print("child env:", versions, flush=True)
    print("command:", " ".join(cmd), flush=True)
    print("pinned to CPUs:", sorted(cpus) if cpus else "not pinned", flush=True)
    run = run_official(cmd, code_dir, env, cpus, a.time_limit, a.log, len(clients))

    result = analyse(run.lines, run.t0, run.t_end, len(clients), data_summary)
    result.update(run_record(a, cmd, flags, blobs, versions, env, cpus, run, data_dir, data_summary))
    result["estimates"] = estimates(result)
    if run.returncode != 0 and not run.stopped_by_limit:
        result["error_tail"] = [ln for _, ln in run.lines[-60:]]

    print_table(result)
    if a.out:
        write_json(a.out, result)
        print("wrote", a.out)
    if a.keep_save_dir:
        print("save dir kept:", save_dir)
        shutil.rmtree(shim_dir, ignore_errors=True)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if (run.returncode == 0 or run.stopped_by_limit) else 1


class BlockReader:
    """The metric blocks of the official log (``test in Iter k``, ``local valid ...``, ``global
    valid ...``): per client (``Log of Client i``) and weighted, up to a line of dashes."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.blocks: list[dict] = []
        self.current: dict | None = None
        self.target: dict | None = None

    def read(self, t: float, line: str) -> None:
        m = BLOCK_RE.match(line)
        if m:
            self.current = {"mode": m.group(1), "iter": int(m.group(2)), "t_s": round(t - self.t0, 3),
                            "clients": {}, "weighted": {}}
            self.blocks.append(self.current)
            self.target = None
            return
        if self.current is not None:
            m = CLIENT_RE.match(line)
            if m:
                self.target = self.current["clients"].setdefault(m.group(1), {})
                return
            if line == "Weight Averaged of All Clients":
                self.target = self.current["weighted"]
                return
            m = KV_BLOCK_RE.match(line)
            if m and self.target is not None:
                self.target[m.group(1)] = float(m.group(2))
                return
            if line.startswith("-" * 20):
                self.current = None


def parse_log(lines: list[tuple[float, str]], t0: float) -> tuple[list, list, list, dict | None]:
    """The child's output read back: the shim's markers ``(name, phase, who, time, cpu)``,
    the metric blocks (:class:`BlockReader`), each ``Client.train``'s logged losses, and the
    effective arguments the official code printed."""
    events = []  # (name, phase, who, t)
    blocks = BlockReader(t0)
    train_logs: list[dict] = []
    args_ns = None
    in_train = None  # index into train_logs while inside Client.train
    for t, line in lines:
        if line.startswith(MARK):
            _, ev, who, tc, cpu = line.split()
            name, phase = ev.rsplit(":", 1)
            events.append((name, phase, who, float(tc), float(cpu)))
            if name == "Client.train":
                if phase == "begin":
                    train_logs.append({"client": int(who), "local": {}, "transfer": {}})
                    in_train = len(train_logs) - 1
                else:
                    in_train = None
            continue
        m = ARGS_RE.match(line)
        if m and args_ns is None:
            try:
                args_ns = parse_namespace(m.group(2))
            except (SyntaxError, ValueError):
                args_ns = {"unparsed": m.group(2)}
            continue
        if in_train is not None:
            m = TRANSFER_RE.match(line)
            if m:
                train_logs[in_train]["transfer"][m.group(1)] = float(m.group(2))
                continue
            m = TRAIN_RE.match(line)
            if m:
                train_logs[in_train]["local"][m.group(1)] = float(m.group(2))
                continue
        blocks.read(t, line)
    return events, blocks.blocks, train_logs, args_ns


def pair_calls(events: list) -> list[dict]:
    """Begin and end markers paired into calls (``name``, ``who``, wall ``t0``/``t1``, CPU
    ``c0``/``c1``), in order of their start."""
    calls = []
    open_calls = {}
    for name, phase, who, tc, cpu in events:
        key = (name, who)
        if phase == "begin":
            open_calls[key] = (tc, cpu)
        elif phase == "end" and key in open_calls:
            (b, bc) = open_calls.pop(key)
            calls.append({"name": name, "who": who, "t0": b, "t1": tc, "c0": bc, "c1": cpu})
    calls.sort(key=lambda c: c["t0"])
    return calls


def dur(c: dict) -> float:
    return c["t1"] - c["t0"]


def cdur(c: dict) -> float:
    return c["c1"] - c["c0"]


def named(calls: list[dict], name: str) -> list[dict]:
    return [c for c in calls if c["name"] == name]


def setup_summary(calls: list[dict], init_tests: list[dict], t0: float) -> dict:
    """From the child's start to its first test: server, data loading, pre-sampling."""
    srv = named(calls, "Server.__init__")
    cinit = named(calls, "Client.__init__")
    minit = named(calls, "Client.init_model")
    return {
        "start_to_server_s": round(srv[0]["t0"] - t0, 3) if srv else None,
        "server_entity_index_s": round(dur(srv[0]), 3) if srv else None,
        "data_loading_s": round(sum(dur(c) for c in cinit), 3),
        "init_model_presampling_s": round(sum(dur(c) for c in minit), 3),
        "init_model_per_client_s": {c["who"]: round(dur(c), 3) for c in minit},
        "init_model_presampling_cpu_s": round(sum(cdur(c) for c in minit), 3),
        "total_s": round(init_tests[0]["t0"] - t0, 3) if init_tests else None,
        "total_cpu_s": round(init_tests[0]["c0"], 3) if init_tests else None,
        "note": "total = child start (interpreter, imports, Server, Client data, global init, "
                "init_model: model + every training DataLoader iterated once) to the first test",
    }


def eval_summary(group: list[dict], n_clients: int) -> dict | None:
    """One evaluation of every client (a group of ``Client.test`` calls): wall and CPU seconds."""
    if not group:
        return None
    return {"total_s": round(group[-1]["t1"] - group[0]["t0"], 3),
            "total_cpu_s": round(group[-1]["c1"] - group[0]["c0"], 3),
            "per_client_s": {c["who"]: round(dur(c), 3) for c in group},
            "per_client_cpu_s": {c["who"]: round(cdur(c), 3) for c in group},
            "complete": len(group) == n_clients}


def final_test_summary(final_tests: list[dict], loads: list[dict], n_clients: int) -> dict | None:
    """The final test, with the reload of the best checkpoints (``loads``) before it."""
    final = eval_summary(final_tests, n_clients)
    if final is not None:
        final["checkpoint_reload_s"] = round(sum(dur(c) for c in loads), 3)
        start = loads[0]["t0"] if loads else final_tests[0]["t0"]
        final["total_with_reload_s"] = round(final_tests[-1]["t1"] - start, 3)
    return final


def round_summaries(calls: list[dict], ctrain: list[dict], loads: list[dict], final_tests: list[dict],
                    train_logs: list[dict], n_clients: int, t_end: float) -> list[dict]:
    """Per round (``n_clients`` consecutive ``Client.train`` calls): training, validation,
    checkpoint saving and aggregation seconds up to the next round (or the final test), and
    each client's logged losses."""
    rounds = []
    # the last round ends where the final test's reload starts (or the test, or the child)
    last_stop = loads[0]["t0"] if loads else (final_tests[0]["t0"] if final_tests else t_end)
    for r in range(0, math.ceil(len(ctrain) / n_clients)):
        grp = ctrain[r * n_clients:(r + 1) * n_clients]
        start = grp[0]["t0"]
        nxt = ctrain[(r + 1) * n_clients]["t0"] if len(ctrain) > (r + 1) * n_clients else None
        stop = nxt if nxt is not None else last_stop

        def within(name):
            return [c for c in calls if c["name"] == name and start <= c["t0"] < stop]

        valid = within("Client.valid")
        saves = within("Client.save_model")
        agg = within("Server.aggregate_embedding") + within("Server.assign_embedding") + within("Client.update_model")
        rec = {
            "round": r,
            "complete": len(grp) == n_clients,
            "train_per_client_s": {c["who"]: round(dur(c), 3) for c in grp},
            "train_s": round(grp[-1]["t1"] - start, 3),
            "train_cpu_s": round(grp[-1]["c1"] - grp[0]["c0"], 3),
            "train_per_client_cpu_s": {c["who"]: round(cdur(c), 3) for c in grp},
            "valid_s": round(valid[-1]["t1"] - valid[0]["t0"], 3) if valid else None,
            "valid_cpu_s": round(valid[-1]["c1"] - valid[0]["c0"], 3) if valid else None,
            "valid_per_client_s": {c["who"]: round(dur(c), 3) for c in valid} if valid else None,
            "checkpoint_save_s": round(sum(dur(c) for c in saves), 3) if saves else None,
            "aggregation_s": round(sum(dur(c) for c in agg), 3) if agg else None,
            "wall_s": round(stop - start, 3) if (nxt is not None or loads or final_tests) else None,
            "losses": {str(tl["client"]): tl for tl in train_logs[r * n_clients:(r + 1) * n_clients]},
        }
        rec["losses"] = {k: v for k, v in rec["losses"].items() if v["local"] or v["transfer"]}
        for v in rec["losses"].values():
            v.pop("client", None)
        rounds.append(rec)
    return rounds


def training_cost(ctrain: list[dict], args_ns: dict | None, data_summary: dict) -> dict | None:
    """Seconds per training batch over the client rounds that finished, and a whole round
    extrapolated from them (None before the first ``Client.train`` ended)."""
    bs = int((args_ns or {}).get("batch_size", 512)) if isinstance(args_ns, dict) else 512
    ep = int((args_ns or {}).get("max_epoch", 3)) if isinstance(args_ns, dict) else 3
    batches = {k: 2 * math.ceil(v["train"] / bs) * ep for k, v in data_summary.items()}
    done = [(c["who"], dur(c), cdur(c)) for c in ctrain]
    if not done:
        return None
    sec = sum(d for _, d, _ in done)
    csec = sum(d for _, _, d in done)
    nb = sum(batches[w] for w, _, _ in done)
    per_batch = sec / nb
    per_batch_cpu = csec / nb
    return {
        "batches_per_round_per_client": batches,
        "batches_per_round": sum(batches.values()),
        "measured_client_rounds": len(done),
        "measured_batches": nb,
        "s_per_batch_pair": round(per_batch, 4),
        "cpu_s_per_batch_pair": round(per_batch_cpu, 4),
        "estimated_train_cpu_s_per_round": round(per_batch_cpu * sum(batches.values()), 1),
        "note": "one 'batch' = one pre-drawn (head- or tail-mode) batch: a local train_step and a "
                "global transfer_step; batches per client per round = 2*ceil(train/batch_size)*max_epoch",
        "estimated_train_s_per_round": round(per_batch * sum(batches.values()), 1),
    }


def metric_summary(blocks: list[dict]) -> dict:
    """The metric blocks by kind, the initial and final test (weighted over clients) and the
    weighted validation MRR of the local and global models per validation."""
    def pick(b):
        return {"iter": b["iter"], "t_s": b["t_s"], "weighted": b["weighted"], "clients": b["clients"]}

    metrics = {
        "tests": [pick(b) for b in blocks if b["mode"] == "test"],
        "local_valid": [pick(b) for b in blocks if b["mode"] == "local valid"],
        "global_valid": [pick(b) for b in blocks if b["mode"] == "global valid"],
    }
    tests = metrics["tests"]
    return {
        "metrics": metrics,
        "final_test_weighted": tests[1]["weighted"] if len(tests) > 1 else None,
        "initial_test_weighted": tests[0]["weighted"] if tests else None,
        "valid_weighted_mrr": [
            {"iter": lv["iter"], "local": lv["weighted"].get("MRR"), "global": gv["weighted"].get("MRR")}
            for lv, gv in zip(metrics["local_valid"], metrics["global_valid"])
        ],
    }


def analyse(lines, t0, t_end, n_clients, data_summary) -> dict:
    """Everything measured in the child's timestamped output: setup, the initial test, each
    round, the final test, the training cost per batch and the metrics."""
    events, blocks, train_logs, args_ns = parse_log(lines, t0)
    calls = pair_calls(events)
    out: dict = {"effective_args": args_ns}
    ctrain = named(calls, "Client.train")
    t_first_train = ctrain[0]["t0"] if ctrain else None
    ctest = named(calls, "Client.test")
    init_tests = [c for c in ctest if t_first_train is None or c["t1"] <= t_first_train][:n_clients]
    final_tests = [c for c in ctest if t_first_train is not None and c["t0"] > t_first_train]
    loads = named(calls, "Client.load_model")
    out["setup"] = setup_summary(calls, init_tests, t0)
    out["initial_test"] = eval_summary(init_tests, n_clients)
    out["final_test"] = final_test_summary(final_tests, loads, n_clients)
    out["rounds"] = round_summaries(calls, ctrain, loads, final_tests, train_logs, n_clients, t_end)
    cost = training_cost(ctrain, args_ns, data_summary)
    if cost is not None:
        out["training_cost"] = cost
    out.update(metric_summary(blocks))
    return out


def print_table(r: dict) -> None:
    def f(x, nd=1):
        return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    print("\n== official FedLU", "(stopped by time limit)" if r["stopped_by_time_limit"] else "",
          f"rc={r['returncode']}  wall {r['wall_s']:.1f}s")
    s = r["setup"]
    print(f"setup {f(s['total_s'])}s wall, {f(s['total_cpu_s'])}s CPU  (server index {f(s['server_entity_index_s'])}s, data {f(s['data_loading_s'])}s, "
          f"init_model/pre-sampling {f(s['init_model_presampling_s'])}s)")
    if r["initial_test"]:
        print(f"initial test {f(r['initial_test']['total_s'])}s wall, {f(r['initial_test']['total_cpu_s'])}s CPU"
              f"  complete={r['initial_test']['complete']}")
    print(f"{'round':>5} {'train s':>9} {'train cpu':>9} {'valid s':>9} {'valid cpu':>9} {'save s':>7} {'agg s':>7} {'wall s':>9}")
    for rd in r["rounds"]:
        print(f"{rd['round']:>5} {f(rd['train_s']):>9} {f(rd['train_cpu_s']):>9} {f(rd['valid_s']):>9} "
              f"{f(rd['valid_cpu_s']):>9} {f(rd['checkpoint_save_s'], 2):>7} "
              f"{f(rd['aggregation_s'], 2):>7} {f(rd['wall_s']):>9}" + ("" if rd["complete"] else "  (partial)"))
    if r.get("training_cost"):
        tc = r["training_cost"]
        print(f"training: {tc['s_per_batch_pair']:.3f} s wall / {tc['cpu_s_per_batch_pair']:.3f} s CPU per batch "
              f"(local+transfer step), {tc['batches_per_round']} batches/round -> ~{tc['estimated_train_s_per_round']:.0f} s "
              f"wall / ~{tc['estimated_train_cpu_s_per_round']:.0f} s CPU per round")
    if r["final_test"]:
        print(f"final test {f(r['final_test']['total_with_reload_s'])}s (incl. reload), "
              f"test alone {f(r['final_test']['total_s'])}s wall, {f(r['final_test']['total_cpu_s'])}s CPU")
    for v in r["valid_weighted_mrr"]:
        print(f"valid iter {v['iter']}: local MRR {v['local']:.4f}  global MRR {v['global']:.4f}")
    for name in ("initial_test_weighted", "final_test_weighted"):
        w = r.get(name)
        if w:
            print(f"{name}: MRR {w.get('MRR', 0):.4f}  H@1 {w.get('HITS@1', 0):.4f}  "
                  f"H@3 {w.get('HITS@3', 0):.4f}  H@10 {w.get('HITS@10', 0):.4f}")
    m = r["memory"]
    print(f"peak RSS: fedlu.py {m['child_peak_rss_mib_vmhwm']} MiB, with workers (summed) "
          f"{m['tree_peak_rss_mib_summed']} MiB, ru_maxrss {m['ru_maxrss_children_mib']} MiB")


if __name__ == "__main__":
    sys.exit(main())
