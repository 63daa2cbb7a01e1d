#!/usr/bin/env python
"""Are two KGs' embedding spaces near-isometric on their shared entities? (FKGE)

A translation that is an orthogonal map (PPAT's generator, the supervised alignment) can
only align two KGs whose aligned rows have similar geometry. For every ordered pair of the
run's pre-trained KGs (``<run>/pretrained/<kg>.pt``, the federation rebuilt from the run's
``config.yaml``) this prints:

* ``gram``: the correlation of the two Gram matrices of the aligned rows (cosines of
  centred rows, all pairs of entities; 1 = isometric up to a rotation, 0 = unrelated);
* the best any orthogonal translation can do with every training pair known and no noise:
  orthogonal Procrustes on the unit rows of a random 80% of the pairs, scored on the other
  20%: their mean cosine with their own row, and Hits@1 / Hits@10 of that row among all the
  host's entity rows by cosine (``chance``: 1 / 10 over the host's entities).

    python scripts/tools/fkge_isometry.py runs/umls_fkge
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
from torch.nn.functional import cosine_similarity, normalize


def gram_correlation(x: torch.Tensor, y: torch.Tensor) -> float:
    """Correlation of the off-diagonal cosines of the centred rows of ``x`` and of ``y``."""
    gx, gy = (normalize(a - a.mean(0), dim=1) for a in (x, y))
    upper = torch.triu_indices(len(x), len(x), 1)
    cx, cy = (g @ g.T for g in (gx, gy))
    return float(torch.corrcoef(torch.stack([cx[upper[0], upper[1]], cy[upper[0], upper[1]]]))[0, 1])


def heldout_procrustes(x: torch.Tensor, y: torch.Tensor, host_table: torch.Tensor, host_ids: torch.Tensor,
                       seed: int, share: float = 0.2) -> dict:
    """Exact orthogonal Procrustes on ``1 - share`` of the pairs, scored on the rest."""
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = len(x) - max(1, int(share * len(x)))
    fit, test = perm[:cut], perm[cut:]
    xu, yu = normalize(x, dim=1), normalize(y, dim=1)
    u, _, vh = torch.linalg.svd(yu[fit].T @ xu[fit])
    translated = xu[test] @ (u @ vh).T
    sim = normalize(translated, dim=1) @ normalize(host_table, dim=1).T
    own = sim[torch.arange(len(test)), host_ids[test]]
    rank = (sim > own[:, None]).sum(1)
    return {"cosine": float(cosine_similarity(translated, yu[test]).mean()),
            "in_sample": float(cosine_similarity(xu[fit] @ (u @ vh).T, yu[fit]).mean()),
            "hits1": float((rank < 1).float().mean()), "hits10": float((rank < 10).float().mean()),
            "pairs": len(x), "held_out": len(test)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="an FKGE run folder with pretrained/ and config.yaml")
    parser.add_argument("--seed", type=int, default=0, help="the 80/20 split")
    parser.add_argument("--max-pairs", type=int, default=4000, help="Gram correlation on at most this many pairs")
    args = parser.parse_args()
    from lightning_fedkg.config import load_config
    from lightning_fedkg.methods.fkge.federation import FKGE
    from lightning_fedkg.methods.fkge.multisource import aligned_pairs

    run = Path(args.run)
    sources = FKGE.sources(load_config(run / "config.yaml", []))
    rows = {name: torch.load(run / "pretrained" / f"{name}.pt", weights_only=False)["model"]["entity_emb"].float()
            for name in sources}
    print(f"{'client -> host':<28} {'pairs':>6} {'gram':>6} {'cos':>6} {'in-sample':>9} {'H@1':>6} {'H@10':>6} "
          f"{'chance H@1/H@10':>16}")
    for a, b in itertools.permutations(sources, 2):
        pairs = aligned_pairs(sources[a], sources[b])
        x, y = rows[a][pairs[:, 0]], rows[b][pairs[:, 1]]
        keep = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))[: args.max_pairs]
        gram = gram_correlation(x[keep], y[keep])
        r = heldout_procrustes(x, y, rows[b], pairs[:, 1], args.seed)
        n = rows[b].shape[0]
        print(f"{a + ' -> ' + b:<28} {r['pairs']:>6} {gram:>6.3f} {r['cosine']:>6.3f} {r['in_sample']:>9.3f} "
              f"{r['hits1']:>6.3f} {r['hits10']:>6.3f} {1 / n:>8.4f}/{10 / n:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
