#!/usr/bin/env python
"""What PPAT learns on the synthetic rotation task of ``tests/test_ppat.py``.

``Y = X R^T + noise`` for a Haar-random orthogonal ``R`` and ``X`` a cloud around a mean
(``tests/test_ppat.py::_rotated_pair``); the two-timescale setting of
``test_ppat_moves_w_toward_the_clouds_mean_direction`` (identity start, generator SGD 0.002
without momentum, MUSE's beta 0.01, 18 epochs, small discriminators). Per seed it prints,
before and after PPAT: ``‖W − R‖/‖R‖`` (a random rotation: ~1.41), the mean cosine
between ``W x_i`` and ``y_i`` (what the test asserts), and the same cosine on the centred
rows (what a learnt rotation would raise; the mean direction alone does not).

    python scripts/bench_ppat_synthetic.py --seeds 0 1 2 3 4 --lam 100
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--lam", type=float, default=100.0, help="PATE noise parameter (100: nearly noiseless)")
    parser.add_argument("--epochs", type=int, default=18)
    args = parser.parse_args()
    from test_ppat import _rotated_pair

    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.methods.fkge.ppat import PPATClient, PPATHost, run_ppat

    print(f"{'seed':>4}  {'|W-R|/|R|':>17}  {'cosine':>17}  {'centred cosine':>17}")
    for seed in args.seeds:
        x, y = _rotated_pair(seed)
        rotation = hidden_rotation(seed, *x.shape)
        client = PPATClient(x, init="identity", lr=0.002, momentum=0.0, orthogonalize=0.01, seed=seed)
        host = PPATHost(y, hidden=32, lam=args.lam, seed=seed, noise_seed=seed)

        def stats():
            w, t = client.w.detach(), client.translate(x)
            centred = F.cosine_similarity(t - t.mean(0), y - y.mean(0), dim=1).mean().item()
            return ((w - rotation).norm() / rotation.norm()).item(), F.cosine_similarity(t, y, dim=1).mean().item(), centred

        before = stats()
        run_ppat(client, host, Channel(), epochs=args.epochs, seed=seed)
        after = stats()
        print(f"{seed:>4}  " + "  ".join(f"{b:>7.3f} -> {a:>6.3f}" for b, a in zip(before, after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
