"""federated.dp against the review's findings 5-7: what ε is a guarantee about, and who could
undo it. Each test says what it reproduced on the code before the fix."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fedkg.privacy.dp_uploads import DPServer, noise_multiplier
from lightning_fedkg.federated.federation import FederatedRun, RoundFailed
from lightning_fedkg.privacy.mechanisms import accounting as dplib

from test_protocol import DIM, umls_config

pytestmark = pytest.mark.usefixtures("one_thread")


def dp_config(**overrides):
    return umls_config(federated__dp__enabled=True, **overrides)


def test_replace_one_doubles_the_sensitivity():
    """Finding 6: σ calibrated for ε = 4 (add/remove, 100 rounds) is ε 9.06 under replace-one,
    recomputed here with dp-accounting's own Gaussian at σ/2. Before the fix ε was only
    stated under add/remove, and calibration knew no other relation."""
    import dp_accounting as dpa
    from dp_accounting import rdp

    sigma = dplib.calibrate_noise_multiplier(4.0, 1e-5, 1.0, 100, neighbours="add_remove")
    acc = rdp.RdpAccountant(orders=list(dplib.ORDERS))
    acc.compose(dpa.GaussianDpEvent(sigma / 2), 100)
    assert acc.get_epsilon(1e-5) == pytest.approx(9.06, abs=0.01)
    assert dplib.epsilon([(1.0, sigma)] * 100, 1e-5, neighbours="replace") == pytest.approx(acc.get_epsilon(1e-5))
    # calibrating under replace asks for twice the σ, and gives the target back
    replace = dplib.calibrate_noise_multiplier(4.0, 1e-5, 1.0, 100, neighbours="replace")
    assert replace == pytest.approx(2 * sigma, rel=1e-6)
    assert dplib.epsilon([(1.0, replace)] * 100, 1e-5, neighbours="replace") == pytest.approx(4.0, rel=1e-3)
    # the default relation of a run is replace
    cfg = dp_config(federated__dp__epsilon=4.0, federated__rounds=100)
    assert cfg.federated.dp.neighbours == "replace"
    assert noise_multiplier(cfg, 3) == pytest.approx(replace, rel=1e-5)


@pytest.mark.slow
def test_a_public_selection_buys_no_amplification():
    """Finding 5: ``select_clients`` is seeded from ``cfg.seed``, so the server (and anyone with
    config.yaml) knows each sample. Before the fix a client of a fraction = 0.4 run reported
    the Poisson-amplified ε over every round up to its last upload (smaller than what its
    uploads cost), and a target ε was calibrated at the sampling rate (too little noise). Now
    each upload is one Gaussian event, and the reported ε is the end-of-run figure: the
    composition of every upload the client made, whichever round was its last."""
    sigma = 3.0
    cfg = dp_config(federated__dp__noise_multiplier=sigma, federated__fraction=0.4, federated__rounds=4,
                    federated__dp__neighbours="add_remove")
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    selected_in = {name: [] for name in run.client_halves}
    for r in (1, 2, 3, 4):
        for name in run.train_round(r):
            selected_in[name].append(r)
    uploads = {name: len(rounds) for name, rounds in selected_in.items()}
    assert sum(uploads.values()) == 4 and any(rounds and rounds[-1] < 4 for rounds in selected_in.values())
    report = run.server.report()["privacy"]
    q = 1 / 3  # one client of three per round
    amplified = 0
    for name, n in uploads.items():
        if n == 0:
            continue
        unamplified = dplib.epsilon([(1.0, sigma)] * n, 1e-5)
        assert report["clients"][name] == pytest.approx(unamplified, rel=1e-4)
        assert run.client_halves[name].epsilon() == pytest.approx(unamplified, rel=1e-4)
        assert [e[0] for e in run.client_halves[name].events] == selected_in[name]
        amplified = dplib.epsilon([(q, sigma)] * 4, 1e-5)
        assert amplified < unamplified  # what the old report claimed was less than this
    assert amplified and "none" in report["amplification"]
    # calibration: a target is met by a client selected in every round, not at rate q
    target = dp_config(federated__dp__epsilon=4.0, federated__fraction=0.4, federated__rounds=100,
                       federated__dp__neighbours="add_remove")
    assert noise_multiplier(target, 3) == pytest.approx(dplib.calibrate_noise_multiplier(4.0, 1e-5, 1.0, 100),
                                                        rel=1e-5)


def test_holder_counts_come_from_the_clients_own_masking():
    """Finding 7: under distributed DP each client divided its noise by the holder count the
    server sent; a server that inflated it to 30 (three clients hold any UMLS row) shrank the
    noise of the sum √10-fold (the round succeeded on that code), and a bound on the count
    only narrowed it. No count crosses now (issue 57): one sent is refused, and a client
    counts a row's holders from the peers it masks that row with. A server that claims a
    non-holder for a row in the masking positions gets a larger count, and a row whose masks
    no longer cancel: the sum it unmasks there, the count column too, is noise (counts of
    thousands, or negative, where two clients hold each row)."""
    cfg = _dp_sa(federated__dp__noise_multiplier=2.0, federated__rounds=1, federated__max_retries=0,
                 train__lr=1e-12)
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    original = type(run.server).configure_train

    def sent_counts(round, selected):
        messages = original(run.server, round, selected)
        for m in messages.values():
            m.arrays["dp.k.entity_emb"] = torch.full((m.arrays["entity_emb"].shape[0],), 30, dtype=torch.int32)
        return messages

    run.server.configure_train = sent_counts
    with pytest.raises(RoundFailed):
        run.train_round(1)
    assert all("own policy" in f["error"] for f in run.failures)
    # claiming client_0 for the 20 rows that only client_1 and client_2 hold
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    index, rows = run.server.alignment.index, run.server.table["entity_emb"].shape[0]
    held = {n: torch.zeros(rows, dtype=torch.bool).index_fill_(0, i, True) for n, i in index.items()}
    target = (held["client_1"] & held["client_2"] & ~held["client_0"]).nonzero().squeeze(1)
    assert len(target) == 20
    local = torch.full((rows,), -1, dtype=torch.long)
    local[index["client_1"]] = torch.arange(len(index["client_1"]))
    original = type(run.server).configure_train

    def claimed(round, selected):
        messages = original(run.server, round, selected)
        key = "sa.pos.client_0.entity_emb"
        # appended: the pair's keystream covers the listed positions in order, so the rows
        # both really hold keep their masks aligned
        messages["client_1"].arrays[key] = torch.cat([messages["client_1"].arrays[key],
                                                      local[target].to(torch.int32)])
        return messages

    run.server.configure_train = claimed
    unmasked = {}
    apply_sums = type(run.server).apply_sums

    def spy(tensor, sums, counts):
        unmasked[tensor] = counts.clone()
        return apply_sums(run.server, tensor, sums, counts)

    run.server.apply_sums = spy
    run.train_round(1)
    counts = unmasked["entity_emb"]
    others = held["client_0"] & held["client_1"] & held["client_2"]
    assert bool((counts[others] == 3).all())  # the rows the claim left alone: the true count
    assert not bool(((counts[target] >= 0) & (counts[target] <= 3)).any())  # noise where it lied


def test_distributed_reports_the_epsilon_a_deviating_server_leaves():
    """Finding 7: within the bound a server can still overstate holders or hide dropouts; the
    figure that holds whatever it claims is the client's own share alone, σ/√k. It is reported
    beside the honest-server ε (there was no such figure before)."""
    cfg = dp_config(federated__dp__noise_multiplier=2.0, federated__dp__placement="distributed",
                    federated__secure_aggregation__enabled=True, federated__rounds=1)
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    run.train_round(1)
    privacy = run.server.report()["privacy"]
    own = dplib.epsilon([(1.0, 2.0 / math.sqrt(3))], 1e-5, neighbours="replace")
    assert privacy["epsilon"] == pytest.approx(dplib.epsilon([(1.0, 2.0)], 1e-5, neighbours="replace"), rel=1e-4)
    assert privacy["epsilon_deviating_server"] == pytest.approx(own, rel=1e-4)
    assert "deviating" in privacy["threat_model"]


def test_a_realised_sigma_from_the_server_is_refused():
    """Finding 7: the survivors' realised σ came from the server and was accounted as sent; a
    server claiming σ·10 made every client report far less than what its uploads cost (a
    cap at the requested σ then limited it). No σ crosses now (issue 57): each client
    computes what a dropout left from the survivors and its own masking, and refuses a
    server that sends a σ with the unmasking."""
    cfg = _dp_sa(federated__dp__noise_multiplier=2.0, federated__rounds=1, federated__max_retries=0)
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    original = type(run.server).configure_sa_unmask

    def lying(round, selected):
        messages = original(run.server, round, selected)
        for m in messages.values():
            m.config["dp"] = {"sigma": 20.0}
        return messages

    run.server.configure_sa_unmask = lying
    with pytest.raises(RoundFailed):
        run.train_round(1)
    assert all("own policy" in f["error"] for f in run.failures)
    for half in run.client_halves.values():  # charged when sent, at the σ of its own settings
        assert [e[:2] for e in half.events] == [(1, 2.0)]


def test_what_crosses_in_clear_is_dropped_or_listed(monkeypatch):
    """Finding 7: every DP upload carried the client's plaintext ``examples`` and ``loss``, and
    nothing listed the evaluation replies (MRR, ranks). On the old code the uploads carried
    both and the report had no ``unprotected`` entry; now both are dropped from DP uploads and
    the evaluation replies are listed."""
    seen = []
    original = FederatedRun.exchange

    def spy(self, round, stage, messages, *args, **kwargs):
        replies, failures = original(self, round, stage, messages, *args, **kwargs)
        if stage in ("train", "upload"):
            seen.extend(r.metrics for r in replies.values())
        return replies, failures

    monkeypatch.setattr(FederatedRun, "exchange", spy)
    run = FederatedRun(dp_config(federated__dp__noise_multiplier=1.0, federated__rounds=1), run_dir=None)
    run.align()
    run.train_round(1)
    assert seen and all("examples" not in m and "loss" not in m for m in seen)
    privacy = run.server.report()["privacy"]
    assert privacy["dropped_from_uploads"] == ["examples", "loss"]
    assert any(item.startswith("evaluation replies") for item in privacy["unprotected"])


def test_the_noise_does_not_come_from_torch():
    """Finding 7: the noise was ``torch.randn`` on an MT19937 generator (seeded from the OS), a
    generator whose state a party that sees enough outputs reconstructs. The source that
    replaces it (a new module, so this checks the fix, not the old code): seeding torch changes
    nothing, the draw leaves torch's state alone, and it is a standard normal (moments and the
    two-sided 5% tail over 10^6 samples)."""
    from lightning_fedkg.privacy.mechanisms import noise

    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    a = noise.urandom_gaussian((500_000,))
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(0)
    b = noise.urandom_gaussian((500_000,))
    assert not torch.equal(a, b)
    z = torch.cat([a, b])
    n = z.numel()
    assert abs(float(z.mean())) < 5 / math.sqrt(n)
    assert float(z.var()) == pytest.approx(1.0, abs=5 * math.sqrt(2 / n))
    assert float((z ** 4).mean()) == pytest.approx(3.0, abs=5 * math.sqrt(96 / n))
    assert float((z.abs() > 1.959964).double().mean()) == pytest.approx(0.05, abs=5 * math.sqrt(0.05 * 0.95 / n))


def test_the_release_is_snapped_to_the_grid_and_accounted():
    """Mironov's attack reads the update from the low bits of a float sum; every released
    coordinate is an integer multiple of the grid step, and the ledger widens the
    sensitivity by the rounding's slack Λ·√d."""
    from lightning_fedkg.privacy.mechanisms import noise

    clip = 0.3
    step = noise.grid(clip)
    assert step == 2.0 ** -22  # 0.3 is in [2^-2, 2^-1): 2^-2 · 2^-20
    update = torch.rand(100, 16, dtype=torch.float64) * 0.01
    out = noise.snapped_release(update, 0.5, step)
    assert torch.equal(out / step, torch.round(out / step))
    assert float((out - update).std()) == pytest.approx(0.5, rel=0.05)
    assert noise.grid_slack(clip, 16) == pytest.approx(step * 4 / clip)
    # the run's ledger accounts it: σ/(2 + slack) under replace, so ε is a hair above σ/2's
    cfg = dp_config(federated__dp__noise_multiplier=2.0, federated__dp__clip=clip, federated__rounds=1)
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    run.train_round(1)
    half = next(iter(run.client_halves.values()))
    (_, sigma, slack, _), = half.events
    assert slack == pytest.approx(noise.grid_slack(clip, DIM)) and sigma == 2.0  # one row of DIM values
    exact = dplib.epsilon([(1.0, 2.0 * 2 / (2 + slack))], 1e-5, neighbours="replace")
    assert half.epsilon() == pytest.approx(exact, rel=1e-12)
    assert half.epsilon() > dplib.epsilon([(1.0, 2.0)], 1e-5, neighbours="replace")


# ---------------------------------------------------------------- a deviating server (issue 57)
def _dp_sa(**overrides):
    return dp_config(federated__secure_aggregation__enabled=True, federated__dp__placement="distributed",
                     federated__secure_aggregation__threshold=2, **overrides)


def test_the_server_cannot_choose_the_noise():
    """Finding 3 (issue 57): ``DPClient.handle`` took σ from the server's message and never
    compared it with its own target. A server sending σ = 1e-6 got uploads noised with
    1e-6·clip (on the old code this round trained and aggregated, every client complied and
    its ε read about 4e12). A client now derives σ from its own policy and refuses a server
    that sends one."""
    run = FederatedRun(dp_config(federated__dp__epsilon=4.0, federated__rounds=2, federated__max_retries=0),
                       run_dir=None)
    run.align()
    original = type(run.server).configure_train

    def chosen_noise(round, selected):
        messages = original(run.server, round, selected)
        for m in messages.values():
            m.config["dp"] = {"sigma": 1e-6}
        return messages

    run.server.configure_train = chosen_noise
    with pytest.raises(RoundFailed):
        run.train_round(1)
    assert all("own policy" in f["error"] for f in run.failures), run.failures
    assert all(half.events == [] for half in run.client_halves.values())


def test_each_client_derives_its_noise_from_its_own_policy():
    """The σ a client adds is the one its own settings calibrate (what the report prints
    is what the clients used, not the server's figure)."""
    cfg = dp_config(federated__dp__epsilon=4.0, federated__rounds=2)
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    run.train_round(1)
    sigma = noise_multiplier(cfg, 3, DIM)
    for half in run.client_halves.values():
        assert half.events[-1][1] == pytest.approx(sigma, rel=1e-12)
    privacy = run.server.report()["privacy"]
    assert privacy["noise_multiplier"] == pytest.approx(sigma, rel=1e-12)
    assert f"{sigma:.4g}" in privacy["mechanism"]


def test_every_release_is_charged_when_it_is_sent():
    """Finding 4 (issue 57): under distributed noise a release entered a client's ledger only
    when that client received ``sa_unmask``; a server that unmasked with the other
    survivors' shares (t = 2 of 3) and never asked the victim read three aggregates holding
    its noised upload while its ledger held one (on the old code: 1 event, ε 2.16 against
    4.0 for the others). Each upload is now charged as it is sent."""
    run = FederatedRun(_dp_sa(federated__dp__noise_multiplier=2.0, federated__rounds=3), run_dir=None)
    run.align()
    victim = "client_1"
    original = type(run.server).configure_sa_unmask

    def skip_victim(round, selected):
        messages = original(run.server, round, selected)
        if round < 3:
            messages.pop(victim)
        return messages

    run.server.configure_sa_unmask = skip_victim
    for r in (1, 2, 3):
        run.train_round(r)
    ledgers = {n: [e[0] for e in h.events] for n, h in run.client_halves.items()}
    assert ledgers == {n: [1, 2, 3] for n in run.client_halves}, ledgers
    eps = {n: h.epsilon() for n, h in run.client_halves.items()}
    assert eps[victim] == pytest.approx(eps["client_0"], rel=1e-12)


def test_a_client_stops_uploading_when_its_budget_is_spent():
    """A client with a target ε (calibrated over ``federated.rounds`` uploads) refuses an
    upload beyond it: a server that runs more rounds than the client's policy planned for
    gets no further release (on the old code the client uploaded and its ε passed the
    target)."""
    run = FederatedRun(dp_config(federated__dp__epsilon=4.0, federated__rounds=2, federated__max_retries=0),
                       run_dir=None)
    run.align()
    run.train_round(1)
    run.train_round(2)
    assert all(h.epsilon() == pytest.approx(4.0, rel=1e-3) for h in run.client_halves.values())
    with pytest.raises(RoundFailed):
        run.train_round(3)
    assert all("budget" in f["error"] for f in run.failures if f.get("round") == 3), run.failures
    assert all(len(h.events) == 2 and h.epsilon() <= 4.0 * (1 + 1e-6) for h in run.client_halves.values())
