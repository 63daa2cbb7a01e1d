#!/usr/bin/env python
"""Benchmark KGE training throughput and full filtered evaluation on one KG.

Prints, per model and negative mode: training throughput (positive triples per second,
measured over ``--train-batches`` batches after a warm-up), the time of one full filtered
evaluation of the test split (every tail and head query ranked against all entities), the
resulting test MRR (of the briefly trained model: a sanity figure, not a quality result),
and the process's peak resident memory.

    python scripts/benchmarks/bench_kge.py --data ../shared/data/FB15k-237 --models transe rotate \
        --dim 256 --negatives 256 --batch-size 512
"""

from __future__ import annotations

import argparse
import time

import torch

from lightning_fedkg.data import KGDataModule, LoaderSettings, UniformSampler, load_kg
from lightning_fedkg.measure import peak_rss_mib
from lightning_fedkg.models import KGEModule


def time_training(module: KGEModule, dm: KGDataModule, batches: int, warmup: int = 3) -> float:
    """Positive triples per second of forward + backward + Adam step (no Lightning loop)."""
    optimizer = torch.optim.Adam(module.parameters(), lr=module.hparams.lr)
    iterator = iter(dm.train_dataloader())
    done = 0
    start = None
    for step in range(warmup + batches):
        if step == warmup:
            start = time.perf_counter()
        batch = next(iterator)
        loss = module.training_loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= warmup:
            done += batch["positive"].shape[0]
    return done / (time.perf_counter() - start)


@torch.no_grad()
def time_evaluation(module: KGEModule, dm: KGDataModule) -> tuple[float, dict]:
    """Seconds for one full filtered test evaluation (both sides), and its metrics."""
    module.eval()
    metric = module.test_metric
    metric.reset()
    start = time.perf_counter()
    for batch in dm.test_dataloader():
        module.update_ranking(batch, metric)
    elapsed = time.perf_counter() - start
    return elapsed, {k: float(v) for k, v in metric.compute().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="../shared/data/FB15k-237")
    parser.add_argument("--models", nargs="+", default=["transe", "rotate"])
    parser.add_argument("--modes", nargs="+", default=["per_triple", "shared"])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--negatives", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument("--train-batches", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--skip-eval", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    t0 = time.perf_counter()
    kg = load_kg(args.data)
    print(f"loaded {kg.name}: {kg.stats()} in {time.perf_counter() - t0:.1f}s; torch threads {torch.get_num_threads()}")
    print(f"{'model':<9}{'negatives':<12}{'triples/s':>11}{'eval s':>9}{'queries/s':>11}{'MRR':>8}{'peak MiB':>10}")
    for model in args.models:
        for mode in args.modes:
            dm = KGDataModule(
                kg,
                UniformSampler(args.negatives, corruption="tail", mode=mode),
                LoaderSettings(batch_size=args.batch_size, eval_batch_size=args.eval_batch_size, eval_sides="both"),
                seed=0,
            )
            dm.setup("fit")
            module = KGEModule(
                model=model,
                num_entities=kg.num_entities,
                num_relations=kg.num_relations,
                dim=args.dim,
                gamma=10.0,
                lr=1e-3,
            )
            throughput = time_training(module, dm, args.train_batches)
            if args.skip_eval or mode != args.modes[0]:
                eval_s, mrr, qps = float("nan"), float("nan"), float("nan")
            else:
                dm.setup("test")
                eval_s, metrics = time_evaluation(module, dm)
                mrr = metrics["mrr"]
                qps = metrics["count"] / eval_s
            print(
                f"{model:<9}{mode:<12}{throughput:>11.0f}{eval_s:>9.1f}{qps:>11.0f}{mrr:>8.4f}{peak_rss_mib():>10.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
