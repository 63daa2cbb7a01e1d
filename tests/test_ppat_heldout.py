"""Held-out alignment metrics of FKGE (issue 35, finding 4): a share of the aligned pairs is
kept out of every alignment and update, and each handshake scores the translation on it
(``heldout_cosine``, ``heldout_hits1``, ``heldout_hits10`` in metrics.json)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from lightning_fedkg.config import load_config
from lightning_fedkg.federated.message import Message
from lightning_fedkg.methods.fkge.handshake import HandshakeRecord
from lightning_fedkg.methods.fkge.translation import heldout_alignment
from lightning_fedkg.run import fit

from test_fkge_federation import BASE


def _scores(table: torch.Tensor, ids: torch.Tensor, translated: torch.Tensor) -> dict:
    """``translation.heldout_alignment`` on a stand-in peer whose entity table is ``table``."""
    peer = SimpleNamespace(heldout_ids=lambda partner: ids,
                           party=SimpleNamespace(model=SimpleNamespace(entity_emb=table)))
    host = SimpleNamespace(partner="p")
    return heldout_alignment(peer, host, Message(arrays={"heldout": translated}))


def _brute(table, ids, translated):
    """Rank of each held-out item's own row among all rows, by cosine, one row at a time."""
    cos, hits1, hits10 = [], 0, 0
    for row, i in zip(translated, ids.tolist()):
        sims = [float(torch.nn.functional.cosine_similarity(row, t, dim=0)) for t in table]
        rank = 1 + sum(s > sims[i] for s in sims)
        cos.append(sims[i])
        hits1, hits10 = hits1 + (rank <= 1), hits10 + (rank <= 10)
    n = len(cos)
    return {"heldout_pairs": n, "heldout_cosine": sum(cos) / n, "heldout_hits1": hits1 / n,
            "heldout_hits10": hits10 / n}


@pytest.mark.parametrize("seed", range(4))
def test_heldout_scores_match_a_brute_force_ranking(seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(40, 6, generator=g)
    ids = torch.randperm(40, generator=g)[:12]
    translated = table[ids] + 0.8 * torch.randn(12, 6, generator=g)  # some ranks 1, some not
    got, want = _scores(table, ids, translated), _brute(table, ids, translated)
    assert got["heldout_pairs"] == want["heldout_pairs"] == 12
    assert got["heldout_cosine"] == pytest.approx(want["heldout_cosine"], abs=1e-6)
    assert got["heldout_hits1"] == want["heldout_hits1"] and got["heldout_hits10"] == want["heldout_hits10"]
    assert 0 < want["heldout_hits1"] < want["heldout_hits10"]  # the case is not trivial


def test_exact_rows_rank_first_and_no_holdout_reports_none():
    table = torch.randn(30, 4, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([3, 7, 29])
    assert _scores(table, ids, 2.0 * table[ids]) == {"heldout_pairs": 3, "heldout_cosine": pytest.approx(1.0),
                                                     "heldout_hits1": 1.0, "heldout_hits10": 1.0}
    assert _scores(table, ids[:0], table[:0]) == {"heldout_pairs": 0, "heldout_cosine": None,
                                                 "heldout_hits1": None, "heldout_hits10": None}


def test_a_row_written_before_the_heldout_keys_still_loads():
    row = {"client": "a", "host": "b", "number": 1, "finished_at": 0.0, "aligned_entities": 5,
           "aligned_relations": 0, "ppat_batches": 1, "stopped": "epochs", "queries": 5, "sigma": None,
           "ppat_generator_losses": [], "seconds_ppat": 0.1, "translation_cosine": 0.5,
           "mismatched_cosine": 0.1, "accepted": True, "seconds_update": 0.1, "virtual_entities": 0,
           "valid_before": 0.1, "valid_after": 0.2, "epsilon": 1.0, "bytes": 10, "bytes_per_ppat_batch": 2.0}
    record = HandshakeRecord.from_dict(row)
    assert record.exchange.heldout_pairs == 0 and record.exchange.heldout_hits1 is None
    assert {k: v for k, v in record.to_dict().items() if not k.startswith("heldout_")} == row


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["federated.fkge.alignment=supervised", "federated.fkge.dp_epsilon=null"],
                                   ["federated.fkge.mode=none"]], ids=["ppat", "supervised", "control"])
def test_heldout_pairs_are_never_aligned_and_every_handshake_scores_them(tmp_path, extra):
    cfg = load_config(None, [*BASE, "federated.fkge.holdout_fraction=0.2", *extra])
    metrics = fit(cfg, tmp_path / "run")
    log = [json.loads(line) for line in (tmp_path / "run" / "channel_log.jsonl").read_text().splitlines()]
    translated = [r for r in log if r["name"] == "fkge_translated"]
    hs = [h for h in metrics["handshakes"] if "aligned_entities" in h]
    assert len(translated) == len(hs) > 0
    for h, r in zip(hs, translated):
        # aligned_entities = k - floor(0.2 k): recover k and check the split
        k = next(k for k in range(h["aligned_entities"], 2 * h["aligned_entities"] + 2)
                 if k - math.floor(0.2 * k) == h["aligned_entities"] and math.floor(0.2 * k) == h["heldout_pairs"])
        assert h["heldout_pairs"] == math.floor(0.2 * k) > 0
        assert r["shapes"]["heldout"][0] == h["heldout_pairs"] and r["shapes"]["entities"][0] == h["aligned_entities"]
        assert 0.0 <= h["heldout_hits1"] <= h["heldout_hits10"] <= 1.0 and -1.0 <= h["heldout_cosine"] <= 1.0
        n = h["heldout_pairs"]  # shares of n items
        assert (h["heldout_hits1"] * n) == pytest.approx(round(h["heldout_hits1"] * n))
