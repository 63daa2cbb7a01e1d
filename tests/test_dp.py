"""federated.dp: clipping by hand, the noise the server sees (local and distributed under
secure aggregation), and ε from dp-accounting, per client."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fedkg.config import ConfigError
from lightning_fedkg.privacy.dp_uploads import DPClient, clip_update, noise_multiplier
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.run import fit
from lightning_fedkg.privacy.mechanisms import accounting as dplib

from test_protocol import umls_config

pytestmark = pytest.mark.usefixtures("one_thread")


def dp_config(**overrides):
    return umls_config(federated__dp__enabled=True, **overrides)


def test_clipping_by_hand():
    update = {"e": torch.tensor([[3.0, 4.0], [0.3, 0.4]]), "w": torch.tensor([1.0, 0.0])}
    rows = clip_update(update, 1.0, "row")
    assert torch.allclose(rows["e"], torch.tensor([[0.6, 0.8], [0.3, 0.4]]))  # norm 5 -> 1; 0.5 kept
    assert torch.equal(rows["w"], update["w"])  # a whole tensor is one row of norm 1
    whole = clip_update(update, 1.0, "client")
    total = math.sqrt(25 + 0.25 + 1)
    assert torch.allclose(whole["e"], update["e"] / total) and torch.allclose(whole["w"], update["w"] / total)
    assert clip_update(update, 100.0, "client")["e"].equal(update["e"])


def test_epsilon_and_calibration_come_from_dp_accounting():
    import dp_accounting as dpa
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(orders=list(dplib.ORDERS))
    acc.compose(dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(2.0)), 10)
    assert dplib.epsilon([(0.5, 2.0)] * 10, 1e-5) == pytest.approx(acc.get_epsilon(1e-5))
    sigma = dplib.calibrate_noise_multiplier(4.0, 1e-5, 1.0, 20)
    assert dplib.epsilon([(1.0, sigma)] * 20, 1e-5) == pytest.approx(4.0, rel=1e-3)
    assert dplib.epsilon([(1.0, sigma * 1.1)] * 20, 1e-5) < 4.0 < dplib.epsilon([(1.0, sigma * 0.9)] * 20, 1e-5)
    assert dplib.epsilon([], 1e-5) == 0.0


def frozen_round(cfg):
    """One round with a learning rate so small that the update is ~0: the upload minus the
    download is the noise alone. Returns the run, the rows downloaded and the new table."""
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    before = run.server.table["entity_emb"].clone()
    run.train_round(1)
    return run, before, run.server.table["entity_emb"]


@pytest.mark.parametrize("placement", ["local", "distributed"])
def test_the_aggregate_carries_the_noise_the_placement_promises(placement):
    sigma, clip = 2.0, 0.5
    extra = {"federated__secure_aggregation__enabled": True} if placement == "distributed" else {}
    cfg = dp_config(federated__dp__noise_multiplier=sigma, federated__dp__clip=clip, federated__dp__placement=placement,
                    train__lr=1e-12, **extra)
    run, before, after = frozen_round(cfg)
    counts = run.server.holder_counts("entity_emb")
    k = 3
    rows = counts == k  # rows every client holds: noise of the mean over three holders
    assert int(rows.sum()) > 50
    noise = (after - before)[rows].double().flatten()
    # local: each holder adds σC, the mean has σC/√k; distributed: the sum has σC, the mean σC/k
    expected = sigma * clip / (math.sqrt(k) if placement == "local" else k)
    assert float(noise.std()) == pytest.approx(expected, rel=0.1)
    assert abs(float(noise.mean())) < 4 * expected / math.sqrt(noise.numel())


def test_without_noise_the_upload_is_the_download_plus_the_clipped_update(monkeypatch):
    seen = {}
    original = DPClient.handle

    def spy(self, stage, message, round):
        reply = original(self, stage, message, round)
        if stage == "train":
            seen[self.party.name] = (self._reference["entity_emb"].clone(), reply.arrays["entity_emb"].clone())
        return reply

    monkeypatch.setattr(DPClient, "handle", spy)
    clip = 0.05
    run = FederatedRun(dp_config(federated__dp__noise_multiplier=0.0, federated__dp__clip=clip,
                                 train__lr=0.05), run_dir=None)
    run.align()
    run.train_round(1)
    for name, (reference, upload) in seen.items():
        norms = (upload - reference).norm(dim=1)
        assert float(norms.max()) == pytest.approx(clip, rel=1e-4)  # the large updates were clipped
        assert float(norms.min()) < clip


@pytest.mark.slow
def test_epsilon_per_client_in_metrics_and_tensorboard(tmp_path):
    cfg = dp_config(federated__dp__epsilon=4.0, federated__eval_every=1)
    metrics = fit(cfg, tmp_path / "run")
    privacy = metrics["privacy"]
    assert privacy["epsilon"] == pytest.approx(4.0, rel=1e-3)  # calibrated to the planned rounds, all run
    assert set(privacy["clients"]) == {"client_0", "client_1", "client_2"}
    assert privacy["noise_multiplier"] == pytest.approx(noise_multiplier(cfg, 3), rel=1e-4)
    assert "dp-accounting" in privacy["accountant"] and privacy["delta"] == 1e-5
    assert privacy["neighbours"] == "replace" and 0 < privacy["epsilon_add_remove"] < privacy["epsilon"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next((tmp_path / "run").rglob("client_0/**/events.out.tfevents*")).parent))
    events.Reload()
    values = [e.value for e in events.Scalars("privacy/epsilon")]
    assert len(values) == 2 and values[0] < values[1] == pytest.approx(4.0, rel=1e-3)


def test_a_dropout_lowers_the_distributed_noise_and_the_survivors_account_it():
    cfg = dp_config(federated__dp__noise_multiplier=2.0, federated__dp__placement="distributed",
                    federated__secure_aggregation__enabled=True, federated__rounds=1)
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    half = run.client_halves["client_0"]  # every row it holds, the two others hold too
    original = half.handle

    def fail_upload(stage, message, round):
        if stage == "train":
            raise RuntimeError("dropped after sharing")
        return original(stage, message, round)

    half.handle = fail_upload
    run.train_round(1)
    full = dplib.epsilon([(1.0, 2.0)], 1e-5, neighbours="replace")
    for name in ("client_1", "client_2"):
        (_, sigma, _, own), = run.client_halves[name].events
        assert own == pytest.approx(2.0 / math.sqrt(3))  # its own share, what a deviating server leaves
        # rows all three held kept two shares of three: σ·√(2/3), counted by the client itself
        assert sigma == pytest.approx(2.0 * math.sqrt(2 / 3)) and run.client_halves[name].epsilon() > full
    assert run.client_halves["client_0"].events == []


def test_dp_settings_are_checked():
    with pytest.raises(ConfigError, match="exactly one of noise_multiplier"):
        FederatedRun(dp_config(), run_dir=None)
    with pytest.raises(ConfigError, match="needs federated.secure_aggregation"):
        FederatedRun(dp_config(federated__dp__epsilon=1.0, federated__dp__placement="distributed"), run_dir=None)
    with pytest.raises(ConfigError, match="holder-mean strategy"):
        FederatedRun(dp_config(federated__dp__epsilon=1.0, federated__strategy="single"), run_dir=None)
