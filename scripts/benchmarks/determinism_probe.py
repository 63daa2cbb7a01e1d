#!/usr/bin/env python
"""Which CPU kernels of a KGE training step repeat bit for bit, and under which settings?

Runs the same kernels on the same seeded inputs in ``--processes`` fresh processes per
setting (1 thread; N threads; N threads with ``torch.use_deterministic_algorithms``) and
prints, per kernel and setting, whether every process produced the same bits ("repeats")
and whether they equal the 1-thread result. Separate processes matter: some kernels only
vary between processes (thread scheduling), never within one.

    python scripts/benchmarks/determinism_probe.py --threads 2 --processes 5
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path


def kernels(torch) -> dict:
    """Forward/backward kernels of a KGE step at UMLS-like sizes (135 entities, d = 256)."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(135, 256, generator=g)
    ids = torch.randint(0, 135, (65536,), generator=g)
    upstream = torch.randn(65536, 256, generator=g)
    out = {}
    w = table.clone().requires_grad_()
    (w[ids] * upstream).sum().backward()
    out["table[ids] backward (index_put_ accumulate)"] = w.grad
    w = table.clone().requires_grad_()
    (w.index_select(0, ids) * upstream).sum().backward()
    out["index_select backward (index_add_)"] = w.grad
    out["sum of 16M floats"] = upstream.sum()
    out["mean of 16M floats"] = upstream.mean()
    out["L1 norm over d"] = torch.linalg.vector_norm(upstream, ord=1, dim=-1)
    out["cdist p=1"] = torch.cdist(upstream[:1024], table, p=1)
    out["matmul"] = upstream[:4096] @ table.T
    return out


def child(threads: int, deterministic: bool, path: str) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    torch.save({k: v.detach() for k, v in kernels(torch).items()}, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1] == "1", args.child[2])
        return 0

    import torch

    settings = [("1 thread", 1, False), (f"{args.threads} threads", args.threads, False),
                (f"{args.threads} threads + deterministic", args.threads, True)]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, threads, det in settings:
            runs = []
            for i in range(args.processes):
                path = str(Path(tmp) / f"{threads}_{int(det)}_{i}.pt")
                subprocess.run([sys.executable, __file__, "--child", str(threads), str(int(det)), path],
                               check=True)
                runs.append(torch.load(path))
            results[label] = runs
    reference = results["1 thread"][0]
    print(f"{'kernel':<46}{'setting':<32}{'repeats':>9}{'== 1 thread':>13}")
    for kernel in reference:
        for label, runs in results.items():
            repeats = all(torch.equal(r[kernel], runs[0][kernel]) for r in runs)
            same = all(torch.equal(r[kernel], reference[kernel]) for r in runs)
            print(f"{kernel:<46}{label:<32}{str(repeats):>9}{str(same):>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
