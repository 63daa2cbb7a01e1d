"""FKGE's typed handshake records: metrics.json rows keep their keys and order, and every
record survives its checkpoint form (plain containers) unchanged."""

import math

import pytest
import torch

from lightning_fedkg.methods.fkge.handshake import (Convergence, Exchange, HandshakeRecord, Hosting, PeerState,
                                                    UpdateOutcome)
from lightning_fedkg.methods.fkge.ppat import PPATHost

# The row layout of metrics.json's "handshakes" (a run of the code before the records were typed).
FULL_KEYS = ["client", "host", "number", "aligned_entities", "aligned_relations", "ppat_batches", "stopped",
             "queries", "sigma", "ppat_generator_losses", "seconds_ppat", "translation_cosine", "mismatched_cosine",
             "accepted", "seconds_update", "virtual_entities", "valid_before", "valid_after", "epsilon", "bytes",
             "bytes_per_ppat_batch", "finished_at",
             # appended by the held-out alignment scores (issue 35)
             "heldout_pairs", "heldout_cosine", "heldout_hits1", "heldout_hits10"]


def exchange(**kw):
    values = dict(aligned_entities=115, aligned_relations=0, ppat_batches=12, stopped="epochs", queries=345,
                  sigma=None, ppat_generator_losses=[0.71, 0.70], seconds_ppat=0.5, translation_cosine=-0.01,
                  mismatched_cosine=0.002)
    return Exchange(**{**values, **kw})


def test_an_updated_handshakes_row_has_the_metrics_layout():
    record = HandshakeRecord("a", "b", 2, finished_at=17.5, exchange=exchange(),
                             outcome=UpdateOutcome(True, 0.25, 9, 0.4, 0.45), epsilon=10.7, bytes=208600,
                             bytes_per_ppat_batch=14720.0)
    row = record.to_dict()
    assert list(row) == FULL_KEYS
    assert row["accepted"] is True and row["valid_after"] == 0.45 and row["ppat_generator_losses"] == [0.71, 0.70]
    assert record.accepted and HandshakeRecord.from_dict(row) == record


def test_a_skipped_and_a_declined_handshake():
    skipped = HandshakeRecord("a", "b", 1, finished_at=1.0, exchange=exchange(ppat_batches=0),
                              outcome=UpdateOutcome(False, 0.0, 0, 0.4, None, skipped="epsilon"), epsilon=9.9)
    row = skipped.to_dict()
    assert list(row) == FULL_KEYS[:14] + ["skipped"] + FULL_KEYS[14:]
    assert row["skipped"] == "epsilon" and not skipped.accepted
    assert HandshakeRecord.from_dict(row) == skipped
    declined = HandshakeRecord("a", "b", 3, finished_at=2.0)
    assert declined.to_dict() == {"client": "a", "host": "b", "number": 3, "accepted": False,
                                  "skipped": "partner_epsilon", "finished_at": 2.0}
    assert HandshakeRecord.from_dict(declined.to_dict()) == declined and not declined.accepted


def test_peer_states_are_the_papers_names():
    assert [s.value for s in PeerState] == ["Ready", "Busy", "Sleep"]
    assert PeerState("Busy") is PeerState.BUSY
    with pytest.raises(ValueError):
        PeerState("busy")


@pytest.mark.parametrize("with_ppat", [False, True])
def test_a_hosting_survives_its_checkpoint_form(with_ppat):
    y = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))

    def make_ppat(rows, partner, number):
        return PPATHost(rows, num_teachers=2, hidden=8, lam=0.05, seed=number)

    hosting = Hosting(partner="c", number=2, entities=torch.arange(6), relations=torch.zeros(0, dtype=torch.long),
                      y=y, ppat=make_ppat(y, "c", 2) if with_ppat else None, queries_before=40, batches=3,
                      seconds=0.1, bytes=100, ppat_bytes=60, stopped="converged", sigma=None if with_ppat else 1.5,
                      convergence=Convergence(sum=1.0, rows=2, best=0.5, stale=1, losses=[0.6, 0.5]))
    state = hosting.state_dict()
    assert all(isinstance(v, (str, int, float, torch.Tensor, dict, type(None))) for v in state.values())
    restored = Hosting.from_state(state, make_ppat)
    for name in ("partner", "number", "queries_before", "batches", "seconds", "bytes", "ppat_bytes", "stopped",
                 "sigma", "convergence"):
        assert getattr(restored, name) == getattr(hosting, name), name
    assert torch.equal(restored.y, y) and torch.equal(restored.entities, hosting.entities)
    assert (restored.ppat is None) == (not with_ppat)
    if with_ppat:
        assert restored.ppat.state_dict().keys() == hosting.ppat.state_dict().keys()
    assert Convergence().best == math.inf and Convergence().losses == []
