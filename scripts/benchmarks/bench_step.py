#!/usr/bin/env python
"""Milliseconds per training batch of one client: where a round's time goes.

Builds client ``--client`` of a config's federated data exactly as a run does (its
:class:`~lightning_fedkg.federated.party.Party`: module, data module, Lightning Trainer),
then times ``--batches`` training batches (FedE and the other KGE strategies: one Adam
step; FedLU: one local and one avatar step) four ways:

* ``loader``: only iterating the train loader (negative sampling, masks, weights);
* ``lightning``: ``Party.fit``, i.e. the party's Trainer, as in a federated round;
* ``bare``: the same module's two losses and two Adam steps in a plain PyTorch loop over
  the same loader (what the official code runs), so ``lightning - bare`` is the
  framework's cost per batch;
* ``bare_cached``: the bare loop over batches already in memory (and on the device), so
  ``bare - bare_cached`` is what sampling and the host-to-device copy add;
* ``bare_steps_only``: the bare loop over fresh batches again, timing only the steps (a
  device synchronisation around each), so ``bare_steps_only - bare_cached`` is what fresh
  batches cost the step itself, apart from making them;
* ``recorded_cached`` (when ``trainer.capture`` recorded the step, i.e. on a GPU): the
  recorded step alone over the cached batches, so ``lightning - recorded_cached`` is what
  Lightning and the loader add to a recorded step.

It also counts the ATen operators the host dispatches per batch in ``Party.fit``
(``ops_per_batch``): with a recorded step only the copies into its buffers and the epoch
log remain, the replay being one launch.

Run it once with ``train.fixed_negatives=true`` to see the official code's sampling (one
epoch drawn once, replayed). A small ``model.dim`` shows the per-batch overhead that a GPU
does not hide; on a GPU every timing ends with a device synchronisation.

    python scripts/benchmarks/bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 0 --threads 1 model.dim=8
    python scripts/benchmarks/bench_step.py -c configs/fedlu/fb15k237_r10_fedlu.yaml --client 4 --threads 1 model.dim=8
    python scripts/benchmarks/bench_step.py --threads 1 --batches 200 train.fixed_negatives=true
    python scripts/benchmarks/bench_step.py --threads 1 --batches 500 trainer.accelerator=gpu
    python scripts/benchmarks/bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 0 --threads 1 model.dim=8 \
        trainer.compile=true
    python scripts/benchmarks/bench_step.py -c configs/fede/fb15k237_fed3_fede.yaml --client 0 \\
        --profile   # costliest kernels
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from itertools import islice
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", default=str(REPO / "configs" / "fedlu" / "fb15k237_r10_fedlu.yaml"))
    parser.add_argument("--client", type=int, default=4)
    parser.add_argument("--batches", type=int, default=200, help="timed batches per mode (after a warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-out")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one Party.fit of the timed batches and print its 25 costliest kernels")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. train.fixed_negatives=true")
    args = parser.parse_args()

    import torch

    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.party import build_party, load_federated_kg
    from lightning_fedkg.federated.tasks import LinkPrediction
    from lightning_fedkg.runtime import configure_torch

    cfg = load_config(args.config, [f"trainer.threads={args.threads}", "trainer.progress_bar=false",
                                    *args.overrides])
    configure_torch(cfg.trainer)
    logging.disable(logging.WARNING)
    kg = load_federated_kg(cfg).clients[args.client]
    party = build_party(cfg, LinkPrediction(), f"client_{args.client}", kg, names={})
    module, dm = party.module, party.datamodule
    k = dm.loader.batches_per_step
    n = min(args.batches, dm.num_train_batches) // k * k  # whole groups of train.batches_per_step
    party.trainer.limit_train_batches = n // k
    start = time.perf_counter()
    party.fit(1)  # warm-up: indexes, the fixed epoch if any, the device copy, the compilation if any
    warm_up = time.perf_counter() - start
    device = module.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(run) -> float:
        sync()
        start = time.perf_counter()
        run()
        sync()
        return (time.perf_counter() - start) / n * 1000

    two_sided = hasattr(module, "global_loss")  # FedLU: a local and an avatar step per batch
    # the module's own optimizer (train.optimizer: dense Adam, or SparseAdam over row-sparse grads)
    local_opt = (torch.optim.Adam(module.local_parameters(), lr=cfg.train.lr) if two_sided
                 else module.build_optimizer())
    global_opt = torch.optim.Adam(module.avatar_parameters(), lr=cfg.train.lr) if two_sided else None
    precision = party.trainer.precision_plugin

    # With trainer.compile=true the bare loops run the same compiled losses as Party.fit.
    local_loss = module.compiled("training_loss")
    avatar_loss = module.compiled("global_loss") if two_sided else None

    def step(batch):
        with precision.forward_context():
            loss = local_loss(batch)
        local_opt.zero_grad()
        loss.backward()
        local_opt.step()
        if global_opt is None:
            return
        with precision.forward_context():
            global_loss = avatar_loss(batch)
        global_opt.zero_grad()
        global_loss.backward(inputs=module.avatar_parameters())
        global_opt.step()

    def to_device(batch):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def batches():
        for item in dm.train_dataloader():
            yield from (item if isinstance(item, list) else [item])

    def bare():
        for batch in islice(batches(), n):
            step(to_device(batch))

    def bare_steps_only() -> float:
        seconds = 0.0
        for batch in islice(batches(), n):
            batch = to_device(batch)
            sync()
            start = time.perf_counter()
            step(batch)
            sync()
            seconds += time.perf_counter() - start
        return seconds / n * 1000

    cached = [to_device(b) for b in islice(batches(), n)]

    def bare_cached():
        for batch in cached:
            step(batch)

    result = {
        "loader": timed(lambda: sum(1 for _ in islice(batches(), n))),
        "lightning": timed(lambda: party.fit(1)),
        "bare": timed(bare),
        "bare_cached": timed(bare_cached),
        "bare_steps_only": bare_steps_only(),
    }
    graphs = module.__dict__.get("_step_graphs")  # trainer.capture recorded Party.fit's step
    if graphs is not None and graphs.counts["replayed"]:
        # The recorded step alone over the cached batches: copies into its buffers and replays,
        # no Lightning and no loader; lightning - recorded_cached is what those two add.
        result["recorded_cached"] = timed(lambda: [graphs.run(batch) for batch in cached])
    result["ops_per_batch"] = dispatched_ops_per_batch(lambda: party.fit(1), n)
    if args.profile:  # which kernels a step spends its time in (on a GPU: device time)
        from torch.profiler import ProfilerActivity, profile

        on_gpu = device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=activities) as prof:
            party.fit(1)
            sync()
        averages = prof.key_averages()
        print(averages.table(sort_by="cuda_time_total" if on_gpu else "self_cpu_time_total",
                             row_limit=25, max_name_column_width=60))
        if not on_gpu:  # the costliest operators in the JSON too: self CPU ms and calls per batch
            top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
            result_profile = [{"name": e.key, "self_cpu_ms_per_batch": e.self_cpu_time_total / 1000 / n,
                               "calls_per_batch": e.count / n} for e in top]
    setting = {"config": Path(args.config).name, "client": args.client, "entities": kg.num_entities, "train_triples": int(kg.triples("train").shape[0]),
               "batches": n, "threads": args.threads, "device": str(device),
               "dim": cfg.model.dim, "batch_size": cfg.train.batch_size, "num_negatives": cfg.train.num_negatives,
               "negative_mode": cfg.train.negative_mode, "fixed_negatives": cfg.train.fixed_negatives, "batches_per_step": k,
               "precision": cfg.trainer.precision, "compile": cfg.trainer.compile, "overrides": args.overrides,
               "warm_up_seconds": round(warm_up, 2)}
    from torch._dynamo.utils import counters

    if counters["frames"]:  # what dynamo captured (trainer.compile, compiled pieces such as the L1
        # distances on CUDA): frames, graphs and breaks (none, or the compile is partial)
        setting["dynamo_frames"] = dict(counters["frames"])
        setting["dynamo_graphs"] = counters["stats"]["unique_graphs"]
        setting["dynamo_graph_breaks"] = sum(counters["graph_break"].values())
    print(" ".join(f"{k}={v}" for k, v in setting.items() if k != "overrides"))
    for mode, ms in result.items():
        if mode != "ops_per_batch":
            print(f"{mode:>12}: {ms:8.2f} ms per batch")
    print(f"{'dispatched':>12}: {result['ops_per_batch']:8.1f} ATen operators per batch in Party.fit "
          f"(the host's; a replayed recording is one launch, not counted)")
    print(f"{'framework':>12}: {result['lightning'] - result['bare']:8.2f} ms per batch (lightning - bare)")
    if args.json_out:
        report = {"setting": setting, "ms_per_batch": result}
        if args.profile and device.type != "cuda":
            report["profile_cpu"] = result_profile
        measure.write_json(args.json_out, report)
    return 0


def dispatched_ops_per_batch(run, batches: int) -> float:
    """ATen operators the host dispatches per batch while ``run()`` trains ``batches``
    batches (a ``TorchDispatchMode`` counts every call that reaches the kernels' dispatcher)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        run()
    return Count.calls / batches


if __name__ == "__main__":
    sys.exit(main())
