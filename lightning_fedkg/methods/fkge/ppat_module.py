"""PPAT's GAN as one LightningModule, trained by a plain ``lightning.Trainer``.

:class:`PPATModule` composes the two halves of :mod:`.ppat` -- the client's generator
(:class:`~.ppat.PPATClient`, ``W``) and the host's teachers, student and PATE aggregation
(:class:`~.ppat.PPATHost`) -- and runs their alternating game with manual optimisation
(``automatic_optimization = False``): each training step moves one batch of generated rows
client -> host and its gradient host -> client as messages through a
:class:`~lightning_fedkg.federated.channel.Channel` (the wire log the federation keeps), and
steps the teachers, the student and the generator through the optimizers Lightning hands
out (:meth:`~lightning.pytorch.core.LightningModule.optimizers`).

Where it runs: in one process that holds both halves (the synthetic benchmark, tests, a
party that simulates a pair). The federation's handshake keeps the same halves on two
peers and exchanges the same messages one event at a time: a host's batch arrives as a
message, and a Trainer cannot be suspended between two events, nor can a host's step block
on its client without deadlocking two parties that host each other
(docs/methods/fkge.md).
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_fedkg.federated.channel import Channel

from .ppat import FAKE, GRAD, PPATClient, PPATHost

__all__ = ["PPATModule", "fit_ppat"]


class PPATModule(L.LightningModule):
    """PPAT (Peng et al., CIKM 2021, Alg. 2) as a LightningModule with manual optimisation.

    Args:
        x: ``[m, d]``, the client's rows of the aligned items.
        y: ``[m, d]``, the host's rows of the same items (row ``i`` = row ``i``).
        client_kw: :class:`~.ppat.PPATClient` arguments (``init``, ``lr``, ``momentum``,
            ``orthogonalize``, ``seed``).
        host_kw: :class:`~.ppat.PPATHost` arguments (``num_teachers``, ``lam``, ``hidden``, ...).
        batch_size: rows per generated batch (one PATE query per row).
        seed: the client's batch order.
        max_epsilon: stop (``trainer.should_stop``) before a batch that could take the
            host's data-independent epsilon past it (a count, so stopping reveals nothing).
        channel: the transport both halves' messages cross (a fresh :class:`Channel`).

    Logged per epoch (``self.log``): ``loss_teachers``, ``loss_student``, ``loss_generator``,
    ``teachers_fooled`` (share of teacher votes "real" on fakes), ``agreement`` (share of
    noisy labels equal to the teachers' plurality, untied votes), ``epsilon`` (data-
    independent) and ``epsilon_data_dependent`` (not private).
    """

    def __init__(self, x: Tensor, y: Tensor, client_kw: dict | None = None, host_kw: dict | None = None,
                 batch_size: int = 32, seed: int = 0, max_epsilon: float | None = None,
                 channel: Channel | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.client = PPATClient(x, **(client_kw or {}))
        self.ppat_host = PPATHost(y, **(host_kw or {}))
        # registered so that Lightning moves and counts them; the halves hold the same objects
        self.w = self.client.w
        self.teachers, self.student = self.ppat_host.teachers, self.ppat_host.student
        self.batch_size, self.seed, self.max_epsilon = int(batch_size), int(seed), max_epsilon
        self.channel = channel if channel is not None else Channel()
        self.stopped = "epochs"

    def configure_optimizers(self):
        host = self.ppat_host
        return [self.client.optimizer, *host.teacher_opts, host.student_opt]

    def on_train_start(self) -> None:
        # the halves step through the optimizers Lightning wraps (manual optimisation)
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        self.client.optimizer = opts[0]
        self.ppat_host.teacher_opts = list(opts[1:-1])
        self.ppat_host.student_opt = opts[-1]

    def train_dataloader(self) -> DataLoader:
        order = torch.Generator().manual_seed(self.seed)
        return DataLoader(torch.arange(self.client.num_rows), batch_size=self.batch_size, shuffle=True,
                          generator=order)

    def training_step(self, rows: Tensor, batch_idx: int) -> None:
        host = self.ppat_host
        if self.max_epsilon is not None and host.epsilon_after(rows.numel()) > self.max_epsilon:
            self.stopped, self.trainer.should_stop = "budget", True
            return None
        rows = rows.cpu()
        epoch = int(self.current_epoch)
        fake = self.channel.send("client", "host", FAKE, self.client.fake_message(rows), epoch)
        grad = self.channel.send("host", "client", GRAD, host.on_fake(fake), epoch)
        self.client.on_grad(grad)
        last, n = host.last, rows.numel()
        untied = last["gaps"] > 0
        agree = (last["labels"][untied] == last["votes"][untied].argmax(dim=1)).float()
        stats = {"loss_teachers": last["loss_teachers"], "loss_student": last["loss_student"],
                 "loss_generator": last["loss_generator"],
                 "teachers_fooled": float(last["votes"][:, 1].sum()) / (n * host.num_teachers),
                 "epsilon": host.accountant.epsilon_data_independent(),
                 "epsilon_data_dependent": host.epsilon()}
        if untied.any():
            self.log("agreement", float(agree.mean()), on_step=False, on_epoch=True, batch_size=int(untied.sum()))
        self.log_dict(stats, on_step=False, on_epoch=True, batch_size=n)
        return None

    @torch.no_grad()
    def translate(self, rows: Tensor) -> Tensor:
        """``W`` applied to any rows (``G(X)``)."""
        return self.client.translate(rows)


def fit_ppat(module: PPATModule, epochs: int, trainer_kwargs: dict | None = None) -> L.Trainer:
    """Train ``module`` for at most ``epochs`` with a plain ``lightning.Trainer`` on the CPU
    (no logger, checkpoints or progress bar by default; ``trainer_kwargs`` override)."""
    kwargs = dict(accelerator="cpu", devices=1, max_epochs=int(epochs), logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    kwargs.update(trainer_kwargs or {})
    from lightning_fedkg.federated.party import quiet_lightning

    with quiet_lightning():
        trainer = L.Trainer(**kwargs)
        trainer.fit(module)
    return trainer
