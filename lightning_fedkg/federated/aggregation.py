"""Holder-mean aggregation of row tables held partially by several clients.

The server keeps a union table with one row per global item (entity for FedE, relation
for FedR). Client ``c`` holds the rows ``idx_c`` (its local→global index, which *is* the
permutation matrix ``P^c`` of FedE, Chen et al., IJCKG 2021, Eq. 1) and uploads its
trained copy ``E^c`` of them. FedE's aggregation (Eq. 2) averages each row over the
clients that hold it, never over all ``C`` clients:

    E_new[i] = Σ_c v^c_i E^c[j_c(i)] / Σ_c v^c_i

Implemented with one ``index_add_`` over the concatenated uploads plus a count vector
(no Python loop over rows). Sums are accumulated in float64 so that averaging identical
uploads returns them bit for bit, and the result is cast back to the table's dtype.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["holder_sums", "holder_mean", "damped_holder_mean", "holder_counts", "mean_from_sums",
           "damped_mean_from_sums"]


def _check(num_rows: int, indices: Sequence[Tensor], rows: Sequence[Tensor]) -> None:
    if len(indices) != len(rows):
        raise ValueError(f"{len(indices)} index tensors but {len(rows)} row tensors")
    for k, (idx, r) in enumerate(zip(indices, rows)):
        if idx.dim() != 1 or r.shape[0] != idx.shape[0]:
            raise ValueError(
                f"upload {k}: index of shape {tuple(idx.shape)} does not match rows of shape {tuple(r.shape)}"
            )
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= num_rows):
            raise ValueError(f"upload {k}: index out of range for a table of {num_rows} rows")
        if idx.numel() != torch.unique(idx).numel():
            raise ValueError(f"upload {k}: a client cannot hold the same row twice")


#: Elements (of a float64 row block) the server's steps work on at a time. Whole-table float64
#: temporaries made them superlinear in the table (a copy of every upload at once: 1.4 GB and
#: 6 of 12 s at 10^6 entities, 3 clients, dim 64; docs/results/scale.md); in blocks of rows,
#: element for element the same arithmetic, they stay linear.
CHUNK_ELEMENTS = 1 << 21


def _row_blocks(num_rows: int, like: Tensor):
    """Slices of ``num_rows`` rows, each of about :data:`CHUNK_ELEMENTS` elements of ``like``'s rows."""
    step = max(1, CHUNK_ELEMENTS // max(1, math.prod(like.shape[1:])))
    return (slice(start, start + step) for start in range(0, num_rows, step))


def holder_counts(num_rows: int, indices: Sequence[Tensor], device=None) -> Tensor:
    """``LongTensor[num_rows]``: how many of the given index sets contain each row (Σ_c v^c)."""
    counts = torch.zeros(num_rows, dtype=torch.long, device=device)
    if indices:
        flat = torch.cat([i.to(device=counts.device, dtype=torch.long) for i in indices])
        counts.index_add_(0, flat, torch.ones_like(flat))
    return counts


def holder_sums(
    num_rows: int, indices: Sequence[Tensor], rows: Sequence[Tensor], device=None
) -> tuple[Tensor, Tensor]:
    """Per-row sum of the uploaded rows (float64) and the number of uploads per row.

    Args:
        num_rows: size of the union table.
        indices: per upload, ``LongTensor[n_c]`` of global row ids (``idx_c``).
        rows: per upload, ``Tensor[n_c, ...]``, row ``j`` belonging to global row ``idx_c[j]``.

    Returns:
        ``(sums [num_rows, ...] float64, counts LongTensor[num_rows])``.
    """
    _check(num_rows, indices, rows)
    if not rows:
        raise ValueError("holder_sums needs at least one upload")
    trailing = rows[0].shape[1:]
    device = device if device is not None else rows[0].device
    sums = torch.zeros((num_rows, *trailing), dtype=torch.float64, device=device)
    counts = torch.zeros(num_rows, dtype=torch.long, device=device)
    # Upload by upload, a block of rows at a time, in the order one index_add over all uploads
    # concatenated would add them: the same sums, bit for bit (CHUNK_ELEMENTS says why).
    for idx, upload in zip(indices, rows):
        idx = idx.to(device=device, dtype=torch.long)
        for block in _row_blocks(idx.shape[0], upload):
            sums.index_add_(0, idx[block], upload[block].to(device=device, dtype=torch.float64))
        counts.index_add_(0, idx, torch.ones_like(idx))
    return sums, counts


def _rows_view(counts: Tensor, like: Tensor) -> Tensor:
    return counts.view(-1, *([1] * (like.dim() - 1)))


def holder_mean(table: Tensor, indices: Sequence[Tensor], rows: Sequence[Tensor]) -> Tensor:
    """FedE's holder-mean over the *uploading* clients (Eq. 2 with ``v^c`` of the uploaders).

    A row held by one uploader gets that client's value, a row held by several gets their
    mean, and a row that no uploader holds keeps its value in ``table`` (it is never
    divided by zero and never reset). Returns a new tensor shaped and typed like ``table``.
    """
    if not rows:
        return table.clone()
    sums, counts = holder_sums(table.shape[0], indices, rows, device=table.device)
    return mean_from_sums(table, sums, counts)


def mean_from_sums(table: Tensor, sums: Tensor, counts: Tensor) -> Tensor:
    """:func:`holder_mean` from per-row sums (float64) and upload counts: what secure
    aggregation reveals (:mod:`~lightning_fedkg.privacy.secure`), which never sees the uploads themselves."""
    counts = counts.to(device=sums.device)
    out = torch.empty_like(table)
    for block in _row_blocks(table.shape[0], sums):  # CHUNK_ELEMENTS says why
        part, held = sums[block], counts[block]
        mean = part / _rows_view(held.clamp(min=1), part).to(part.dtype)
        new = torch.where(_rows_view(held > 0, part), mean, table[block].to(device=sums.device, dtype=torch.float64))
        out[block] = new.to(device=table.device, dtype=table.dtype)
    return out


def damped_holder_mean(
    table: Tensor, indices: Sequence[Tensor], rows: Sequence[Tensor], all_holders: Tensor
) -> Tensor:
    """Holder-mean over *all* holders, where holders that did not upload contribute ``table``.

    This is what the official FedE code computes when only a fraction of clients trains
    in a round (FedE's fede.py): with ``N_i`` the number of all holders of row ``i``,

        E_new[i] = E[i] + (1 / N_i) Σ_{c uploaded, holds i} (E^c[i] − E[i]),

    i.e. unsampled holders count as having returned the current row. With every holder
    uploading it equals :func:`holder_mean`. Rows with ``N_i = 0`` are unchanged.

    Args:
        all_holders: ``LongTensor[num_rows]``, ``N_i`` over every client of the federation.
    """
    if not rows:
        return table.clone()
    sums, counts = holder_sums(table.shape[0], indices, rows, device=table.device)
    return damped_mean_from_sums(table, sums, counts, all_holders)


def damped_mean_from_sums(table: Tensor, sums: Tensor, counts: Tensor, all_holders: Tensor) -> Tensor:
    """:func:`damped_holder_mean` from per-row sums (float64) and upload counts."""
    counts = counts.to(device=table.device)
    sums = sums.to(device=table.device)
    all_holders = all_holders.to(device=table.device, dtype=torch.long)
    if bool((counts > all_holders).any()):
        raise ValueError("an uploaded row is not counted among its holders")
    out = torch.empty_like(table)
    for block in _row_blocks(table.shape[0], sums):  # CHUNK_ELEMENTS says why
        base, part = table[block].to(torch.float64), sums[block]
        delta = part - _rows_view(counts[block], part).to(torch.float64) * base
        out[block] = (base + delta / _rows_view(all_holders[block].clamp(min=1), part).to(torch.float64)).to(table.dtype)
    return out
