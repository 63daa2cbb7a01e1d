"""federated.fedlu.early_stopping: which validations count toward the patience.

``local`` counts every validation whose local MRR does not improve; ``official`` (the
official FedLU code's ``bad_iter``) resets on a local improvement, leaves the count as it is
when only the avatar's MRR improves and adds one only when neither improves.
"""

import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from lightning_fedkg.config import load_config
from lightning_fedkg.federated.checkpoint import latest_manifest, load_party, read_manifest
from lightning_fedkg.federated.round_loop import EarlyStopping
from lightning_fedkg.run import fit
from lightning_fedkg.federated.strategy import ServerContext, ServerHalf
from lightning_fedkg.methods.fedlu import DistillationGate, FedLU, FedLUServer

# (local, avatar) weighted validation MRRs, one evaluation a round, and the patience counts
# after each, written by hand from the two rules.
SEQUENCE = [
    (0.30, 0.20),  # 1 both improve (from nothing)        local 0  official 0
    (0.29, 0.25),  # 2 only the avatar improves           local 1  official 0 (unchanged)
    (0.28, 0.24),  # 3 neither                            local 2  official 1
    (0.29, 0.26),  # 4 only the avatar (local < 0.30)     local 3  official 1 (unchanged)
    (0.35, 0.20),  # 5 the local side improves            local 0  official 0
    (0.34, 0.27),  # 6 only the avatar                    local 1  official 0
    (0.33, 0.27),  # 7 neither (equal is no improvement)  local 2  official 1
    (0.33, 0.25),  # 8 neither                            local 3  official 2
]
EXPECTED = {"local": [0, 1, 2, 3, 0, 1, 2, 3], "official": [0, 0, 1, 1, 0, 0, 1, 2]}


def fedlu_server(rule: str, schedule: str = "gated") -> FedLUServer:
    cfg = load_config(None, ["federated.strategy=fedlu", f"federated.fedlu.early_stopping={rule}",
                             f"federated.fedlu.schedule={schedule}", "federated.fedlu.wait_rounds=3"])
    return FedLUServer(ServerContext(cfg, ["client_0"], task=None), FedLU)


@pytest.mark.parametrize("schedule", ["gated", "always"])
@pytest.mark.parametrize("rule", ["local", "official"])
def test_bad_evaluations_follow_the_rule(rule, schedule):
    server, stopper = fedlu_server(rule, schedule), EarlyStopping(patience=3)
    counts, stopped_at = [], None
    for r, (local, avatar) in enumerate(SEQUENCE, start=1):
        server.gate.update(r, local, avatar)
        stopper.update(local, r, count_stall=server.stall_counts(r))
        counts.append(stopper.bad_evaluations)
        if stopped_at is None and stopper.should_stop:
            stopped_at = r
    assert counts == EXPECTED[rule]
    assert stopper.best_round == 5 and stopper.best_metric == 0.35
    # patience 3: the local rule stops after evaluation 4; the official one never reaches 3 here
    assert stopped_at == (4 if rule == "local" else None)


def test_the_gate_tracks_its_bests_under_both_schedules():
    for schedule in ("gated", "always"):
        gate = DistillationGate(schedule=schedule, wait_rounds=3)
        improved = []
        for r, (local, avatar) in enumerate(SEQUENCE, start=1):
            gate.update(r, local, avatar)
            improved.append(gate.global_improved)
        assert improved == [True, True, False, True, False, True, False, False]
        assert (gate.best_local, gate.best_global) == (0.35, 0.27)
    # With ``always`` the flags were on from the start and stay at round 0.
    assert gate.flags() == {"distill_local": True, "distill_global": True}
    assert (gate.local_on_round, gate.global_on_round) == (0, 0)


def test_states_saved_before_the_rule_existed_still_load():
    gate = asdict(DistillationGate(schedule="gated"))
    del gate["global_improved"]
    assert DistillationGate(**gate).global_improved is False
    old = {"patience": 5, "best_metric": 0.3, "best_round": 2, "bad_evaluations": 1}  # a runner file's dict
    stopper = EarlyStopping(**old)
    assert asdict(stopper) == old
    stopper.update(0.2, 3, count_stall=False)
    assert stopper.bad_evaluations == 1


def test_the_core_counts_every_stall_by_default():
    server = fedlu_server("local")
    assert server.stall_counts(1) is True
    assert ServerHalf.stall_counts(server, 1) is True


# ---------------------------------------------------------------------- end to end
BASE = ["data.name=umls", "model.dim=16", "train.num_negatives=16", "train.negative_mode=shared",
        "train.lr=1.0", "train.loss=uniform", "trainer.accelerator=cpu", "trainer.progress_bar=false",
        "federated.local_epochs=1", "federated.eval_every=1", "federated.strategy=fedlu", "federated.rounds=6",
        "federated.patience=1"]


def replay(sequence, rule: str, patience: int) -> int:
    """The round a run stops at under ``rule`` (or the last one), by the rules' text."""
    best_local = best_avatar = 0.0
    bad = 0
    for r, (local, avatar) in enumerate(sequence, start=1):
        if local > best_local:
            bad = 0
        elif rule == "local" or not avatar > best_avatar:
            bad += 1
        best_local, best_avatar = max(best_local, local), max(best_avatar, avatar)
        if bad >= patience:
            return r
    return len(sequence)


@pytest.mark.slow
def test_the_official_rule_stops_later_when_only_the_avatar_improves(one_thread):
    # lr 1.0 makes the local MRR oscillate while the avatar's goes on improving (measured
    # while writing this test: the local run stops after round 4, the official one after 5).
    runs = {}
    for rule in ("local", "official"):
        with tempfile.TemporaryDirectory() as d:
            metrics = fit(load_config(None, BASE + [f"federated.fedlu.early_stopping={rule}"]), d)
            last = latest_manifest(Path(d) / "checkpoints")
            manifest = read_manifest(last)
            gate = load_party(last, manifest, "server")["gate"]
            runner = load_party(last, manifest, "runner")
            runs[rule] = (metrics, gate, runner)
    local, official = runs["local"], runs["official"]
    assert official[0]["distillation"]["early_stopping"] == "official"
    sequence = [(v["local"], v["global"]) for v in official[1]["validation"]]
    # Same training: the shorter run's validations are the start of the longer one's.
    assert [(v["local"], v["global"]) for v in local[1]["validation"]] == sequence[:len(local[1]["validation"])]
    for rule, (metrics, _, runner) in runs.items():
        assert metrics["rounds"] == replay(sequence, rule, patience=1), rule
        assert runner["early_stopping"]["bad_evaluations"] == 1  # each stopped on its patience
    assert local[0]["rounds"] < official[0]["rounds"] <= 6, (local[0]["rounds"], official[0]["rounds"])
