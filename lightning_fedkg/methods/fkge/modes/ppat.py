"""``alignment: ppat``, the paper's adversarial translation: the client sends batches of
``G(X)`` (``ppat_fake``), the host answers each with the generator's gradient from its PATE
discriminators (``ppat_grad``) until the epochs, its stopping rule or its budget end it
(``ppat_stop``); then the client sends its translated rows."""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from lightning_fedkg.federated.message import Message, tensor_bytes
from lightning_fedkg.federated.peer import Outgoing

from ..handshake import DECLINE, STOP, TRANSLATED, Convergence, Hosting, PPATClientSide
from ..ppat import FAKE, GRAD, PPATClient, PPATHost
from ..ppat_module import HostTrainer
from ..translation import translated_message
from .base import AlignmentMode


class PPATAlignment(AlignmentMode):
    """PPAT's host (the discriminators, fitted by a Trainer per handshake) and client (the generator)."""

    def release_exceeds(self, max_epsilon: float) -> bool:
        return self.peer.ledger.epsilon_after_pate(1) > max_epsilon

    # ------------------------------------------------------------------ host
    def ppat_host(self, y: Tensor, partner: str, number: int) -> PPATHost:
        fk, seed = self.fk, self.peer.handshake_seed
        return PPATHost(y, num_teachers=fk.teachers, hidden=fk.hidden, lam=fk.lam, delta=fk.delta,
                        lr=fk.lr, momentum=fk.momentum, teacher_fakes=fk.teacher_fakes,
                        smoothing=fk.smoothing, dropout=fk.dropout,
                        saturating=fk.saturating, seed=seed(partner, number, "host"),
                        noise_seed=seed(partner, number, "pate_noise") if fk.reproducible_noise else None,
                        accountant=self.peer.ledger.pate)

    def on_ppat_fake(self, message: Message, sender: str) -> list[Outgoing]:
        peer = self.peer
        host = peer.hosting(sender)
        n = len(message.config["rows"])
        host.bytes += tensor_bytes(message.arrays)
        host.ppat_bytes += tensor_bytes(message.arrays)
        if self.fk.max_epsilon is not None and peer.ledger.epsilon_after_pate(n) > self.fk.max_epsilon:
            host.stopped = "budget"
            return [(sender, STOP, Message())]
        if host.stopped == "converged":
            return [(sender, STOP, Message())]
        tic = time.perf_counter()
        if host.trainer is None:  # the handshake's PPAT half is fitted by a lightning.Trainer
            batches = self.fk.ppat_epochs * math.ceil(host.y.shape[0] / self.fk.ppat_batch_size)
            host.trainer = HostTrainer(host.ppat, max_batches=batches)
        reply = host.trainer.step(message)
        host.seconds += time.perf_counter() - tic
        host.batches += 1
        self._track_convergence(host, n)
        host.bytes += tensor_bytes(reply.arrays)
        host.ppat_bytes += tensor_bytes(reply.arrays)
        return [(sender, GRAD, reply)]

    def _track_convergence(self, host: Hosting, n: int) -> None:
        """PPAT's stopping rule, the host's (the losses never leave it): after each epoch over
        the aligned rows, the epoch's mean generator loss; ``ppat_patience`` epochs in a row
        without a drop of at least ``ppat_tolerance`` below the best end the handshake's PPAT."""
        if host.convergence is None:
            host.convergence = Convergence()
        track = host.convergence
        track.sum += host.ppat.last["loss_generator"] * n
        track.rows += n
        if track.rows < host.y.shape[0]:
            return
        loss = track.sum / track.rows
        track.sum, track.rows = 0.0, 0
        track.losses.append(loss)
        if loss < track.best - self.fk.ppat_tolerance:
            track.best, track.stale = loss, 0
        else:
            track.stale += 1
        if self.fk.ppat_patience is not None and track.stale >= self.fk.ppat_patience:
            host.stopped = "converged"

    # ------------------------------------------------------------------ client
    def ppat_client(self, x: Tensor, seed: int = 0) -> PPATClient:
        fk = self.fk
        return PPATClient(x, init=fk.generator_init, lr=fk.generator_lr if fk.generator_lr is not None else fk.lr,
                          momentum=fk.generator_momentum if fk.generator_momentum is not None else fk.momentum,
                          orthogonalize=fk.orthogonalize, seed=seed)

    def start_client(self, host: str, ents: Tensor, rels: Tensor, number: int, w_seed: int,
                     tic: float) -> list[Outgoing]:
        peer = self.peer
        ppat = self.ppat_client(peer.rows(ents, rels), w_seed)
        w_start = ppat.w.detach().clone()
        order = torch.Generator().manual_seed(peer.handshake_seed(host, number, "order"))
        batches = [rows for _ in range(self.fk.ppat_epochs)
                   for rows in torch.randperm(ppat.num_rows, generator=order).split(self.fk.ppat_batch_size)]
        peer.serving[host] = PPATClientSide(entities=ents, relations=rels, seconds=time.perf_counter() - tic,
                                            ppat=ppat, batches=batches, w_start=w_start)
        return self._send_next(host)

    def _send_next(self, host: str) -> list[Outgoing]:
        peer = self.peer
        if peer.spent():  # no more batches nor translated rows once this party's budget is spent
            del peer.serving[host]
            return [(host, DECLINE, Message())]
        side = peer.serving[host]
        tic = time.perf_counter()
        if side.batches:
            rows = side.batches.pop(0)
            side.pending = rows
            out = [(host, FAKE, side.ppat.fake_message(rows))]
            peer.ledger.declare("generated_rows", rows.numel())  # G(X_batch): not noised
        else:
            out = [(host, TRANSLATED, translated_message(peer, host, side))]
            del peer.serving[host]
        side.seconds += time.perf_counter() - tic
        return out

    def on_ppat_grad(self, message: Message, sender: str) -> list[Outgoing]:
        side = self.peer.serving[sender]
        tic = time.perf_counter()
        side.ppat.on_grad(message)
        side.pending = None
        side.seconds += time.perf_counter() - tic
        return self._send_next(sender)

    def on_ppat_stop(self, message: Message, sender: str) -> list[Outgoing]:
        side = self.peer.serving[sender]
        side.batches.clear()
        side.pending = None
        side.ppat._pending = None
        return self._send_next(sender)

    def client_side(self, state: dict) -> PPATClientSide:
        if state["kind"] != "ppat":
            return super().client_side(state)
        ppat = self.ppat_client(state["x"])
        ppat.load_state_dict(state["ppat"])
        if state["pending"] is not None:  # W has not stepped since this batch went out
            ppat.fake_message(state["pending"])
        return PPATClientSide(entities=state["entities"], relations=state["relations"], seconds=state["seconds"],
                              ppat=ppat, batches=state["batches"], w_start=state["w_start"],
                              pending=state["pending"])
