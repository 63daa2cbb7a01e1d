"""Packing tuples of small non-negative ids into one int64 key, with an overflow check.

Set membership, deduplication and sorted lookups over triples or (row, entity) pairs are
done on single int64 keys: ``(h, r, t)`` becomes ``(h * R + r) * N + t``. Such a key silently
wraps around once the product of the column sizes exceeds the int64 range, turning distinct
tuples into equal keys; :func:`pack_keys` refuses those sizes instead. The data layer, the
evaluation code and the fusion model all pack keys through this one helper.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["INT64_MAX", "KeyOverflowError", "check_key_space", "pack_keys", "unpack_keys"]

INT64_MAX = 2**63 - 1


class KeyOverflowError(ValueError, OverflowError):
    """The tuples cannot be packed into int64 keys: the product of the sizes is too large."""


def check_key_space(sizes: Sequence[int], what: str = "keys") -> None:
    """Raise :class:`KeyOverflowError` unless every key over ``sizes`` fits in int64.

    The check is on the product of the sizes (computed with Python's unbounded ints), which
    bounds every key from above.
    """
    sizes = [int(s) for s in sizes]
    if any(s < 0 for s in sizes):
        raise ValueError(f"key sizes must be non-negative, got {sizes}")
    product = math.prod(sizes)
    if product > INT64_MAX:
        raise KeyOverflowError(
            f"cannot pack {what} into int64: the sizes {sizes} give {product} possible keys, "
            f"more than 2**63-1 = {INT64_MAX}"
        )


def pack_keys(columns: Sequence[Tensor], sizes: Sequence[int], what: str = "keys") -> Tensor:
    """One int64 key per tuple, in mixed radix: ``((c0 * s1 + c1) * s2 + c2) ...``.

    Args:
        columns: integer tensors, broadcastable to one shape; column ``i`` must hold values
            in ``0 .. sizes[i] - 1`` (not checked: this runs inside data loaders).
        sizes: the exclusive upper bound of each column. ``sizes[0]`` does not enter the
            key, only the overflow check.
        what: what is packed, for the error message (``"triples"``).

    Returns:
        ``LongTensor`` of the broadcast shape. Keys are injective over the given ranges and
        sort like the tuples in lexicographic order.

    Raises:
        KeyOverflowError: (a ``ValueError``) when the product of ``sizes`` exceeds 2**63-1.
    """
    if len(columns) != len(sizes) or not columns:
        raise ValueError(f"need one size per column, got {len(columns)} columns and {len(sizes)} sizes")
    check_key_space(sizes, what)
    key = columns[0].long()
    for column, size in zip(columns[1:], sizes[1:]):
        key = key * int(size) + column.long()
    return key


def unpack_keys(keys: Tensor, sizes: Sequence[int]) -> tuple[Tensor, ...]:
    """The columns :func:`pack_keys` packed into ``keys`` with the same ``sizes``."""
    check_key_space(sizes)
    columns = []
    rest = keys.long()
    # A zero size admits no key at all, so any divisor is correct there; 1 avoids x % 0.
    for size in reversed([max(int(s), 1) for s in sizes[1:]]):
        columns.append(rest % size)
        rest = torch.div(rest, size, rounding_mode="floor")
    columns.append(rest)
    return tuple(reversed(columns))
