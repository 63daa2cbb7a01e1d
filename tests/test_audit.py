"""fedkg audit: the attacker's ranking against a brute force, its scores by hand, and end to
end: plain uploads leak triples beyond the baseline, masked uploads and a hidden aggregate
do not; the audited run is never written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_fedkg.cli import main
from lightning_fedkg.models.kge import build_model
from lightning_fedkg.federated.audit import attack_scores, top_candidates

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[1]


def test_top_candidates_match_a_brute_force():
    torch.manual_seed(0)
    n, model = 7, build_model("transe", 7, 3, 4)
    known = torch.tensor([[0, 0, 1], [2, 0, 3], [4, 0, 4], [1, 2, 5], [0, 0, 6], [3, 2, 3]])
    k = 12
    got = top_candidates(model, n, known, k, chunk=3)
    expected = []
    rels, counts = torch.unique(known[:, 1], return_counts=True)
    for r, c in zip(rels.tolist(), counts.tolist()):
        quota = round(c * k / len(known))
        mine = {tuple(x) for x in known.tolist() if x[1] == r}
        loops = any(h == t for h, _, t in mine)
        cands = [(h, r, t) for h in range(n) for t in range(n)
                 if (h, r, t) not in mine and (loops or h != t)]
        scores = model(*(torch.tensor(c) for c in zip(*cands)))
        order = torch.argsort(scores, descending=True)[:quota]
        expected += [cands[i] for i in order.tolist()]
    assert sorted(map(tuple, got.tolist())) == sorted(expected)
    # relation 0 has a known self-loop, so self-loops may be guessed; relation 2 has too
    assert len(got) == round(4 * k / 6) + round(2 * k / 6)


def test_attack_scores_by_hand():
    guesses = torch.tensor([[0, 0, 1], [1, 0, 2], [2, 0, 3], [3, 0, 4]])
    targets = torch.tensor([[1, 0, 2], [3, 0, 4], [5, 0, 6]])
    s = attack_scores(guesses, targets)
    assert (s["precision"], s["recall"]) == (0.5, 2 / 3)
    assert s["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    # a repeated target counts once; the same ids in other positions or relations are other triples
    s = attack_scores(torch.tensor([[0, 1, 2], [2, 1, 0], [0, 2, 1], [1, 0, 2]]),
                      torch.tensor([[0, 1, 2], [0, 1, 2], [1, 2, 0]]))
    assert (s["precision"], s["recall"], s["targets"]) == (0.25, 0.5, 2)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def test_plain_uploads_leak_and_masked_hidden_ones_do_not(tmp_path, capsys):
    base = ["federated.record_payloads=true", "federated.rounds=20", "model.dim=32", "trainer.progress_bar=false",
            "trainer.accelerator=cpu"]
    config = str(REPO / "configs" / "fede" / "umls_fede.yaml")
    hidden = ["federated.secure_aggregation.enabled=true", "federated.secure_aggregation.hide_aggregate=true",
              "federated.federation_key=audit-test"]
    results = {}
    for name, extra in (("plain", []), ("hidden", hidden)):
        run = tmp_path / name
        assert main(["fit", "-c", config, "--out", str(run), *base, *extra]) == 0
        before = snapshot(run)
        assert main(["audit", "--from", str(run), "--victim", "client_0", "--epochs", "100"]) == 0
        assert snapshot(run) == before  # nothing written into the audited run
        results[name] = json.loads((tmp_path / f"{name}-audit" / "audit.json").read_text())["victims"]["client_0"]
    out = capsys.readouterr().out
    assert "attack F1" in out and "baseline" in out
    plain, masked = results["plain"], results["hidden"]
    assert plain["baseline"]["f1"] == pytest.approx(masked["baseline"]["f1"])  # same known triples, same attacker
    assert plain["uploads"]["f1"] > plain["baseline"]["f1"] + 0.1
    assert plain["aggregate"]["f1"] > plain["baseline"]["f1"] + 0.1
    # masked words and offset sums are noise to the server: worse than knowing nothing
    assert masked["uploads"]["f1"] < plain["baseline"]["f1"] / 2
    assert masked["aggregate"]["f1"] < plain["baseline"]["f1"] / 2


def test_the_audit_needs_payloads_and_its_own_folder(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["fit", "-c", str(REPO / "configs" / "fede" / "umls_fede.yaml"), "--out", str(run),
                 "federated.rounds=1", "model.dim=8", "trainer.progress_bar=false", "trainer.accelerator=cpu"]) == 0
    assert main(["audit", "--from", str(run)]) == 2
    assert "record_payloads=true" in capsys.readouterr().err
