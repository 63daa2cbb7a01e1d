"""PPAT as a LightningModule (lightning_fedkg.methods.fkge.ppat_module): it trains under a
plain ``lightning.Trainer`` with manual optimisation, through the same halves and wire
messages as the federation's handshake. Before it, PPAT was plain torch loops only
(``run_ppat``) and no Trainer could fit it."""

import math

import lightning as L
import torch

from lightning_fedkg.methods.fkge.ppat import FAKE, GRAD
from lightning_fedkg.methods.fkge.ppat_module import PPATModule, fit_ppat


def _pair(m=96, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g) * torch.linspace(0.5, 1.5, d)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g))
    return x, x @ (q * torch.sign(torch.diagonal(r))).T


KW = dict(client_kw=dict(lr=0.01, momentum=0.0, seed=3), host_kw=dict(hidden=16, lam=100.0, seed=0, noise_seed=0))


def test_the_module_trains_under_a_plain_trainer_and_moves_w():
    x, y = _pair()
    module = PPATModule(x, y, batch_size=32, **KW)
    assert module.automatic_optimization is False
    w0 = module.w.detach().clone()
    trainer = fit_ppat(module, epochs=2)
    assert isinstance(trainer, L.Trainer) and trainer.current_epoch == 2
    # 3 batches x 2 epochs; each steps the generator, every teacher holding rows, the student
    assert trainer.global_step >= 2 * 3 * 3
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for key in ("loss_teachers", "loss_student", "loss_generator"):
        assert math.isfinite(metrics[key])
    assert not torch.equal(module.w.detach(), w0)
    assert module.ppat_host.accountant.queries == 2 * len(x)  # one PATE query per generated row
    assert {r.name for r in module.channel.records()} == {FAKE, GRAD}  # only the halves' messages cross


def test_the_budget_stops_the_trainer_before_a_batch_that_could_pass_it():
    x, y = _pair()
    module = PPATModule(x, y, batch_size=32, max_epsilon=10.0, client_kw=KW["client_kw"],
                        host_kw=dict(hidden=16, lam=0.05, seed=0, noise_seed=0))
    fit_ppat(module, epochs=20)
    assert module.stopped == "budget"
    assert module.ppat_host.accountant.epsilon_data_independent() <= 10.0
    assert module.ppat_host.epsilon_after(32) > 10.0


def test_the_federations_ppat_handshake_is_fitted_by_a_trainer(tmp_path, monkeypatch):
    """Each PPAT handshake's host half runs as one ``lightning.Trainer`` fit
    (``HostTrainer``), one training step per generated batch, and every fit has ended when
    the run does. Before, the host stepped plain torch optimizers per message."""
    import threading

    from lightning_fedkg.config import load_config
    from lightning_fedkg.methods.fkge import ppat_module
    from lightning_fedkg.run import fit

    from test_fkge_federation import BASE

    made, steps = [], []
    original_step = ppat_module.HostTrainer.step

    class Counting(ppat_module.HostTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

        def step(self, message):
            steps.append(1)
            return original_step(self, message)

    monkeypatch.setattr("lightning_fedkg.methods.fkge.modes.ppat.HostTrainer", Counting)
    metrics = fit(load_config(None, [*BASE, "federated.fkge.handshakes_per_kg=1"]), tmp_path / "run")
    exchanged = [h for h in metrics["handshakes"] if h.get("ppat_batches")]
    assert exchanged and len(made) == len(exchanged)
    assert len(steps) == sum(h["ppat_batches"] for h in exchanged)
    assert all(isinstance(t.trainer, L.Trainer) and not t.thread.is_alive() for t in made)
    assert not [t for t in threading.enumerate() if t.name == "ppat-host-trainer"]
