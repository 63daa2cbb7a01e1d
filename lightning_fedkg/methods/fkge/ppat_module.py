"""PPAT's GAN as LightningModules, each fitted by a plain ``lightning.Trainer``.

:class:`PPATModule` composes both halves of :mod:`.ppat` -- the client's generator ``W`` and
the host's teachers, student and PATE aggregation -- with manual optimisation: each training
step moves one generated batch client -> host and its gradient host -> client as messages
through a :class:`~lightning_fedkg.federated.channel.Channel`, and every net steps through the
optimizers Lightning hands out (one process holds both halves: the synthetic benchmark).
In the federation the halves live on two peers, so each host fits its own half,
:class:`PPATHostModule`, with a Trainer per handshake (:class:`HostTrainer`): the Trainer
runs in a thread of the host and takes each generated batch that arrives as a message as its
next training step. Event loop and Trainer alternate in lockstep (deterministic), and the
Trainer never waits on another party, so two parties hosting each other cannot deadlock.
"""

from __future__ import annotations

import queue
import threading

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.message import Message

from .ppat import FAKE, GRAD, PPATClient, PPATHost

__all__ = ["PPATModule", "PPATHostModule", "HostTrainer", "fit_ppat"]


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


def _wrap_host_optimizers(host: PPATHost, opts) -> None:
    """Let ``host`` step its nets through the optimizers Lightning hands out."""
    opts = opts if isinstance(opts, list) else [opts]
    host.teacher_opts, host.student_opt = list(opts[:-1]), opts[-1]


class PPATHostModule(L.LightningModule):
    """The host's half of PPAT (teachers, student, PATE aggregation) as a LightningModule with
    manual optimisation, fed one generated batch per training step by :class:`HostTrainer`.

    Its training data are the client's messages: step ``k`` takes the ``k``-th generated batch
    from ``inbox``, runs :meth:`~.ppat.PPATHost.on_fake` (the teachers' and the student's
    steps through Lightning's optimizers) and puts the gradient message in ``outbox``. A
    ``None`` in ``inbox`` ends the fit (the handshake is over)."""

    def __init__(self, host: PPATHost, inbox: queue.Queue, outbox: queue.Queue, max_batches: int):
        super().__init__()
        self.automatic_optimization = False
        self.ppat_host = host
        self.teachers, self.student = host.teachers, host.student
        self.inbox, self.outbox, self.max_batches = inbox, outbox, int(max_batches)
        self._raw = (list(host.teacher_opts), host.student_opt)

    def configure_optimizers(self):
        return [*self.ppat_host.teacher_opts, self.ppat_host.student_opt]

    def on_train_start(self) -> None:
        _wrap_host_optimizers(self.ppat_host, self.optimizers())

    def on_train_end(self) -> None:  # the host's state holds plain optimizers again
        self.ppat_host.teacher_opts, self.ppat_host.student_opt = self._raw

    def train_dataloader(self) -> DataLoader:
        # a generator of its own: creating the loader's iterator must not draw from the
        # global RNG, which the rest of the run (dropout, KGE training) shares
        return DataLoader(range(self.max_batches), batch_size=1, generator=torch.Generator())

    def training_step(self, batch, batch_idx: int) -> None:
        message = self.inbox.get()
        if message is None:
            self.trainer.should_stop = True
            return None
        try:
            reply = self.ppat_host.on_fake(message)
        except BaseException as err:  # handed to the event loop, which raises it
            self.outbox.put(err)
            raise
        self.log_dict({k: self.ppat_host.last[k] for k in ("loss_teachers", "loss_student", "loss_generator")},
                      on_step=False, on_epoch=True, batch_size=int(self.ppat_host.last["size"]))
        self.outbox.put(reply)
        return None


class HostTrainer:
    """One handshake's host-side Trainer fit, in a thread that alternates with the event loop.

    :meth:`step` hands a generated batch to the fit and returns its gradient message;
    :meth:`close` ends the fit. The thread only ever waits for the event loop's next batch,
    and the event loop only for this thread's answer, so no two parties wait on each other.
    """

    def __init__(self, host: PPATHost, max_batches: int, trainer_kwargs: dict | None = None):
        self.inbox: queue.Queue = queue.Queue(maxsize=1)
        self.outbox: queue.Queue = queue.Queue(maxsize=1)
        self.module = PPATHostModule(host, self.inbox, self.outbox, max_batches + 1)
        kwargs = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        kwargs.update(trainer_kwargs or {})
        from lightning_fedkg.federated.party import quiet_lightning

        with quiet_lightning():
            self.trainer = L.Trainer(**kwargs)
        self.thread = threading.Thread(target=self._fit, name="ppat-host-trainer", daemon=True)
        self.thread.start()

    def _fit(self) -> None:
        from lightning_fedkg.federated.party import quiet_lightning

        try:
            with quiet_lightning():
                self.trainer.fit(self.module)
        except BaseException as err:  # noqa: BLE001 -- reported to the event loop by step()
            if self.outbox.empty():
                self.outbox.put(err)

    def step(self, message: Message) -> Message:
        """The gradient of the generator loss for this generated batch (one training step)."""
        if not self.thread.is_alive():
            raise RuntimeError("the host's PPAT trainer has ended")
        self.inbox.put(message)
        reply = self.outbox.get()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def close(self) -> None:
        """End the fit (idempotent)."""
        if self.thread.is_alive():
            self.inbox.put(None)
            self.thread.join()


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
