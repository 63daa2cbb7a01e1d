"""fedkg audit: the attacker's ranking against a brute force, its scores by hand, and end to
end: plain uploads leak triples beyond the baseline, masked uploads and a hidden aggregate
do not; the same guesses scored on held-out triples separate leakage from generalisation;
the audited run and an earlier audit are never written; bad options are clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_fedkg.cli import main
from lightning_fedkg.models.kge import build_model
from lightning_fedkg.privacy.audit import attack_scores, candidate_space, top_candidates

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


@pytest.mark.slow
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
    captured = capsys.readouterr()
    assert "attack F1" in captured.out and "baseline" in captured.out and "leakage" in captured.out
    # progress, one line before and after each attack (the audit took minutes in silence)
    assert captured.err.count("audit: client_0") == 2 * 3 * 2
    plain, masked = results["plain"], results["hidden"]
    # Review finding 8, reproduced: the same guesses find the victim's held-out triples
    # too, so most of the recall on training targets is generalisation, not leakage. The
    # baseline is the control: its gap is about 0; the uploads' gap is the leakage.
    base, up = plain["baseline"], plain["uploads"]
    assert abs(base["leakage"]) < 0.05
    assert up["recall_heldout"] > base["recall_heldout"] + 0.1
    assert up["leakage"] == pytest.approx(up["recall_train"] - up["recall_heldout"])
    assert base["leakage"] + 0.02 < up["leakage"] < up["recall_train"] / 2
    assert plain["heldout"] > 0 and 0 < up["heldout_in_space"] <= plain["heldout"]
    assert plain["baseline"]["f1"] == pytest.approx(masked["baseline"]["f1"])  # same known triples, same attacker
    assert plain["uploads"]["f1"] > plain["baseline"]["f1"] + 0.1
    assert plain["aggregate"]["f1"] > plain["baseline"]["f1"] + 0.1
    # masked words and offset sums are noise to the server: worse than knowing nothing
    assert masked["uploads"]["f1"] < plain["baseline"]["f1"] / 2
    assert masked["aggregate"]["f1"] < plain["baseline"]["f1"] / 2


@pytest.mark.slow
def test_the_audit_needs_payloads_and_its_own_folder(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["fit", "-c", str(REPO / "configs" / "fede" / "umls_fede.yaml"), "--out", str(run),
                 "federated.rounds=1", "model.dim=8", "trainer.progress_bar=false", "trainer.accelerator=cpu"]) == 0
    assert main(["audit", "--from", str(run)]) == 2
    assert "record_payloads=true" in capsys.readouterr().err


def test_candidate_space_is_what_the_guesses_can_contain():
    known = torch.tensor([[0, 0, 1], [2, 0, 2], [3, 1, 4]])
    triples = torch.tensor([[5, 0, 6],   # known relation: in
                            [5, 0, 5],   # self-loop, relation 0 has one known: in
                            [5, 1, 5],   # self-loop, relation 1 has none: out
                            [5, 2, 6],   # relation never known: out
                            [3, 1, 4],   # a known triple: out
                            [4, 1, 3]])  # the reverse of one: in
    assert candidate_space(triples, known).tolist() == [True, True, False, False, False, True]
    # every guess of top_candidates lies in it
    model = build_model("transe", 7, 3, 4)
    guesses = top_candidates(model, 7, known, 10)
    assert bool(candidate_space(guesses, known).all())


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("audit") / "run"
    assert main(["fit", "-c", str(REPO / "configs" / "fede" / "umls_fede.yaml"), "--out", str(run),
                 "federated.record_payloads=true", "federated.rounds=1", "model.dim=8",
                 "trainer.progress_bar=false", "trainer.accelerator=cpu"]) == 0
    return run


@pytest.mark.parametrize("known", ["1.5", "0", "1", "-0.1"])
@pytest.mark.slow
def test_known_outside_zero_one_is_a_clean_error(small_run, tmp_path, capsys, known):
    """Reproduces a newcomer's finding: --known 1.5 was accepted (every training triple
    known, nothing left to guess); now exit 2 with the valid range, before any work."""
    assert main(["audit", "--from", str(small_run), "--out", str(tmp_path / "a"), "--known", known]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedkg: error:") and "--known" in err and "between 0 and 1" in err
    assert not (tmp_path / "a").exists()


def test_an_unknown_victim_is_a_clean_error_listing_the_clients(small_run, tmp_path, capsys):
    """Reproduces a newcomer's finding: --victim client_9 raised a raw ValueError."""
    assert main(["audit", "--from", str(small_run), "--out", str(tmp_path / "a"), "--victim", "client_9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedkg: error:") and "client_9" in err and "client_0, client_1, client_2" in err


def test_an_earlier_audit_is_never_overwritten(small_run, tmp_path, capsys):
    """Reproduces a newcomer's finding: a second audit into the same folder replaced the
    first one's audit.json (here with other settings, so the first result was lost)."""
    out = tmp_path / "a"
    assert main(["audit", "--from", str(small_run), "--out", str(out), "--victim", "client_1", "--epochs", "2"]) == 0
    first = (out / "audit.json").read_bytes()
    assert main(["audit", "--from", str(small_run), "--out", str(out), "--victim", "client_1", "--epochs", "3"]) == 2
    assert "earlier audit" in capsys.readouterr().err
    assert (out / "audit.json").read_bytes() == first
    assert sorted(p.name for p in out.iterdir()) == ["audit.json"]  # no temporary file left
    # a damaged file (an interrupted write of some other tool) is not an audit: replaced
    (out / "audit.json").write_text("{trunc")
    assert main(["audit", "--from", str(small_run), "--out", str(out), "--victim", "client_1", "--epochs", "2"]) == 0
    assert json.loads((out / "audit.json").read_text())["settings"]["epochs"] == 2
