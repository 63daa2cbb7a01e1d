"""pack_keys / unpack_keys: exact values, injectivity and order, and the int64 overflow check."""

import itertools

import pytest
import torch

from lightning_fedkg.data.datamodule import FilterIndex
from lightning_fedkg.data.kg import triple_keys
from lightning_fedkg.keys import INT64_MAX, KeyOverflowError, check_key_space, pack_keys, unpack_keys
from lightning_fedkg.methods.fede.fusion import sample_fusion_negatives
from lightning_fedkg.methods.fkge.classification import corrupt_triples


def test_exact_values():
    h, r, t = torch.tensor([0, 2, 4]), torch.tensor([1, 0, 2]), torch.tensor([3, 4, 0])
    # (h * 3 + r) * 5 + t with N = 5, R = 3
    assert pack_keys((h, r, t), (5, 3, 5)).tolist() == [8, 34, 70]
    assert pack_keys((torch.tensor([7]),), (10,)).tolist() == [7]
    # broadcasting: rows [2, 1] against entities [1, 3]
    keys = pack_keys((torch.tensor([[0], [1]]), torch.tensor([[2, 4, 6]])), (2, 10))
    assert keys.tolist() == [[2, 4, 6], [12, 14, 16]]
    assert keys.dtype == torch.long


def test_all_tuples_get_distinct_sorted_keys_and_unpack_back():
    sizes = (4, 3, 5)
    tuples = list(itertools.product(*(range(s) for s in sizes)))  # lexicographic order
    cols = torch.tensor(tuples).unbind(dim=1)
    keys = pack_keys(cols, sizes)
    assert keys.tolist() == list(range(4 * 3 * 5))  # injective, order-preserving, dense
    for got, want in zip(unpack_keys(keys, sizes), cols):
        assert torch.equal(got, want)


def test_largest_key_space_that_fits():
    # 2**62 * 2 = 2**63 > 2**63 - 1 overflows; 2**62 and (2**31 - 1) * 2**32 fit
    check_key_space((2**31 - 1, 2**32))
    top = pack_keys((torch.tensor([2**31 - 2]), torch.tensor([2**32 - 1])), (2**31 - 1, 2**32))
    assert top.item() == (2**31 - 1) * 2**32 - 1 <= INT64_MAX
    assert [c.item() for c in unpack_keys(top, (2**31 - 1, 2**32))] == [2**31 - 2, 2**32 - 1]
    with pytest.raises(KeyOverflowError, match=r"2\*\*63-1"):
        check_key_space((2**62, 2))


def test_overflow_is_a_value_error_naming_the_sizes():
    n = 3_000_000  # N * R * N = 9e12 * 2e6 > 9.2e18
    triples = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"triples.*\[3000000, 2000000, 3000000\]"):
        triple_keys(triples, n, 2_000_000)
    with pytest.raises(ValueError, match="int64"):
        FilterIndex(triples, n, 2_000_000)
    with pytest.raises(ValueError, match="int64"):
        corrupt_triples(triples, n, torch.tensor([[0, 2_000_000 - 1, 0]]), torch.Generator())
    big = torch.tensor([[0, 2_000_000 - 1, 1]])
    with pytest.raises(ValueError, match="int64"):
        sample_fusion_negatives(big, n, 2, torch.Generator())
    # OverflowError handlers written against the old triple_keys still catch it
    with pytest.raises(OverflowError):
        triple_keys(triples, n, 2_000_000)


def test_bad_arguments():
    with pytest.raises(ValueError, match="one size per column"):
        pack_keys((torch.tensor([1]), torch.tensor([1])), (3,))
    with pytest.raises(ValueError, match="non-negative"):
        pack_keys((torch.tensor([1]),), (-3,))


def test_triple_keys_match_loop_oracle():
    g = torch.Generator().manual_seed(0)
    n, r = 11, 4
    triples = torch.stack([torch.randint(n, (200,), generator=g), torch.randint(r, (200,), generator=g),
                           torch.randint(n, (200,), generator=g)], dim=1)
    keys = triple_keys(triples, n, r)
    assert keys.tolist() == [(h * r + rel) * n + t for h, rel, t in triples.tolist()]
    # equal keys exactly for equal triples
    distinct = {tuple(x) for x in triples.tolist()}
    assert keys.unique().numel() == len(distinct)
