"""Synthetic knowledge graphs with power-law entity degrees, for measuring scale
(``fedkg data synth``).

:func:`synthetic_splits` draws the triples (vectorized, deterministic by seed) and
:func:`write_synthetic` writes them as a folder of named triples that
:func:`~lightning_fedkg.data.loading.load_kg` reads like any other. The model of the graph is in
:func:`synthetic_splits`; docs/datasets.md shows the command.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .kg import SPLITS, first_occurrence, triple_keys

__all__ = ["synthetic_splits", "write_synthetic", "write_id_triples"]


def _zipf_sampler(size: int, exponent: float, generator: torch.Generator):
    """A function ``draw(k)`` of ``k`` ids in ``[0, size)``: the id of popularity rank ``j``
    (a random permutation of the ids, so popular ids are not the small ones) is drawn with
    probability proportional to ``(j + 1) ** -exponent``, by inverting the cumulative weights."""
    rank_to_id = torch.randperm(size, generator=generator)
    weights = torch.arange(1, size + 1, dtype=torch.float64).pow(-exponent)
    cumulative = torch.cumsum(weights, 0)
    cumulative /= cumulative[-1].clone()

    def draw(k: int) -> Tensor:
        u = torch.rand(k, dtype=torch.float64, generator=generator)
        rank = torch.searchsorted(cumulative, u, right=True).clamp_(max=size - 1)
        return rank_to_id[rank]

    return draw


def synthetic_splits(num_entities: int, num_relations: int, num_triples: int, exponent: float = 0.75,
                     seed: int = 0, valid_frac: float = 0.05, test_frac: float = 0.05) -> dict[str, Tensor]:
    """``{"train", "valid", "test"}`` id triples (``LongTensor[E, 3]``) of a synthetic KG.

    The graph: ``num_triples`` distinct triples without self-loops. The first
    ``num_entities`` form a backbone that gives every entity and every relation a training
    triple: entity ``i`` is the head of one (``i`` in a random order), with relation
    ``i mod R`` and a drawn tail. Every other head and tail is drawn from a Zipf law over the
    entities (rank ``j`` with weight ``(j + 1) ** -exponent``; the degree distribution then
    has a power-law tail ``P(degree = k) ~ k ** -(1 + 1 / exponent)``, about 2.3 at the default
    0.75, in the range of real KGs), relations uniformly. Duplicates and self-loops are
    drawn again (at most 20 rounds). ``valid_frac`` and ``test_frac`` of the triples are
    chosen among the non-backbone ones, so every entity and relation of valid and test occurs
    in train. Everything comes from one ``torch.Generator`` seeded with ``seed``: the same
    arguments give the same triples.

    Raises:
        ValueError: sizes that cannot hold the backbone and the evaluation triples, or
            fewer distinct triples than asked for after 20 rounds (a tiny, dense graph).
    """
    n, r, total = int(num_entities), int(num_relations), int(num_triples)
    if n < 2 or r < 1:
        raise ValueError(f"need at least 2 entities and 1 relation, got {n} and {r}")
    if r > n:
        raise ValueError(f"the backbone gives each relation a triple of its own: relations ({r}) <= entities ({n})")
    if exponent < 0:
        raise ValueError(f"exponent must be >= 0, got {exponent}")
    num_eval = round(valid_frac * total) + round(test_frac * total)
    if min(valid_frac, test_frac) < 0 or total < n + num_eval:
        raise ValueError(f"{total} triples cannot hold the {n}-triple backbone and {num_eval} evaluation triples; "
                         f"ask for at least {n + num_eval} (or fewer entities)")
    generator = torch.Generator().manual_seed(int(seed))
    draw_entities = _zipf_sampler(n, float(exponent), generator)

    heads = torch.randperm(n, generator=generator)
    backbone = torch.stack([heads, torch.arange(n) % r, draw_entities(n)], 1)
    # a backbone self-loop takes the next entity as its tail instead
    loop = backbone[:, 0] == backbone[:, 2]
    backbone[loop, 2] = (backbone[loop, 2] + 1) % n
    triples = backbone
    for _ in range(20):
        missing = total - triples.shape[0]
        if missing == 0:
            break
        # Draw more than missing: duplicates of popular pairs and self-loops are dropped.
        k = missing + missing // 10 + 64
        fresh = torch.stack([draw_entities(k), torch.randint(0, r, (k,), generator=generator), draw_entities(k)], 1)
        fresh = fresh[fresh[:, 0] != fresh[:, 2]]
        merged = torch.cat([triples, fresh])
        merged = merged[first_occurrence(triple_keys(merged, n, r))]  # first copies, backbone first
        triples = merged[:total]
    if triples.shape[0] < total:
        raise ValueError(f"only {triples.shape[0]} distinct triples found for {total} asked "
                         f"({n} entities, {r} relations): the graph is too dense")
    # Evaluation triples among the non-backbone ones (rows n.. in drawn order), then shuffle train.
    chosen = n + torch.randperm(total - n, generator=generator)[:num_eval]
    is_eval = torch.zeros(total, dtype=torch.bool)
    is_eval[chosen] = True
    num_valid = round(valid_frac * total)
    train = triples[~is_eval]
    return {
        "train": train[torch.randperm(train.shape[0], generator=generator)],
        "valid": triples[chosen[:num_valid]],
        "test": triples[chosen[num_valid:]],
    }


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """``uint8[len(values), width]``: the zero-padded decimal digits of each value."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return (values[:, None] // powers % 10 + ord("0")).astype(np.uint8)


def write_id_triples(path: str | Path, triples: Tensor, num_entities: int, num_relations: int) -> None:
    """Write ``triples`` as ``e<id><TAB>r<id><TAB>e<id>`` lines, ids zero-padded to the width
    of the largest (so the names sort like the ids). Built as one byte array (no Python loop
    over lines): 10^7 triples take a couple of seconds."""
    t = triples.numpy().astype(np.int64)
    we, wr = len(str(max(num_entities - 1, 0))), len(str(max(num_relations - 1, 0)))
    columns = [np.full((t.shape[0], 1), ord(c), dtype=np.uint8) for c in "er\te\t\n"]
    e, r, tab1, e2, tab2, newline = columns
    line = np.concatenate([e, _digits(t[:, 0], we), tab1, r, _digits(t[:, 1], wr), tab2, e2,
                           _digits(t[:, 2], we), newline], axis=1)
    Path(path).write_bytes(line.tobytes())


def write_synthetic(out: str | Path, num_entities: int, num_relations: int, num_triples: int,
                    exponent: float = 0.75, seed: int = 0, valid_frac: float = 0.05,
                    test_frac: float = 0.05) -> dict[str, int]:
    """Draw :func:`synthetic_splits` and write ``out/{train,valid,test}.txt`` (named triples,
    :func:`write_id_triples`); returns ``{split: triples}``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    splits = synthetic_splits(num_entities, num_relations, num_triples, exponent, seed, valid_frac, test_frac)
    for split in SPLITS:
        write_id_triples(folder / f"{split}.txt", splits[split], num_entities, num_relations)
    return {split: int(splits[split].shape[0]) for split in SPLITS}
