#!/usr/bin/env python
"""What each alignment learns on synthetic tasks with a hidden rotation ``R``.

Two tasks (``--task``):

* ``mean`` -- ``tests/test_ppat.py``'s: ``X`` a cloud around a mean of norm 3, ``Y = X R^T +
  noise``; PPAT's two-timescale setting (identity start, generator SGD 0.002 without
  momentum, MUSE's beta 0.01, small discriminators). Prints ``‖W − R‖/‖R‖``, the mean
  cosine of ``W x_i`` and ``y_i``, and the same on centred rows.
* ``clusters`` (default) -- zero-mean and anisotropic: ``X`` drawn from 6 Gaussian
  clusters (d = 8, m = 512), centred and scaled per axis, ``Y = X R^T + noise``. The mean
  direction gives nothing here; only the shape of the distribution identifies ``R``.
  Methods (``--methods``): ``ppat`` (PPAT without privacy noise, lambda = 100, MUSE's
  recipe: label smoothing 0.1, input dropout 0.1, orthogonalisation; generator SGD 0.01,
  momentum 0.9; ``--epochs``), ``gan`` (a plain MUSE-style GAN with no PATE at all: one
  discriminator on real vs generated rows, 5 discriminator steps per generator step,
  ``--iterations``), ``supervised`` (the supervised DP alignment of
  ``lightning_fedkg/methods/fkge/supervised.py`` at epsilon 1, 4, 16 and exact).
  Prints ``‖W − R‖/‖R‖`` from W's start to the end (a random rotation: ~1.41) and, for
  PPAT, the share of teacher votes fooled in the last epoch.

    python scripts/bench_ppat_synthetic.py --task clusters --seeds 0 1 2 3 4
    python scripts/bench_ppat_synthetic.py --task mean --seeds 0 1 2 3 4 --lam 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def hidden_rotation(seed: int, m: int, d: int) -> torch.Tensor:
    """The ``R`` of ``_rotated_pair(seed)``: the same draws in the same order."""
    g = torch.Generator().manual_seed(seed)
    torch.randn(d, generator=g)
    torch.randn(m, d, generator=g)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g))
    return q * torch.sign(torch.diagonal(r))


def haar(d: int, g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def clusters_task(seed: int, m: int = 512, d: int = 8, k: int = 6):
    """``(X, Y, R)``: zero-mean, anisotropic, clustered ``X``; ``Y = X R^T + 0.05 noise``."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g) * 2.0
    x = centres[torch.randint(0, k, (m,), generator=g)] + 0.3 * torch.randn(m, d, generator=g)
    x = (x - x.mean(0)) * torch.linspace(0.5, 1.5, d)
    rot = haar(d, g)
    return x, x @ rot.T + 0.05 * torch.randn(m, d, generator=g), rot


def error(w: torch.Tensor, rot: torch.Tensor) -> float:
    return float((w - rot).norm() / rot.norm())


def run_ppat_clusters(seed: int, epochs: int) -> tuple[float, float, float]:
    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.methods.fkge.ppat import PPATClient, PPATHost, run_ppat

    x, y, rot = clusters_task(seed)
    client = PPATClient(x, init="orthogonal", lr=0.01, momentum=0.9, orthogonalize=0.01, seed=seed + 100)
    host = PPATHost(y, hidden=64, lam=100.0, seed=seed, noise_seed=seed, smoothing=0.1, dropout=0.1)
    start = error(client.w.detach(), rot)
    out = run_ppat(client, host, Channel(), epochs=epochs, seed=seed)
    return start, error(client.w.detach(), rot), out["epochs"][-1]["teachers_fooled"]


def run_plain_gan(seed: int, iterations: int, batch: int = 64, steps: int = 5) -> tuple[float, float]:
    from lightning_fedkg.methods.fkge.ppat import initial_generator, discriminator

    x, y, rot = clusters_task(seed)
    torch.manual_seed(seed)
    w = torch.nn.Parameter(initial_generator(x.shape[1], "orthogonal", seed + 100))
    disc = discriminator(x.shape[1], 256, dropout=0.1)
    d_opt, g_opt = torch.optim.SGD(disc.parameters(), lr=0.1), torch.optim.SGD([w], lr=0.1)
    g = torch.Generator().manual_seed(seed)
    start = error(w.detach(), rot)
    for _ in range(iterations):
        for _ in range(steps):
            xb = x[torch.randint(0, len(x), (batch,), generator=g)]
            yb = y[torch.randint(0, len(y), (batch,), generator=g)]
            logits = disc(torch.cat([yb, (xb @ w.T).detach()])).squeeze(-1)
            target = torch.cat([torch.full((batch,), 0.9), torch.full((batch,), 0.1)])
            loss = F.binary_cross_entropy_with_logits(logits, target)
            d_opt.zero_grad()
            loss.backward()
            d_opt.step()
        xb = x[torch.randint(0, len(x), (batch,), generator=g)]
        disc.eval()
        loss = F.binary_cross_entropy_with_logits(disc(xb @ w.T).squeeze(-1), torch.ones(batch))
        disc.train()
        g_opt.zero_grad()
        loss.backward()
        g_opt.step()
        with torch.no_grad():
            cur = w.detach().clone()
            w.copy_(1.01 * cur - 0.01 * (cur @ cur.T) @ cur)
    return start, error(w.detach(), rot)


def run_supervised(seed: int, epsilon: float | None) -> tuple[float, float]:
    from lightning_fedkg.federated.message import Message
    from lightning_fedkg.methods.fkge.supervised import CROSSCOV, ROWS, AlignmentHost, procrustes, unit_rows

    x, y, rot = clusters_task(seed)
    w0 = haar(x.shape[1], torch.Generator().manual_seed(seed + 100))
    host = AlignmentHost(y, epsilon, noise_seed=seed)
    reply = host.on_rows(Message(arrays={ROWS: unit_rows(x @ w0.T)}))
    return error(w0, rot), error(procrustes(reply.arrays[CROSSCOV]) @ w0, rot)


def mean_task(seeds, lam: float, epochs: int) -> None:
    from test_ppat import _rotated_pair

    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.methods.fkge.ppat import PPATClient, PPATHost, run_ppat

    print(f"{'seed':>4}  {'|W-R|/|R|':>17}  {'cosine':>17}  {'centred cosine':>17}")
    for seed in seeds:
        x, y = _rotated_pair(seed)
        rotation = hidden_rotation(seed, *x.shape)
        client = PPATClient(x, init="identity", lr=0.002, momentum=0.0, orthogonalize=0.01, seed=seed)
        host = PPATHost(y, hidden=32, lam=lam, seed=seed, noise_seed=seed)

        def stats():
            w, t = client.w.detach(), client.translate(x)
            centred = F.cosine_similarity(t - t.mean(0), y - y.mean(0), dim=1).mean().item()
            return error(w, rotation), F.cosine_similarity(t, y, dim=1).mean().item(), centred

        before = stats()
        run_ppat(client, host, Channel(), epochs=epochs, seed=seed)
        after = stats()
        print(f"{seed:>4}  " + "  ".join(f"{b:>7.3f} -> {a:>6.3f}" for b, a in zip(before, after)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=["clusters", "mean"], default="clusters")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--lam", type=float, default=100.0, help="mean task: PATE noise parameter")
    parser.add_argument("--epochs", type=int, default=None, help="PPAT epochs (mean: 18, clusters: 30)")
    parser.add_argument("--iterations", type=int, default=3000, help="plain GAN generator steps")
    parser.add_argument("--methods", default="ppat,gan,supervised")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.task == "mean":
        mean_task(args.seeds, args.lam, args.epochs or 18)
        return 0
    methods = args.methods.split(",")
    for seed in args.seeds:
        parts = []
        if "ppat" in methods:
            start, end, fooled = run_ppat_clusters(seed, args.epochs or 30)
            parts.append(f"PPAT {start:.3f} -> {end:.3f} (fooled {fooled:.2f})")
        if "gan" in methods:
            start, end = run_plain_gan(seed, args.iterations)
            parts.append(f"plain GAN {start:.3f} -> {end:.3f}")
        if "supervised" in methods:
            cells = [f"{eps if eps else 'exact'}: {run_supervised(seed, eps)[1]:.3f}" for eps in (1.0, 4.0, 16.0, None)]
            parts.append("supervised " + ", ".join(cells))
        print(f"seed {seed}: " + " | ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
