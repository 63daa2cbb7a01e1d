#!/usr/bin/env python
"""FedCQA side by side: the authors' FedNGDB code, unmodified, against ours, on one set of queries.

The reference is HKUST-KnowComp/FedNGDB (the code of Hu et al.'s FedCQA / "federated neural
graph databases"; run at commit 234e674 for ``docs/results/fedcqa/reference_fedngdb_umls.json`` and
``..._umls_e30.json``). Its FedCQA is ``model/train_fed.py
--server_model fedC`` with ``--partial_update`` (without that flag its ``fedC`` client update
overwrites no entity row, so entity rows are never shared). That repository carries no
licence, so none of its code or text is here: ``--original`` names a checkout of it, and
its ``model/train_fed.py`` is started as a subprocess with its own interpreter (``--python``;
it needs torch, numpy, pandas, tqdm and tensorboardX, which our venv lacks: a separate venv,
which ``bash scripts/reference/fedngdb_env.sh runs/fedngdb_venv`` makes). It runs on the CPU
as it is (it picks ``cuda`` only when one is available): no shim, no patch, nothing written
into ``--original``.

What the harness does

1. Samples the queries with OUR sampler and the settings of ``-c`` (``query_settings`` of its
   ``task:`` section: in-graph train / valid / test sets per client from
   ``graph_query_sets``, cross-graph test sets from ``cross_query_sets``, through
   ``federated_query_sets``) into a cache under ``--work`` (``task.cache_dir``), so that our
   run below loads exactly these sets.
2. Writes them into the layout the original reads, under ``--work`` (its paths are relative
   to the working directory, so it runs in ``--work/run`` and reads ``--work/KG_data_fed``):
   ``KG_data_fed/<name>/stats.txt`` (entities; relations counting inverses),
   ``KG_data_fed/<name>/fed-<n>/train_<i>.txt`` (client i's training triples in global ids,
   both directions: relation ``k`` is ``2k``, its inverse ``2k+1``, as our queries number
   them; the original derives a client's entity and relation masks from this file),
   ``queries/fed-<n>/<name>_{train,valid,test}_queries_<i>.pkl`` and
   ``queries/fed-<n>/<name>_cross_clients_{valid,test}_queries.pkl``: pickled
   ``{type: {query string: {"train_answers", "valid_answers", "test_answers"}}}`` with the
   queries rewritten in the original's prefix grammar (``(p,(r),(e,(a)))``, ``(i,...)``,
   ``(u,...)``) and ids mapped from each client's local ids to global ones. Answers:
   training queries ``train_answers`` = all their answers; valid queries ``train_answers`` =
   our easy answers, ``valid_answers`` = easy ∪ hard; test queries ``valid_answers`` = easy,
   ``test_answers`` = easy ∪ hard, ``train_answers`` empty (the original's test evaluation
   does not read it). The original ranks ``generalized − entailed`` answers with both sets
   filtered, so it ranks exactly our hard answers with our easy ones filtered. We sample no
   cross-graph validation set: that file is an empty dict (nothing is evaluated there).
3. Runs the original: ``-m gqe -d <model.dim> -b <train.batch_size> -lr <train.lr>
   --n_clients <n> --fraction <federated.fraction> --server_model fedC --partial_update
   --evaluate_cross``, with ``OMP_NUM_THREADS=1``. Steps: with ``--their-local-epochs 1``
   (default; the original's own protocol: every global step each selected client takes one
   step and the server aggregates) ``--global_steps R·S + 1`` and ``--log_steps R·S`` for
   R = ``--rounds`` and S = ``task.steps_per_epoch · federated.local_epochs``: every client
   trains R·S + 1 batches (ours: R·S), its in-graph valid and test evaluation runs after its
   step R·S/2 and R·S, and the cross-graph one after global step 1 and after the last. The
   original evaluates only every ``--log_steps`` and writes its metrics only to TensorBoard,
   so this is how the last evaluations fall at the end. With ``--their-local-epochs S``
   (our round structure: S steps, then aggregation) ``--global_steps R`` and ``--log_steps
   2·R·S``: the in-graph evaluation runs once, at the end; the cross-graph one only after
   the first round (its MRR is then reported but marked ``after_round_1``).
4. Times it from outside: its stdout and stderr are read as they come and each chunk is
   stamped; its evaluation banners on stdout start an evaluation, the wall time of the last
   metric it writes to TensorBoard (read back with tensorboard's event reader) ends it;
   the end of the training loop is tqdm's final ``G/G`` on stderr. Training seconds = loop
   time − every evaluation (valid and test, in-graph and cross-graph). Peak memory: the
   child's ``ru_maxrss`` (``os.wait4``). MRR: its ``z-test-<client>-<type>-inf_mrr`` and
   ``z-test-cross-<type>-inf_mrr`` of the last evaluation.
5. Runs ours in a subprocess too (this script with ``--ours-child``, same interpreter as
   this one, ``torch.set_num_threads(1)``): ``FederatedRun`` of the config with
   ``federated.rounds=R`` and the cache of step 1, R timed ``train_round`` calls, then one
   ``evaluate("test")`` (in-graph per client, cross-graph by distributed retrieval), timed;
   peak memory by ``os.wait4`` as well.
6. Prints the table and, with ``--json-out``, writes everything.

Both sides are summarised the same way: in-graph MRR = per client the mean over query
types, then the mean over clients weighted by their numbers of test queries (our
``metrics.json`` convention); cross-graph MRR = the mean over types. The original's own
pooled per-client figure (``x-test-<i>-inf_mrr``, a mean over all queries) is in the JSON.

    .venv/bin/python scripts/reference/reference_fedngdb.py --original /path/to/FedNGDB \\
        --python runs/fedngdb_venv/bin/python -c configs/fedcqa/umls_fedcqa_gqe.yaml --rounds 5 \\
        --work runs/fedngdb_work --json-out docs/results/fedcqa/reference_fedngdb_umls.json

Matched: the clients (our partition of ``data.name`` into ``data.num_clients``), every
query and answer set, the query types trained on and evaluated, dim, batch size, learning
rate, AdamW, label-smoothed softmax loss (0.1 on both sides), the number of batches each
client trains (±1), every client selected each round, one CPU thread.

Not matched (differences of the two implementations, not of the settings):
  * the encoder: their GQE scores by a dot product with the (tied) entity table, intersects
    by an MLP + mean + linear map and answers unions with an MLP operator; ours is
    KGReasoning's GQE (``γ − ‖e − q‖₁``, attention intersection, unions in DNF);
  * the loss's candidates: theirs every global entity (each client holds a full-size
    table), ours the client's own entities;
  * AdamW's weight decay: theirs torch's default 0.01, ours ``task.weight_decay`` (0 in the
    config; pass ``task.weight_decay=0.01`` after the options to match);
  * aggregation: theirs every global step (default) with random per-client perturbation
    rows (their ``fedC``), relations averaged over their holders (each relation has one
    holder here, so they stay local as ours do); ours once per round (S steps) under
    secure aggregation with the aggregate hidden;
  * batches: theirs one query type per global step for all clients, drawn uniformly, one
    random answer per query (with ``--their-local-epochs S`` one type for a whole round:
    over 5 rounds some types are never trained, which shows in its MRR); ours as
    ``QueryBatches`` draws them;
  * in-graph evaluation: theirs on each client's model right after its own local step,
    before aggregation, ranking over all global entities with the entities absent from the
    client's training triples filtered; ours after aggregation, ranking over the client's
    entities (the same set wherever every entity of a client occurs in its training
    triples, as on UMLS: the JSON's ``data.clients`` shows both counts); ties broken at
    random there, not here;
  * cross-graph evaluation: theirs on the server (anchors averaged over holders' rows,
    operators and relations of the server model, each entity scored by its holder); ours
    by our distributed retrieval protocol;
  * no seed is set by the original (its runs vary); their valid evaluations during training
    are excluded from the training time, and ours runs none;
  * timings are wall-clock on whatever else the machine is doing: run it on a quiet one;
  * peak memory includes each side's imports (theirs: torch, pandas, tensorboardX; ours:
    torch, Lightning, PyG).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)

DEFAULT_CONFIG = REPO / "configs" / "fedcqa" / "umls_fedcqa_gqe.yaml"


# --------------------------------------------------------------------------- the original's input

def query_string(structure, row: list[int], rel_map, ent_map) -> str:
    """One of our query rows (depth-first slots) in the original's prefix grammar."""
    from lightning_fedkg.methods.fedcqa.structures import E, U, is_branch, is_union

    pos = 0

    def walk(node) -> str:
        nonlocal pos
        if node == E:
            s = f"(e,({ent_map(row[pos])}))"
            pos += 1
            return s
        if is_branch(node):
            s = walk(node[0])
            for _ in node[1]:
                s = f"(p,({rel_map(row[pos])}),{s})"
                pos += 1
            return s
        if is_union(node):
            parts = [walk(p) for p in node[:-1]]
            assert node[-1] == (U,) and row[pos] == -1
            pos += 1
            return "(u," + ",".join(parts) + ")"
        return "(i," + ",".join(walk(p) for p in node) + ")"

    s = walk(structure)
    assert pos == len(row), (structure, row)
    return s


def query_dict(qs, split: str, ent_map, rel_map) -> dict:
    """``{query string: answers}`` of one :class:`QuerySet` in the original's format."""
    from lightning_fedkg.methods.fedcqa.queries import STRUCTURES

    structure = STRUCTURES[qs.structure]
    out = {}
    for i, row in enumerate(qs.queries.tolist()):
        hard = [ent_map(int(x)) for x in qs.hard(i).tolist()]
        easy = [ent_map(int(x)) for x in qs.easy(i).tolist()]
        if split == "train":
            answers = {"train_answers": hard}
        elif split == "valid":
            answers = {"train_answers": easy, "valid_answers": sorted(set(easy) | set(hard))}
        else:
            answers = {"train_answers": [], "valid_answers": easy, "test_answers": sorted(set(easy) | set(hard))}
        key = query_string(structure, row, rel_map, ent_map)
        assert key not in out, f"duplicate query {key}"
        out[key] = answers
    return out


def write_original_layout(fkg, sets: dict, work: Path, data_name: str) -> dict:
    """The files ``train_fed.py`` reads, under ``work``; returns counts for the report."""
    n = len(fkg.clients)
    kg_dir = work / "KG_data_fed" / data_name
    fed_dir = kg_dir / f"fed-{n}"
    q_dir = work / "queries" / f"fed-{n}"
    for d in (fed_dir, q_dir, work / "run"):
        d.mkdir(parents=True, exist_ok=True)
    (kg_dir / "stats.txt").write_text(f"numentity: {fkg.num_entities}\nnumrelations: {2 * fkg.num_relations}\n")
    info = {"clients": []}
    for k, kg in enumerate(fkg.clients):
        ent, rel = fkg.entity_index[k], fkg.relation_index[k]
        t = kg.triples("train").long()
        h, r, tl = ent[t[:, 0]].tolist(), rel[t[:, 1]].tolist(), ent[t[:, 2]].tolist()
        lines = [f"{a}\t{2 * b}\t{c}\n" for a, b, c in zip(h, r, tl)]
        lines += [f"{c}\t{2 * b + 1}\t{a}\n" for a, b, c in zip(h, r, tl)]
        (fed_dir / f"train_{k}.txt").write_text("".join(lines))
        train_entities = len(set(h) | set(tl))

        def ent_map(x, ent=ent):
            return int(ent[x])

        def rel_map(x, rel=rel):
            return 2 * int(rel[x // 2]) + x % 2

        counts = {}
        for split in ("train", "valid", "test"):
            payload = {name: query_dict(qs, split, ent_map, rel_map) for name, qs in sets["clients"][k][split].items()
                       if len(qs)}
            if split == "train":
                empty = [name for name, qs in sets["clients"][k][split].items() if not len(qs)]
                if empty:  # the original's training iterator would spin forever on an empty type
                    raise SystemExit(f"client {k} has no training queries of {empty}")
            with open(q_dir / f"{data_name}_{split}_queries_{k}.pkl", "wb") as f:
                pickle.dump(payload, f)
            counts[split] = {name: len(v) for name, v in payload.items()}
        info["clients"].append({"entities": kg.num_entities, "entities_in_train": train_entities,
                                "relations": kg.num_relations, "queries": counts})

    def ident(x):
        return int(x)

    cross = {name: query_dict(qs, "test", ident, ident) for name, qs in sets["cross"].items() if len(qs)}
    with open(q_dir / f"{data_name}_cross_clients_test_queries.pkl", "wb") as f:
        pickle.dump(cross, f)
    with open(q_dir / f"{data_name}_cross_clients_valid_queries.pkl", "wb") as f:
        pickle.dump({}, f)
    info["cross_queries"] = {name: len(v) for name, v in cross.items()}
    return info


# --------------------------------------------------------------------------- running a child

def run_child(cmd: list[str], cwd: Path, env: dict, log_prefix: Path) -> dict:
    """Run ``cmd``; every stdout / stderr chunk stamped with ``time.time()``; peak RSS of the
    child alone (``os.wait4``)."""
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    chunks = {"stdout": [], "stderr": []}

    def pump(name, stream):
        while True:
            data = os.read(stream.fileno(), 65536)
            if not data:
                break
            chunks[name].append((time.time(), data))

    threads = [threading.Thread(target=pump, args=(name, getattr(proc, name)), daemon=True)
               for name in ("stdout", "stderr")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    end = time.time()
    for name in chunks:
        Path(f"{log_prefix}.{name}.log").write_bytes(b"".join(d for _, d in chunks[name]))
    return {"returncode": proc.returncode, "start": start, "end": end, "chunks": chunks,
            "peak_rss_mib": usage.ru_maxrss / 1024, "cpu_seconds": usage.ru_utime + usage.ru_stime}


def stamped_lines(chunks) -> list[tuple[float, str]]:
    """Lines of a stream with the time of the chunk that completed each."""
    out, buf = [], b""
    for t, data in chunks:
        buf += data
        *lines, buf = buf.split(b"\n")
        out += [(t, line.decode(errors="replace")) for line in lines]
    if buf:
        out.append((chunks[-1][0], buf.decode(errors="replace")))
    return out


def read_scalars(log_root: Path) -> dict:
    """``{tag: [(wall_time, step, value)]}`` from every event file under ``log_root``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict = {}
    for path in sorted(log_root.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.wall_time, e.step, e.value) for e in acc.Scalars(tag))
    return out


def groups_by_step(scalars: dict, prefix: str) -> list[tuple[int, float]]:
    """``[(step, last wall time)]`` of the scalars whose tag starts with ``prefix``, by step."""
    ends: dict = {}
    for tag, events in scalars.items():
        if tag.startswith(prefix):
            for wall, step, _ in events:
                ends[step] = max(ends.get(step, 0.0), wall)
    return sorted(ends.items())


def last_value(scalars: dict, tag: str):
    events = scalars.get(tag)
    if not events:
        return None
    wall, step, value = max(events, key=lambda e: (e[1], e[0]))
    return {"value": float(value), "step": int(step)}


# --------------------------------------------------------------------------- their side

def run_theirs(args, cfg, info: dict, work: Path, data_name: str) -> dict:
    n = cfg.data.num_clients
    S = cfg.task.steps_per_epoch * cfg.federated.local_epochs
    R = args.rounds
    E = args.their_local_epochs
    if E == 1:
        global_steps, log_steps = R * S + 1, R * S
    else:
        global_steps, log_steps = R, 2 * R * E
    if log_steps < 2:
        raise SystemExit("need R·S >= 2")
    logs = work / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    script = Path(args.original).resolve() / "model" / "train_fed.py"
    if not script.is_file():
        raise SystemExit(f"{script} not found: --original must be a FedNGDB checkout")
    # a relative interpreter path names a file from here, not from the run's folder
    python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
    cmd = [python, str(script), "--query_dir", str(work / "queries"), "-dn", data_name,
           "-m", "gqe", "-d", str(cfg.model.dim), "-b", str(cfg.train.batch_size), "-lr", str(cfg.train.lr),
           "--n_clients", str(n), "--global_steps", str(global_steps), "--local_epochs", str(E),
           "--log_steps", str(log_steps), "--fraction", str(cfg.federated.fraction),
           "--server_model", "fedC", "--partial_update", "--evaluate_cross", "--checkpoint_path", str(logs)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    print("their command (cwd %s):\n  %s" % (work / "run", " ".join(cmd)), flush=True)
    res = run_child(cmd, work / "run", env, work / "theirs")
    if res["returncode"] != 0:
        tail = b"".join(d for _, d in res["chunks"]["stderr"])[-3000:].decode(errors="replace")
        raise SystemExit(f"the original exited with {res['returncode']}:\n{tail}")
    lines = stamped_lines(res["chunks"]["stdout"])
    scalars = read_scalars(logs)

    def times(pattern):
        return [t for t, line in lines if re.search(pattern, line)]

    t_train = times(r"====== Training ======")[0]
    # the loop's end: tqdm's last "G/G" on stderr
    loop_end = None
    for t, data in res["chunks"]["stderr"]:
        for a, b in re.findall(rb"(\d+)/(\d+) \[", data):
            if int(a) == int(b) == global_steps:
                loop_end = t
    if loop_end is None:
        loop_end = res["end"]

    evals = []  # (kind, who, split, start, end, step)
    for i in range(n):
        v = times(rf"====== Validation ======: client ID: {i}\b")
        te = times(rf"====== Testing ======: client ID: {i}\b")
        ends = groups_by_step(scalars, f"x-test-{i}-")
        if not (len(v) == len(te) == len(ends)):
            raise SystemExit(f"client {i}: {len(v)} validation banners, {len(te)} test banners, "
                             f"{len(ends)} test metric groups")
        for a, b, (step, c) in zip(v, te, ends):
            evals.append(("in_graph", i, "valid", a, b, step))
            evals.append(("in_graph", i, "test", b, c, step))
    v = times(r"====== Validation Server ======")
    te = times(r"====== Testing Server ======")
    ends = groups_by_step(scalars, "x-test-cross-")
    if not (len(v) == len(te) == len(ends)):
        raise SystemExit(f"server: {len(v)} validation banners, {len(te)} test banners, {len(ends)} metric groups")
    for a, b, (step, c) in zip(v, te, ends):
        evals.append(("cross", None, "valid", a, b, step))
        evals.append(("cross", None, "test", b, c, step))
    eval_seconds = sum(e[4] - e[3] for e in evals)
    loop = loop_end - t_train
    train_seconds = loop - eval_seconds
    selected = max(round(cfg.federated.fraction * n), 1)
    client_steps = global_steps * E * selected

    # the last evaluations
    from lightning_fedkg.methods.fedcqa.config import query_settings

    types_eval = list(query_settings(cfg.task).types)  # task.query_set resolved
    per_client, weights, pooled = [], [], []
    for i in range(n):
        by_type = {}
        for t in types_eval:
            m = last_value(scalars, f"z-test-{i}-{t}-inf_mrr")
            h3 = last_value(scalars, f"z-test-{i}-{t}-inf_hit_at_3")
            if m is not None:
                by_type[t] = {"mrr": m["value"], "hits@3": h3["value"] if h3 else None, "step": m["step"],
                              "queries": info["clients"][i]["queries"]["test"].get(t, 0)}
        per_client.append(by_type)
        weights.append(sum(b["queries"] for b in by_type.values()))
        pooled.append(last_value(scalars, f"x-test-{i}-inf_mrr"))
    client_means = [sum(b["mrr"] for b in bt.values()) / max(len(bt), 1) for bt in per_client]
    in_graph = sum(m * w for m, w in zip(client_means, weights)) / max(sum(weights), 1)
    in_h3 = [sum(b["hits@3"] for b in bt.values()) / max(len(bt), 1) for bt in per_client]
    in_graph_h3 = sum(m * w for m, w in zip(in_h3, weights)) / max(sum(weights), 1)
    cross_by_type = {}
    for t in types_eval:
        m = last_value(scalars, f"z-test-cross-{t}-inf_mrr")
        h3 = last_value(scalars, f"z-test-cross-{t}-inf_hit_at_3")
        if m is not None:
            cross_by_type[t] = {"mrr": m["value"], "hits@3": h3["value"] if h3 else None, "step": m["step"]}
    cross = sum(b["mrr"] for b in cross_by_type.values()) / max(len(cross_by_type), 1) if cross_by_type else None
    cross_h3 = (sum(b["hits@3"] for b in cross_by_type.values()) / len(cross_by_type)) if cross_by_type else None
    cross_step = max((b["step"] for b in cross_by_type.values()), default=None)

    last_in = [e for e in evals if e[0] == "in_graph" and e[2] == "test"]
    last_step = {i: max(e[5] for e in last_in if e[1] == i) for i in range(n)}
    final_in_test = sum(e[4] - e[3] for e in last_in if e[5] == last_step[e[1]])
    cross_tests = [e for e in evals if e[0] == "cross" and e[2] == "test"]
    final_cross_test = cross_tests[-1][4] - cross_tests[-1][3] if cross_tests else None
    return {
        "command": cmd, "cwd": str(work / "run"),
        "global_steps": global_steps, "local_epochs": E, "log_steps": log_steps,
        "client_steps_each": global_steps * E, "client_steps_total": client_steps,
        "setup_seconds": t_train - res["start"],
        "loop_seconds": loop, "evaluation_seconds_during_loop": eval_seconds,
        "training_seconds": train_seconds,
        "seconds_per_client_step": train_seconds / client_steps,
        "seconds_per_round_equivalent": train_seconds / client_steps * selected * S,
        "test_evaluation_seconds": {"in_graph": final_in_test, "cross_graph": final_cross_test,
                                    "total": final_in_test + (final_cross_test or 0.0)},
        "evaluations": [{"kind": k, "client": c, "split": s, "seconds": b - a, "step": st}
                        for k, c, s, a, b, st in evals],
        "peak_rss_mib": res["peak_rss_mib"], "cpu_seconds": res["cpu_seconds"],
        "wall_seconds": res["end"] - res["start"],
        "in_graph": {"mrr": in_graph, "hits@3": in_graph_h3, "client_mean_over_types": client_means,
                     "client_pooled_inf_mrr": pooled, "clients_by_type": per_client,
                     "after_client_step": last_step},
        "cross_graph": {"mrr": cross, "hits@3": cross_h3, "by_type": cross_by_type, "after_global_step": cross_step,
                        "after_round_1": E > 1},
    }


# --------------------------------------------------------------------------- our side

def ours_child(args) -> None:
    """In a process of its own: R timed rounds of our FederatedRun, then one timed test."""
    import torch

    torch.set_num_threads(1)
    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.federation import FederatedRun

    cfg = load_config(args.config, args.overrides)
    t0 = time.perf_counter()
    run = FederatedRun(cfg, None)
    run.align()
    setup = time.perf_counter() - t0
    train_start_wall = time.time()
    seconds = []
    selected = []
    for r in range(1, args.rounds + 1):
        start = time.perf_counter()
        selected = run.train_round(r)
        seconds.append(time.perf_counter() - start)
    start = time.perf_counter()
    avg, per_client = run.evaluate("test", args.rounds)
    evaluation = time.perf_counter() - start
    cross = run.server.cross_graph() or {}
    cross_seconds = sum(cross.get("seconds", {}).values())
    from lightning_fedkg.methods.fedcqa.entries import by_type

    S = cfg.task.steps_per_epoch * cfg.federated.local_epochs
    client_steps = len(selected) * S * args.rounds
    out = {
        "rounds": args.rounds, "client_steps_each": S * args.rounds, "client_steps_total": client_steps,
        "federation_build_seconds": setup, "train_start_wall": train_start_wall,
        "round_seconds": seconds, "training_seconds": sum(seconds),
        "seconds_per_client_step": sum(seconds) / client_steps,
        "seconds_per_round_equivalent": sum(seconds) / args.rounds,
        "seconds_per_round_after_first": (sum(seconds[1:]) / (len(seconds) - 1)) if len(seconds) > 1 else None,
        "test_evaluation_seconds": {"in_graph": evaluation - cross_seconds, "cross_graph": cross_seconds,
                                    "total": evaluation},
        "in_graph": {"mrr": avg.get("mrr"), "hits@3": avg.get("hits@3"),
                     "clients_by_type": [by_type(e) for e in per_client]},
        "cross_graph": {"mrr": cross.get("mrr"), "hits@3": cross.get("hits@3"), "by_type": cross.get("by_type", {})},
    }
    run.close()
    measure.write_json(args.ours_child, out, default=float)


def run_ours(args, overrides: list[str], work: Path) -> dict:
    out_path = work / "ours.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--ours-child", str(out_path), "-c", str(args.config),
           "--rounds", str(args.rounds), "--original", "-", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    print("our command:\n  %s" % " ".join(cmd), flush=True)
    res = run_child(cmd, REPO, env, work / "ours")
    if res["returncode"] != 0:
        tail = b"".join(d for _, d in res["chunks"]["stderr"])[-3000:].decode(errors="replace")
        raise SystemExit(f"our run exited with {res['returncode']}:\n{tail}")
    out = json.loads(out_path.read_text())
    out.update({"command": cmd, "setup_seconds": out.pop("train_start_wall") - res["start"],
                "peak_rss_mib": res["peak_rss_mib"], "cpu_seconds": res["cpu_seconds"],
                "wall_seconds": res["end"] - res["start"]})
    return out


# --------------------------------------------------------------------------- report

def table(theirs: dict | None, ours: dict | None) -> str:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    rows = [
        ("client steps (each client)", "client_steps_each", "d"),
        ("seconds / client training step", "seconds_per_client_step", ".5f"),
        ("seconds / round (clients x S steps)", "seconds_per_round_equivalent", ".3f"),
        ("training seconds", "training_seconds", ".2f"),
        ("test eval seconds, in-graph", ("test_evaluation_seconds", "in_graph"), ".2f"),
        ("test eval seconds, cross-graph", ("test_evaluation_seconds", "cross_graph"), ".2f"),
        ("test eval seconds, total", ("test_evaluation_seconds", "total"), ".2f"),
        ("setup seconds (spawn to 1st step)", "setup_seconds", ".2f"),
        ("peak RSS (MiB)", "peak_rss_mib", ".1f"),
        ("in-graph MRR", ("in_graph", "mrr"), ".4f"),
        ("in-graph HR@3", ("in_graph", "hits@3"), ".4f"),
        ("cross-graph MRR", ("cross_graph", "mrr"), ".4f"),
        ("cross-graph HR@3", ("cross_graph", "hits@3"), ".4f"),
    ]

    def get(d, key):
        if d is None:
            return None
        if isinstance(key, tuple):
            for k in key:
                d = d.get(k) if isinstance(d, dict) else None
            return d
        return d.get(key)

    lines = [f"{'':38s}{'FedNGDB (official)':>20s}{'lightning_fedkg':>18s}"]
    for label, key, spec in rows:
        lines.append(f"{label:38s}{fmt(get(theirs, key), spec):>20s}{fmt(get(ours, key), spec):>18s}")
    types = sorted(set((theirs or {}).get("cross_graph", {}).get("by_type", {}))
                   | set((ours or {}).get("cross_graph", {}).get("by_type", {})))
    if types:
        lines.append("cross-graph MRR by type")
        for t in types:
            a = get(theirs, ("cross_graph", "by_type", t, "mrr"))
            b = get(ours, ("cross_graph", "by_type", t, "mrr"))
            lines.append(f"  {t:36s}{fmt(a, '.4f'):>20s}{fmt(b, '.4f'):>18s}")
    if get(theirs, ("cross_graph", "after_round_1")):
        lines.append("(the original's cross-graph figures are after its first round: with --local_epochs > 1 it "
                     "evaluates cross-graph only then)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--original", required=True, help="a FedNGDB checkout (read only)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for the original (torch, numpy, pandas, tqdm, tensorboardX)")
    parser.add_argument("-c", "--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--rounds", type=int, default=5, help="R: our rounds; theirs R·S (+1) steps")
    parser.add_argument("--their-local-epochs", type=int, default=1,
                        help="their --local_epochs: 1 (their protocol, aggregation every step) or S")
    parser.add_argument("--work", type=Path, help="folder for their input, logs and both runs' logs "
                                                 "(default: a temporary one, removed)")
    parser.add_argument("--only", choices=("both", "theirs", "ours"), default="both")
    parser.add_argument("--json-out")
    parser.add_argument("--ours-child", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="overrides of -c for our side (and the sampling)")
    args = parser.parse_args()
    if args.ours_child:
        ours_child(args)
        return

    import torch

    torch.set_num_threads(1)
    from lightning_fedkg.config import load_config
    from lightning_fedkg.methods.fedcqa.query_sets import federated_query_sets
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.methods.fedcqa.config import query_settings

    tmp = None
    if args.work is None:
        tmp = tempfile.mkdtemp(prefix="fedngdb_")
        work = Path(tmp)
    else:
        work = args.work.resolve()
        work.mkdir(parents=True, exist_ok=True)
    original = Path(args.original).resolve()
    if original == work or original in work.parents:
        raise SystemExit("--work must not be inside --original")
    try:
        overrides = [*args.overrides, f"task.cache_dir={work / 'cache'}", f"federated.rounds={args.rounds}"]
        cfg = load_config(args.config, overrides)
        if cfg.task.encoder not in ("gqe", "gqe_fedngdb"):
            raise SystemExit("this harness compares GQE (their -m gqe): set task.encoder=gqe (KGReasoning's) "
                             "or gqe_fedngdb (theirs, in our code)")
        fkg = load_federated_kg(cfg)
        start = time.perf_counter()
        sets = federated_query_sets(fkg, query_settings(cfg.task), work / "cache")
        sampling = time.perf_counter() - start
        data_name = f"{cfg.data.name}-fed"
        info = write_original_layout(fkg, sets, work, data_name)
        print(f"queries sampled in {sampling:.1f} s; their layout in {work}", flush=True)
        report = {"config": str(args.config), "overrides": args.overrides, "rounds": args.rounds,
                  "their_local_epochs": args.their_local_epochs, "work": str(work), "original": str(original),
                  "settings": sets["settings"], "data": info,
                  "matched": {"dim": cfg.model.dim, "batch_size": cfg.train.batch_size, "lr": cfg.train.lr,
                              "clients": cfg.data.num_clients, "fraction": cfg.federated.fraction,
                              "steps_per_round": cfg.task.steps_per_epoch * cfg.federated.local_epochs},
                  "threads": 1}
        theirs = ours = None
        if args.only in ("both", "theirs"):
            theirs = run_theirs(args, cfg, info, work, data_name)
            report["theirs"] = theirs
        if args.only in ("both", "ours"):
            ours = run_ours(args, overrides, work)
            report["ours"] = ours
        print(table(theirs, ours))
        if args.json_out:
            measure.write_json(args.json_out, report, default=float)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
