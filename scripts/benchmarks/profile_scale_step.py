#!/usr/bin/env python
"""Where a row-sparse FedE batch's time goes, at 10^4 against 10^6 entities.

One client's share of bench_scale.py's synthetic KGs, drawn in memory (``synthetic_splits``:
``--entities`` entities, a third of the 200 relations and of the 10 triples per entity), one
``KGEModule`` and ``KGDataModule`` built from the FedE config at bench_scale.py's batch shape
(dim 64, batch 256, 64 shared filtered negatives, tail corruption, self-adversarial loss), no
Trainer: ``--steps`` steps of the bare loop, each phase timed on its own (``perf_counter``):

* ``batch``: the data module's batch (permutation slice, the shared negatives, their mask
  from the filter index);
* ``forward``: the loss; ``backward`` (``zero_grad`` too); ``step``: ``optimizer.step()``.

Each is timed as wall seconds and as the process's CPU seconds (``*_cpu_s``): on a shared
2-core machine a wall-clock median of a whole batch (several milliseconds) includes the
time other jobs ran, which a sub-millisecond phase mostly escapes; CPU seconds do not.

``--reference`` measures a client folder the same way (FB15k-237-Fed3's ``client_0``: the
shape bench_scale.py compares with); ``--repeat`` runs every target that many times in turn
(the JSON's ``medians`` are over them). ``--lightning`` also times a Lightning fit of
``--steps`` batches with bench_scale.py's two clocks (loader, step and Lightning's per-batch
work).

``--optimizer`` picks ``sparse_adam`` (default) or ``adam``. ``--touch-only`` also times
the memory access alone: gathering and index-adding the rows one batch reads, in a table
of the same size with and without Adam's two moment tables, so the table size's cost is
seen apart from the code around it. ``--profile`` prints torch.profiler's op table of
``--profile-steps`` steps. The first ``--warmup`` steps are not counted (Adam's moments are
allocated at the first step). Prints and (``--json-out``) writes medians per phase.

    python scripts/benchmarks/profile_scale_step.py --entities 10000 1000000 --steps 300 --threads 1 \\
        --reference ../shared/data/FB15k-237-Fed3/client_0 --repeat 3 --touch-only --lightning \\
        --json-out docs/results/scale/profile_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)
CONFIG = REPO / "configs" / "fede" / "fb15k237_fed3_fede.yaml"
PHASES = ("batch", "forward", "backward", "step")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, nargs="+", default=[10_000, 1_000_000])
    p.add_argument("--relations", type=int, default=67, help="one client's share of 200 relations")
    p.add_argument("--triples-per-entity", type=float, default=10 / 3, help="one client's share of 10")
    p.add_argument("--reference", help="a client folder measured the same way (FB15k-237-Fed3's client_0)")
    p.add_argument("--repeat", type=int, default=1, help="rounds over every size, in turn (fresh builds)")
    p.add_argument("--optimizer", default="sparse_adam")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--touch-only", action="store_true")
    p.add_argument("--lightning", action="store_true",
                   help="also time --steps batches of a Lightning fit (bench_scale.py's clock)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-steps", type=int, default=50)
    p.add_argument("--json-out")
    return p.parse_args(argv)


def build(entities: int | str, args: argparse.Namespace):
    """The KG (``entities`` synthetic entities, or the folder ``entities`` names), its data
    module, a module and its optimizer."""
    from lightning_fedkg.builders import build_datamodule, build_module
    from lightning_fedkg.config import load_config
    from lightning_fedkg.data import KnowledgeGraph, load_kg
    from lightning_fedkg.data.synthetic import synthetic_splits

    cfg = load_config(str(CONFIG), ["model.dim=64", "train.batch_size=256", "train.num_negatives=64",
                                    "train.negative_mode=shared", f"train.optimizer={args.optimizer}"])
    if isinstance(entities, str):
        kg = load_kg(entities)
    else:
        triples = int(round(args.triples_per_entity * entities))
        kg = KnowledgeGraph(synthetic_splits(entities, args.relations, triples, seed=0), entities, args.relations)
    dm = build_datamodule(kg, cfg, seed=0)
    dm.setup("fit")
    module = build_module(cfg, kg.num_entities, kg.num_relations)
    return kg, dm, module, module.build_optimizer()


def batches(dm):
    while True:
        yield from dm._train_epoch()


def run_steps(dm, module, optimizer, steps: int) -> dict[str, list[float]]:
    """Per step and phase: wall seconds (``perf_counter``) and, as ``<phase>_cpu``, the
    process's CPU seconds (``process_time``), which other jobs on a shared machine do not
    inflate."""
    times = {name: [] for phase in PHASES for name in (phase, f"{phase}_cpu")}
    source = batches(dm)
    clocks = (time.perf_counter, time.process_time)
    for _ in range(steps):
        marks = [tuple(c() for c in clocks)]
        batch = next(source)
        marks.append(tuple(c() for c in clocks))
        loss = module.training_loss(batch)
        marks.append(tuple(c() for c in clocks))
        optimizer.zero_grad()
        loss.backward()
        marks.append(tuple(c() for c in clocks))
        optimizer.step()
        marks.append(tuple(c() for c in clocks))
        for i, phase in enumerate(PHASES):
            times[phase].append(marks[i + 1][0] - marks[i][0])
            times[f"{phase}_cpu"].append(marks[i + 1][1] - marks[i][1])
    return times


def touch_only(entities: int, rows: int, dim: int, steps: int) -> dict[str, float]:
    """Median seconds to gather ``rows`` random rows of an ``[entities, dim]`` table and
    index-add into them, over one table and over three (a parameter and Adam's moments)."""
    import torch

    g = torch.Generator().manual_seed(0)
    tables = [torch.randn(entities, dim) for _ in range(3)]
    out = {}
    for count in (1, 3):
        seconds = []
        for _ in range(steps):
            idx = torch.randint(0, entities, (rows,), generator=g)
            start = time.perf_counter()
            for table in tables[:count]:
                table.index_add_(0, idx, table[idx] * 1e-3)
            seconds.append(time.perf_counter() - start)
        out[f"gather_add_{count}_tables_s"] = statistics.median(seconds)
    return out


def lightning_fit(dm, module, steps: int) -> dict[str, float]:
    """Medians of bench_scale.py's two clocks over one Lightning fit of ``steps`` batches
    (the first tenth not counted): ``lightning_cycle_s`` (one batch's end to the next's)
    and ``lightning_step_s`` (a batch's start to its end), wall and (``_cpu``) CPU seconds."""
    import lightning as L

    class Clock(L.Callback):
        def __init__(self) -> None:
            self.seconds = {"cycle": [], "step": [], "cycle_cpu": [], "step_cpu": []}
            self._start = self._last = (0.0, 0.0)

        @staticmethod
        def now() -> tuple[float, float]:
            return time.perf_counter(), time.process_time()

        def on_train_epoch_start(self, trainer, module) -> None:
            self._last = self.now()

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            self._start = self.now()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            now = self.now()
            for suffix, i in (("", 0), ("_cpu", 1)):
                self.seconds[f"step{suffix}"].append(now[i] - self._start[i])
                self.seconds[f"cycle{suffix}"].append(now[i] - self._last[i])
            self._last = now

    clock = Clock()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock])
    trainer.fit(module, datamodule=dm)
    skip = len(clock.seconds["step"]) // 10
    return {f"lightning_{name}_s": statistics.median(values[skip:]) for name, values in clock.seconds.items()}


def medians(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per target (``synthetic-<entities>`` or the folder's name): the median of each
    timing over its repeats."""
    out: dict[str, dict[str, float]] = {}
    for key in dict.fromkeys(_target(r) for r in rows):
        mine = [r for r in rows if _target(r) == key]
        out[key] = {k: statistics.median(r[k] for r in mine) for k in mine[0]
                    if k.endswith("_s") and k != "build_s"}
        out[key]["entities"] = mine[0]["entities"]
    return out


def _target(row: dict) -> str:
    return f"synthetic-{row['entities']}" if row["data"] == "synthetic" else Path(row["data"]).name


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    targets = list(args.entities) + ([args.reference] if args.reference else [])
    for repeat, entities in ((r, e) for r in range(args.repeat) for e in targets):
        start = time.perf_counter()
        kg, dm, module, optimizer = build(entities, args)
        built = time.perf_counter() - start
        times = run_steps(dm, module, optimizer, args.warmup + args.steps)
        row = {"data": entities if isinstance(entities, str) else "synthetic", "entities": kg.num_entities,
               "relations": kg.num_relations, "train_triples": int(kg.triples("train").shape[0]),
               "optimizer": args.optimizer, "steps": args.steps, "repeat": repeat, "build_s": built,
               "loadavg": round(os.getloadavg()[0], 2)}
        row.update({f"{name}_s": statistics.median(seconds[args.warmup:]) for name, seconds in times.items()})
        row["total_s"] = sum(row[f"{phase}_s"] for phase in PHASES)
        row["total_cpu_s"] = sum(row[f"{phase}_cpu_s"] for phase in PHASES)
        if args.touch_only:
            row.update(touch_only(kg.num_entities, dm.loader.batch_size * 2 + 64, 64, args.steps))
        if args.lightning:
            row.update(lightning_fit(dm, module, args.steps))
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run_steps(dm, module, optimizer, args.profile_steps)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
        del kg, dm, module, optimizer
    if args.json_out:
        out = {"command": "python " + " ".join([str(Path(sys.argv[0]).relative_to(REPO)
                                                    if Path(sys.argv[0]).is_absolute() else sys.argv[0]),
                                                   *sys.argv[1:]]),
               "settings": {k: v for k, v in vars(args).items() if k != "json_out"},
               "code": measure.code_version(REPO), "machine": measure.machine(), "rows": rows,
               "medians": medians(rows)}
        measure.write_json(Path(args.json_out), out)
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
