#!/usr/bin/env python
"""Does whitening the client's rows help the supervised release on real KGs? (FKGE)

For every ordered pair of a run's pre-trained KGs (``<run>/pretrained/<kg>.pt``, the
federation rebuilt from the run's ``config.yaml``): the supervised release of
:mod:`lightning_fedkg.methods.fkge.supervised` fitted on a random 80% of the aligned pairs
(the client's rows under a random ``W0``, whitened by each power, the host's
cross-covariance plus the Gaussian noise of ``--epsilon`` per release under replace-one),
scored on the other 20%: the mean cosine of the translated rows with their own host rows,
and on the fitted pairs (``in-sample``). Means over pairs and ``--draws`` draws of ``W0`` and
the noise; ``auto`` is the power :func:`whitening_power` picks (the smallest error predicted
for near-isometric spaces); ``exact`` the noise-free plain Procrustes.

    python scripts/tools/fkge_whitening.py runs/umls_fkge --epsilon 4
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
from torch.nn.functional import cosine_similarity

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="an FKGE run folder with pretrained/ and config.yaml")
    parser.add_argument("--epsilon", type=float, default=4.0, help="per release, replace-one, delta 1e-5")
    parser.add_argument("--draws", type=int, default=10)
    args = parser.parse_args()
    from lightning_fedkg.config import load_config
    from lightning_fedkg.methods.fkge.federation import FKGE
    from lightning_fedkg.methods.fkge.modes import random_rotation
    from lightning_fedkg.methods.fkge.multisource import aligned_pairs
    from lightning_fedkg.methods.fkge.supervised import decode, precondition, release_cost, unit_rows, whitening_power

    torch.set_num_threads(1)
    run = Path(args.run)
    sources = FKGE.sources(load_config(run / "config.yaml", []))
    rows = {n: torch.load(run / "pretrained" / f"{n}.pt", weights_only=False)["model"]["entity_emb"].float()
            for n in sources}
    sigma = release_cost(args.epsilon, 1e-5, 32, "replace").sigma
    results: dict = {}
    for a, b in itertools.permutations(sources, 2):
        pairs = aligned_pairs(sources[a], sources[b])
        x, y = rows[a][pairs[:, 0]], rows[b][pairs[:, 1]]
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        cut = len(x) - max(1, int(0.2 * len(x)))
        fit, test = perm[:cut], perm[cut:]
        yu = unit_rows(y)
        for power in (0.0, 0.25, 0.5, "auto", "exact"):
            for draw in range(args.draws):
                w0 = random_rotation(x.shape[1], 100 + draw)
                z = unit_rows(x[fit] @ w0.T)
                p = 0.0 if power == "exact" else (whitening_power(z) if power == "auto" else power)
                sent, bmat = precondition(z, p)
                m = yu[fit].T @ unit_rows(sent)
                if power != "exact":
                    m = m + sigma * torch.randn(m.shape, generator=torch.Generator().manual_seed(draw))
                w = decode(m, bmat, p) @ w0
                held = float(cosine_similarity(unit_rows(x[test]) @ w.T, yu[test]).mean())
                fitted = float(cosine_similarity(unit_rows(x[fit]) @ w.T, yu[fit]).mean())
                results.setdefault(power, []).append((held, fitted, p))
    print(f"{run}: epsilon {args.epsilon:g} per release (sigma {sigma:.3f}), {len(sources)} KGs, "
          f"{args.draws} draws per ordered pair")
    print(f"{'power':>6} {'held-out cosine':>16} {'in-sample':>10} {'mean power':>11}")
    for power, values in results.items():
        n = len(values)
        held, fitted, p = (sum(v[i] for v in values) / n for i in range(3))
        print(f"{str(power):>6} {held:>16.3f} {fitted:>10.3f} {p:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
