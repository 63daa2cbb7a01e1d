"""Holder-mean aggregation (FedE Eq. 2) on hand-built tables."""

import pytest
import torch

from lightning_fedkg.federated.aggregation import (
    damped_holder_mean,
    holder_counts,
    holder_mean,
    holder_sums,
)


def test_three_entity_example_one_holder_copies_two_holders_average():
    # Entity 0 only at A, entity 1 at A and B, entity 2 only at B, entity 3 nowhere.
    table = torch.full((4, 2), 9.0)
    idx_a, idx_b = torch.tensor([0, 1]), torch.tensor([1, 2])
    rows_a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    rows_b = torch.tensor([[5.0, 8.0], [7.0, 6.0]])
    out = holder_mean(table, [idx_a, idx_b], [rows_a, rows_b])
    expected = torch.tensor([[1.0, 2.0], [4.0, 6.0], [7.0, 6.0], [9.0, 9.0]])
    assert torch.equal(out, expected)
    assert torch.equal(table, torch.full((4, 2), 9.0))  # input untouched


def test_identical_clients_give_identity_bit_for_bit():
    torch.manual_seed(0)
    rows = torch.randn(50, 8)
    idx = torch.arange(50)
    out = holder_mean(torch.zeros(50, 8), [idx, idx, idx], [rows, rows.clone(), rows.clone()])
    assert torch.equal(out, rows)


def test_unheld_rows_keep_previous_value_and_no_nan():
    table = torch.randn(6, 3)
    out = holder_mean(table, [torch.tensor([4])], [torch.ones(1, 3)])
    assert torch.equal(out[[0, 1, 2, 3, 5]], table[[0, 1, 2, 3, 5]])
    assert torch.equal(out[4], torch.ones(3))
    assert torch.isfinite(out).all()
    assert torch.equal(holder_mean(table, [], []), table)


def test_local_order_is_respected():
    # A client's rows are in its local order; idx maps them to global rows.
    table = torch.zeros(5, 1)
    out = holder_mean(table, [torch.tensor([3, 0])], [torch.tensor([[30.0], [10.0]])])
    assert out[:, 0].tolist() == [10.0, 0.0, 0.0, 30.0, 0.0]


def test_damped_all_holders_hand_example():
    # Entity 0 has 3 holders in the federation, only one (value 4) trained this round:
    # E_new = E + (4 - E)/3 with E = 1  ->  2.  Entity 1 has 2 holders, both trained: mean.
    # Entity 2 has 1 holder that was not sampled: unchanged. Entity 3 has no holder.
    table = torch.tensor([[1.0], [0.0], [5.0], [7.0]])
    all_holders = torch.tensor([3, 2, 1, 0])
    idx_a, idx_b = torch.tensor([0, 1]), torch.tensor([1])
    out = damped_holder_mean(
        table, [idx_a, idx_b], [torch.tensor([[4.0], [2.0]]), torch.tensor([[6.0]])], all_holders
    )
    assert out[:, 0].tolist() == [2.0, 4.0, 5.0, 7.0]
    # The selected-holders variant would copy the single trained value instead.
    plain = holder_mean(table, [idx_a, idx_b], [torch.tensor([[4.0], [2.0]]), torch.tensor([[6.0]])])
    assert plain[:, 0].tolist() == [4.0, 4.0, 5.0, 7.0]


def test_damped_equals_holder_mean_when_every_holder_uploads():
    torch.manual_seed(1)
    idx = [torch.tensor([0, 2, 3]), torch.tensor([1, 2]), torch.tensor([3, 4])]
    rows = [torch.randn(len(i), 4) for i in idx]
    table = torch.randn(6, 4)
    counts = holder_counts(6, idx)
    assert counts.tolist() == [1, 1, 2, 2, 1, 0]
    assert torch.allclose(damped_holder_mean(table, idx, rows, counts), holder_mean(table, idx, rows), atol=1e-6)


def test_damped_rejects_uploads_not_counted_as_holders():
    with pytest.raises(ValueError):
        damped_holder_mean(torch.zeros(2, 1), [torch.tensor([0])], [torch.ones(1, 1)], torch.tensor([0, 1]))


def test_sums_counts_and_trailing_dims():
    idx = [torch.tensor([0, 1]), torch.tensor([1])]
    rows = [torch.ones(2, 2, 3), 3 * torch.ones(1, 2, 3)]
    sums, counts = holder_sums(3, idx, rows)
    assert sums.dtype == torch.float64 and sums.shape == (3, 2, 3)
    assert counts.tolist() == [1, 2, 0]
    out = holder_mean(torch.zeros(3, 2, 3), idx, rows)
    assert torch.equal(out[1], 2 * torch.ones(2, 3)) and torch.equal(out[2], torch.zeros(2, 3))


def test_dtype_is_preserved():
    out = holder_mean(torch.zeros(2, 2, dtype=torch.bfloat16), [torch.tensor([0])], [torch.ones(1, 2)])
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "idx, rows",
    [
        ([torch.tensor([0, 0])], [torch.ones(2, 1)]),  # a client holds a row twice
        ([torch.tensor([5])], [torch.ones(1, 1)]),  # out of range
        ([torch.tensor([0, 1])], [torch.ones(1, 1)]),  # length mismatch
    ],
)
def test_malformed_uploads_are_rejected(idx, rows):
    with pytest.raises(ValueError):
        holder_mean(torch.zeros(3, 1), idx, rows)


def test_the_server_steps_in_row_blocks_are_the_whole_table_steps_bit_for_bit(monkeypatch):
    """holder_sums, mean_from_sums and damped_mean_from_sums work a block of rows at a time
    (CHUNK_ELEMENTS; no whole-table float64 temporaries): the results are those of the whole
    table at once, bit for bit, with blocks that split uploads and rows several uploads share."""
    from lightning_fedkg.federated import aggregation

    g = torch.Generator().manual_seed(0)
    n = 50
    indices = [torch.randperm(n, generator=g)[:k] for k in (37, 41, 29)]
    # values of very different magnitudes: any change in the order of the additions shows
    rows = [torch.randn(len(i), 3, generator=g) * torch.logspace(-6, 6, len(i)).unsqueeze(1) for i in indices]
    table = torch.randn(n, 3, generator=g)
    flat_idx = torch.cat(indices)
    sums = torch.zeros(n, 3, dtype=torch.float64).index_add_(0, flat_idx, torch.cat(rows).double())
    uploads = torch.bincount(flat_idx, minlength=n)
    counts = uploads.clone()
    counts[:5] = 0  # mean_from_sums: rows no uploader holds keep the table's value
    held = _rows(counts > 0)
    mean = torch.where(held, sums / _rows(counts.clamp(min=1)).double(), table.double()).float()
    holders = counts + torch.arange(n) % 2
    base = table.double()
    damped = (base + (sums - _rows(counts).double() * base) / _rows(holders.clamp(min=1)).double()).float()
    for elements in (1, 21, 192, 1 << 21):  # blocks of 1, 7 and 64 rows, and the whole table
        monkeypatch.setattr(aggregation, "CHUNK_ELEMENTS", elements)
        got_sums, got_counts = holder_sums(n, indices, rows)
        assert torch.equal(got_sums, sums) and torch.equal(got_counts, uploads)
        assert torch.equal(aggregation.mean_from_sums(table, sums, counts), mean)
        assert torch.equal(aggregation.damped_mean_from_sums(table, sums, counts, holders), damped)


def _rows(v):
    return v.view(-1, 1)
