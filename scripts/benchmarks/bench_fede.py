#!/usr/bin/env python
"""Benchmark FedE rounds and full filtered evaluation on a federated KG (FB15k-237-Fed3).

Builds the :class:`~lightning_fedkg.federated.federation.FederatedRun` of a config
(default ``configs/fede/fb15k237_fed3_fede.yaml``: FedE TransE with the paper's
hyperparameters, dim 256, 256 negatives, batch 512, Adam lr 1e-3, gamma 10, alpha 1,
E = 3 local epochs, F = 1) and runs a bounded number of rounds. Per round it prints the
wall-clock seconds of ``train_round`` (select, download, E local epochs on every selected
client, upload, aggregate), and when an evaluation is due the seconds of one full filtered
evaluation of every client on the **test** split (``evaluate("test", r)``, the config's
protocol), the per-client and triple-weighted test MRR, the bytes the Channel logged in
the round, and the process's peak resident memory. A summary follows (and ``--json-out``).

The MRR is that of a model trained for only a few rounds: a sanity figure, not a result.

``--max-batches-per-epoch M`` trains only M batches per local epoch (the clients' Trainers
get ``limit_train_batches = M``) and extrapolates a full round as
``measured seconds per batch x batches per full round`` per client, plus the measured time
outside the clients' ``fit`` calls (download/upload/aggregation). Extrapolated figures are
labelled as such. Round 1 includes one-off warm-up (each client's first ``fit``), which
inflates a short bounded measurement; with ``--rounds 2`` or more the summary also gives
the mean over rounds 2..R. The bytes of a bounded round are those of a full round (FedE's
traffic does not depend on how many batches a client trains).

    python scripts/benchmarks/bench_fede.py --rounds 1                               # the config's shared negatives
    python scripts/benchmarks/bench_fede.py --rounds 1 --negative-mode per_triple    # the papers' sampling
    python scripts/benchmarks/bench_fede.py --rounds 1 --dim 32 --max-batches-per-epoch 5 --threads 1
    python scripts/benchmarks/bench_fede.py --rounds 3 --eval-every 3 model.gamma=12 train.lr=0.0005
    python scripts/benchmarks/bench_fede.py --rounds 2 --secure shared_rows               # secure aggregation

``--secure MODE`` runs every round under ``federated.secure_aggregation`` (``--hide-aggregate``
adds the hidden aggregate) and splits its cost per round: *key agreement* (the ``sa_keys``
and ``sa_shares`` exchanges: key pairs, agreements, Shamir shares, encryption, transport),
*masking* (every client's quantisation and masks, inside the ``train`` exchange) and
*unmasking* (the ``sa_unmask`` exchange and the server's reconstruction), the *survivor
check* (``sa_check``, with ``federated.secure_aggregation.active=true`` as an override), and
the bytes of each exchange.
"""

from __future__ import annotations

import argparse
import math
import platform
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import torch

from lightning_fedkg import measure
from lightning_fedkg.config import load_config
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.runtime import seed_process

REPO = measure.repo_root(__file__)
DEFAULT_CONFIG = REPO / "configs" / "fede" / "fb15k237_fed3_fede.yaml"
DEFAULT_DATA = "../shared/data/FB15k-237-Fed3"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="experiment YAML (default: %(default)s)")
    p.add_argument("--data", default=DEFAULT_DATA, help="federated KG folder, sets data.name (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=1, help="rounds to run (default: 1)")
    p.add_argument("--eval-every", type=int, default=1,
                   help="full test evaluation every K rounds and at the last round; 0 = never (default: 1)")
    p.add_argument("--negative-mode", choices=["per_triple", "shared"], help="sets train.negative_mode")
    p.add_argument("--local-epochs", type=int, help="E, sets federated.local_epochs")
    p.add_argument("--model", help="sets model.name (transe, distmult, complex, rotate, ...)")
    p.add_argument("--dim", type=int, help="sets model.dim")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default)")
    p.add_argument("--max-batches-per-epoch", type=int, default=None, metavar="M",
                   help="train only M batches per local epoch and extrapolate the full round")
    p.add_argument("--out", default=None, help="run directory (TensorBoard logs); default a temporary one")
    p.add_argument("--json-out", default=None, help="write the per-round records and the summary here")
    p.add_argument("--secure", choices=["shared_rows", "dense"], default=None,
                   help="run under federated.secure_aggregation in this mode and time its stages")
    p.add_argument("--hide-aggregate", action="store_true", help="with --secure: hide the aggregate too")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (applied last)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.eval_every < 0:
        p.error("--eval-every must be >= 0")
    if args.max_batches_per_epoch is not None and args.max_batches_per_epoch < 1:
        p.error("--max-batches-per-epoch must be >= 1")
    return args


def build_overrides(args: argparse.Namespace) -> list[str]:
    over = [f"data.name={args.data}", f"federated.rounds={args.rounds}"]
    if args.negative_mode:
        over.append(f"train.negative_mode={args.negative_mode}")
    if args.local_epochs is not None:
        over.append(f"federated.local_epochs={args.local_epochs}")
    if args.model:
        over.append(f"model.name={args.model}")
    if args.dim is not None:
        over.append(f"model.dim={args.dim}")
    if args.secure:
        over += ["federated.secure_aggregation.enabled=true", f"federated.secure_aggregation.mode={args.secure}"]
        if args.hide_aggregate:
            # a benchmark's key: a real federation reads its own from a file it keeps secret
            over += ["federated.secure_aggregation.hide_aggregate=true", "federated.federation_key=bench-key"]
    return over + list(args.overrides)


def instrument_secure(run: FederatedRun, timings: dict) -> None:
    """Record the seconds of each exchange (``stage:<name>``), of every client's masking
    (``mask``) and of the server's reconstruction (``unmask_server``)."""
    original_exchange = run.exchange

    def timed_exchange(round, stage, messages, split=None):
        start = time.perf_counter()
        out = original_exchange(round, stage, messages, split=split)
        timings[f"stage:{stage}"] += time.perf_counter() - start
        return out

    run.exchange = timed_exchange
    for half in run.client_halves.values():
        def timed_mask(*a, _original=half._mask, **k):
            start = time.perf_counter()
            out = _original(*a, **k)
            timings["mask"] += time.perf_counter() - start
            return out

        half._mask = timed_mask
    for name in ("sa_keys", "sa_shares", "sa_check", "sa_unmask"):
        original = getattr(run.server, f"aggregate_{name}", None)
        if original is None:
            continue

        def timed_aggregate(*a, _original=original, _name=name, **k):
            start = time.perf_counter()
            out = _original(*a, **k)
            timings[f"server:{_name}"] += time.perf_counter() - start
            return out

        setattr(run.server, f"aggregate_{name}", timed_aggregate)


def instrument_dp(timings: dict) -> None:
    """Record the seconds the clients spend in DP's clipping and noised release (``dp``)
    under ``federated.dp`` (the ledger's accounting is in the rest of the round)."""
    from lightning_fedkg.privacy import dp_uploads as dp_module

    for name in ("clip_update", "update_norms"):
        original = getattr(dp_module, name)

        def timed(*a, _original=original, **k):
            start = time.perf_counter()
            out = _original(*a, **k)
            timings["dp"] += time.perf_counter() - start
            return out

        setattr(dp_module, name, timed)
    original_release = dp_module.noiselib.snapped_release

    def timed_release(*a, **k):
        start = time.perf_counter()
        out = original_release(*a, **k)
        timings["dp"] += time.perf_counter() - start
        return out

    dp_module.noiselib.snapped_release = timed_release


def instrument_transport(run: FederatedRun, timings: dict) -> None:
    """Wrap the transport's ``send`` to record the seconds spent serializing and decoding."""
    original = run.channel.send

    def timed_send(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        timings["send"].append(time.perf_counter() - start)
        return out

    run.channel.send = timed_send


def instrument_fits(run: FederatedRun, timings: dict) -> None:
    """Wrap every learner's ``fit`` to record its wall-clock seconds and optimizer steps."""
    for learner in run.learners:
        original = learner.fit

        def timed_fit(epochs, _learner=learner, _original=original):
            steps = _learner.trainer.global_step
            start = time.perf_counter()
            out = _original(epochs)
            elapsed = time.perf_counter() - start
            timings[_learner.name].append((elapsed, _learner.trainer.global_step - steps))
            return out

        learner.fit = timed_fit


def bytes_by_name(run: FederatedRun, r: int) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for rec in run.channel.records(round=r):
        out[rec.name] += int(rec.bytes)
    return dict(out)


def fmt_bytes(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, build_overrides(args))
    cfg.trainer.progress_bar = False
    fc = cfg.federated
    bounded = args.max_batches_per_epoch

    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench_fede_")
        run_dir = Path(tmp.name)
    else:
        run_dir = Path(args.out)
        run_dir.mkdir(parents=True, exist_ok=True)

    print(
        f"config {args.config}: strategy={fc.strategy} model={cfg.model.name} dim={cfg.model.dim} "
        f"negatives={cfg.train.num_negatives} ({cfg.train.negative_mode}) batch={cfg.train.batch_size} "
        f"lr={cfg.train.lr} gamma={cfg.model.gamma} alpha={cfg.train.adversarial_temperature} "
        f"E={fc.local_epochs} F={fc.fraction} eval_sides={cfg.train.eval_sides} "
        f"eval_batch={cfg.train.eval_batch_size}",
        flush=True,
    )
    cpu = platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {cpu}; "
          f"run dir {run_dir}", flush=True)

    t0 = time.perf_counter()
    seed_process(cfg.seed)  # as run.fit seeds a run
    run = FederatedRun(cfg, run_dir)
    setup_s = time.perf_counter() - t0
    full_batches = {c.name: c.datamodule.num_train_batches for c in run.learners}
    print(
        f"built {len(run.clients)} clients in {setup_s:.1f}s: "
        + ", ".join(
            f"{c.name} {c.kg.num_entities} ent / {c.kg.triples('train').shape[0]} train / "
            f"{t} test / {full_batches[c.name]} batches per epoch"
            for c, t in zip(run.clients, (c.kg.triples("test").shape[0] for c in run.clients))
        ),
        flush=True,
    )
    if bounded:
        for c in run.learners:
            # Lightning reads limit_train_batches when each fit() sets up its train loader.
            c.trainer.limit_train_batches = bounded
        print(f"BOUNDED: {bounded} batches per local epoch; full-round training seconds are EXTRAPOLATED "
              f"(measured s/batch x batches per full round, per client, + time outside fit)", flush=True)

    timings: dict[str, list] = defaultdict(list)
    instrument_fits(run, timings)
    send_s: dict[str, list] = defaultdict(list)
    instrument_transport(run, send_s)
    secure_s: dict[str, float] = defaultdict(float)
    if args.secure:
        instrument_secure(run, secure_s)
    if cfg.federated.dp.enabled:
        instrument_dp(secure_s)
    start = time.perf_counter()
    run.align()
    print(f"alignment (round 0): {time.perf_counter() - start:.2f}s, "
          f"{sum(r.bytes for r in run.channel.records(round=0))} bytes", flush=True)

    rounds = []
    header = (f"{'round':>5}{'train s':>10}{'eval s':>9}{'bytes':>12}  "
              f"{'per-client test MRR':<28}{'MRR':>8}{'peak MiB':>10}")
    print(header, flush=True)
    for r in range(1, args.rounds + 1):
        for v in timings.values():
            v.clear()
        send_s["send"].clear()
        secure_s.clear()
        start = time.perf_counter()
        selected = run.train_round(r)
        train_s = time.perf_counter() - start
        secure_round = dict(secure_s)
        fits = {name: (sum(t for t, _ in v), sum(s for _, s in v)) for name, v in timings.items()}
        fit_s = sum(t for t, _ in fits.values())
        rec = {
            "round": r,
            "selected": list(selected),
            "train_s": train_s,
            "fit_s": {name: t for name, (t, _) in fits.items()},
            "batches": {name: s for name, (_, s) in fits.items()},
            "outside_fit_s": train_s - fit_s,
            "transport_s": sum(send_s["send"]),
        }
        if bounded:
            per_batch = {name: (t / s if s else math.nan) for name, (t, s) in fits.items()}
            full = {name: fc.local_epochs * full_batches[name] for name in fits}
            rec["s_per_batch"] = per_batch
            rec["full_round_batches"] = full
            rec["train_s_extrapolated"] = sum(per_batch[n] * full[n] for n in fits) + rec["outside_fit_s"]
        train_bytes = sum(bytes_by_name(run, r).values())
        if args.secure:
            rec["secure_s"] = {
                "key_agreement": secure_round.get("stage:sa_keys", 0.0) + secure_round.get("stage:sa_shares", 0.0)
                + secure_round.get("server:sa_keys", 0.0) + secure_round.get("server:sa_shares", 0.0),
                "masking": secure_round.get("mask", 0.0),
                "unmasking": secure_round.get("stage:sa_unmask", 0.0) + secure_round.get("server:sa_unmask", 0.0),
                # active only: the signed survivor list
                "check": secure_round.get("stage:sa_check", 0.0) + secure_round.get("server:sa_check", 0.0),
            }
        if cfg.federated.dp.enabled:
            rec["dp_s"] = secure_round.get("dp", 0.0)

        eval_s, avg, per_client = None, None, None
        if args.eval_every and (r % args.eval_every == 0 or r == args.rounds):
            start = time.perf_counter()
            avg, per_client = run.evaluate("test", r)
            eval_s = time.perf_counter() - start
            rec.update(eval_s=eval_s, test=avg, clients=per_client)
        by_name = bytes_by_name(run, r)
        rec["bytes"] = sum(by_name.values())
        rec["bytes_train"] = train_bytes
        rec["bytes_by_name"] = by_name
        rec["peak_rss_mib"] = measure.peak_rss_mib()
        rounds.append(rec)

        train_col = f"{rec['train_s_extrapolated']:.1f}*" if bounded else f"{train_s:.1f}"
        eval_col = f"{eval_s:.1f}" if eval_s is not None else "-"
        mrrs = " ".join(f"{m['mrr']:.4f}" for m in per_client) if per_client else "-"
        mrr = f"{avg['mrr']:.4f}" if avg else "-"
        print(f"{r:>5}{train_col:>10}{eval_col:>9}{rec['bytes']:>12}  {mrrs:<28}{mrr:>8}{rec['peak_rss_mib']:>10.0f}",
              flush=True)
        if bounded:
            detail = ", ".join(
                f"{n}: {rec['batches'][n]} batches in {rec['fit_s'][n]:.2f}s = {rec['s_per_batch'][n]:.3f} s/batch "
                f"x {rec['full_round_batches'][n]}" for n in rec["fit_s"]
            )
            print(f"      * extrapolated; measured {train_s:.2f}s for the bounded round ({detail}; "
                  f"{rec['outside_fit_s']:.2f}s outside fit)", flush=True)
        print(f"      transport (serialize + decode + log): {rec['transport_s']:.3f}s this round", flush=True)
        if args.secure:
            sec = rec["secure_s"]
            print(f"      secure aggregation: key agreement {sec['key_agreement']:.3f}s, masking {sec['masking']:.3f}s, "
                  f"unmasking {sec['unmasking']:.3f}s, survivor check {sec['check']:.3f}s; "
                  f"bytes by exchange {rec['bytes_by_name']}", flush=True)
        if "dp_s" in rec:
            print(f"      differential privacy (clipping and noised release, every client): {rec['dp_s']:.3f}s",
                  flush=True)

    evals = [rec["eval_s"] for rec in rounds if "eval_s" in rec]
    train_key = "train_s_extrapolated" if bounded else "train_s"
    summary = {
        "config": str(args.config),
        "strategy": fc.strategy,
        "model": cfg.model.name,
        "dim": cfg.model.dim,
        "negative_mode": cfg.train.negative_mode,
        "num_negatives": cfg.train.num_negatives,
        "batch_size": cfg.train.batch_size,
        "local_epochs": fc.local_epochs,
        "rounds": args.rounds,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "setup_s": setup_s,
        "max_batches_per_epoch": bounded,
        "extrapolated": bool(bounded),
        "mean_train_s_per_round": sum(rec[train_key] for rec in rounds) / len(rounds),
        "mean_measured_train_s_per_round": sum(rec["train_s"] for rec in rounds) / len(rounds),
        # Round 1 pays one-off costs (first fit of each Trainer, allocator warm-up).
        "mean_train_s_per_round_after_first": (
            sum(rec[train_key] for rec in rounds[1:]) / (len(rounds) - 1) if len(rounds) > 1 else None
        ),
        "mean_eval_s": sum(evals) / len(evals) if evals else None,
        "mean_transport_s_per_round": sum(rec["transport_s"] for rec in rounds) / len(rounds),
        "evaluations": len(evals),
        "peak_rss_mib": measure.peak_rss_mib(),
        "total_bytes": int(run.channel.total_bytes),
        "mean_bytes_train_per_round": sum(rec["bytes_train"] for rec in rounds) / len(rounds),
        "last_test": rounds[-1].get("test") if evals else None,
        "secure": args.secure,
        "hide_aggregate": bool(args.secure and args.hide_aggregate),
    }
    if args.secure:
        summary["mean_secure_s_per_round"] = {
            k: sum(rec["secure_s"][k] for rec in rounds) / len(rounds) for k in rounds[0]["secure_s"]}
    if cfg.federated.dp.enabled:
        summary["mean_dp_s_per_round"] = sum(rec["dp_s"] for rec in rounds) / len(rounds)

    print("\nsummary")
    tag = " (EXTRAPOLATED from bounded epochs)" if bounded else ""
    print(f"  seconds per round (train){tag}: {summary['mean_train_s_per_round']:.1f}")
    if summary["mean_train_s_per_round_after_first"] is not None:
        print(f"  seconds per round (train), rounds 2..{len(rounds)} (no first-round warm-up){tag}: "
              f"{summary['mean_train_s_per_round_after_first']:.1f}")
    if bounded:
        print(f"  seconds per bounded round, measured: {summary['mean_measured_train_s_per_round']:.1f} "
              f"({bounded} batches per epoch)")
    if evals:
        print(f"  seconds per full filtered test evaluation of all clients: {summary['mean_eval_s']:.1f} "
              f"({len(evals)} evaluation(s))")
    print(f"  transport (serialize + decode + log) per round: {summary['mean_transport_s_per_round']:.3f}s")
    if args.secure:
        print("  secure aggregation per round: " + ", ".join(
            f"{k} {v:.3f}s" for k, v in summary["mean_secure_s_per_round"].items()))
    if "mean_dp_s_per_round" in summary:
        print(f"  differential privacy per round (clipping and noised release): {summary['mean_dp_s_per_round']:.3f}s")
    print(f"  peak RSS: {summary['peak_rss_mib']:.0f} MiB")
    print(f"  bytes: {summary['total_bytes']} total ({fmt_bytes(summary['total_bytes'])}), "
          f"{summary['mean_bytes_train_per_round']:.0f} per round without evaluation downloads")
    print(f"  torch threads: {summary['torch_threads']}, negative mode: {summary['negative_mode']}, "
          f"model: {summary['model']} dim {summary['dim']}, E={summary['local_epochs']}, setup {setup_s:.1f}s")

    result = {"summary": summary, "rounds": rounds, "config_resolved": asdict(cfg)}
    if args.json_out:
        measure.write_json(args.json_out, result, indent=2)
        print(f"  wrote {args.json_out}")
    if tmp is not None:
        tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
