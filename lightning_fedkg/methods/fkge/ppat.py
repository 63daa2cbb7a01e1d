"""PPAT: privacy-preserving adversarial translation between two KGs (FKGE's GAN).

Peng et al., "Differentially Private Federated Knowledge Graphs Embedding", CIKM 2021,
§3.2 (Eq. 3-7, Alg. 2). The **client** holds its aligned rows ``X`` and the generator
``G(x) = W x``; the **host** holds its rows ``Y``, PATE teachers on disjoint partitions of
them and a student trained only on noisy teacher votes about the generated rows, and
returns only the gradient of the generator loss with respect to each generated batch.
:class:`PPATClient` and :class:`PPATHost` exchange messages only; :func:`run_ppat` moves
them through a channel. The halves step explicit optimizers; :mod:`.ppat_module` runs them
under a ``lightning.Trainer`` (both halves in one process, or the host's half per federated
handshake). The game, where it differs from the official code and what it was measured to
learn: docs/methods/fkge.md.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_fedkg.federated.message import Message

from lightning_fedkg.privacy.mechanisms.pate_moments import PateMomentsAccountant
from lightning_fedkg.privacy.mechanisms.pate import noisy_argmax, split_teacher_partitions, teacher_votes

__all__ = ["PPATClient", "PPATHost", "discriminator", "initial_generator", "run_ppat", "FAKE", "GRAD"]

#: Wire names: the generated batch (client -> host) and its gradient (host -> client).
FAKE, GRAD = "ppat_fake", "ppat_grad"


def discriminator(d: int, hidden: int, slope: float = 0.2, dropout: float = 0.0) -> nn.Sequential:
    """``d -> hidden -> 1`` with LeakyReLU; outputs a logit (``> 0`` means "real").
    ``dropout`` on the input (MUSE's ``dis_input_dropout``) when in training mode."""
    layers = [nn.Dropout(dropout)] if dropout else []
    return nn.Sequential(*layers, nn.Linear(d, hidden), nn.LeakyReLU(slope), nn.Linear(hidden, 1))


def initial_generator(d: int, init: str, seed: int) -> Tensor:
    """The generator's start ``W0`` (``[d, d]``): ``"identity"``, a Haar-random ``"orthogonal"``
    map or ``"xavier"``, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    if init == "identity":
        return torch.eye(d)
    if init == "orthogonal":  # Haar: QR of a Gaussian with the signs of R's diagonal fixed
        q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
        return (q * torch.sign(torch.diagonal(r))).float()
    if init == "xavier":
        return nn.init.xavier_uniform_(torch.empty(d, d), generator=gen)
    raise ValueError(f"init must be 'orthogonal', 'identity' or 'xavier', got {init!r}")


class PPATClient:
    """The generator side: ``X`` and ``G(x) = W x`` (rows: ``G(X) = X W^T``).

    Args:
        x: ``[m, d]``, the client's embeddings of the aligned items (copied, detached).
        init: ``"orthogonal"`` (default, seeded), ``"identity"`` (MUSE) or ``"xavier"``
            (official code); see the module docstring.
        lr, momentum: SGD on ``W`` (paper: 0.02, 0.9; see the module docstring for the
            two-timescale setting that converges on the synthetic task).
        orthogonalize: MUSE's ``beta``; after each step ``W <- (1 + beta) W - beta W W^T W``
            (0 = off, the paper's and the code's choice).
        seed: for ``W``'s initialisation.
    """

    def __init__(
        self,
        x: Tensor,
        init: str = "orthogonal",
        lr: float = 0.02,
        momentum: float = 0.9,
        orthogonalize: float = 0.0,
        seed: int = 0,
    ):
        if x.dim() != 2:
            raise ValueError(f"X must be [m, d], got shape {tuple(x.shape)}")
        self.x = x.detach().clone().float()
        self.w = nn.Parameter(initial_generator(self.x.shape[1], init, seed).to(self.x.device))
        self.optimizer = torch.optim.SGD([self.w], lr=lr, momentum=momentum)
        self.orthogonalize = float(orthogonalize)
        self._pending: Tensor | None = None  # G(X_rows), with its graph, until the gradient comes

    @property
    def num_rows(self) -> int:
        return self.x.shape[0]

    def fake_message(self, rows: Tensor) -> Message:
        """``G(X_rows)`` for the host; keeps the graph until :meth:`on_grad`."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        out = self.x[rows.to(self.x.device)] @ self.w.T
        self._pending = out
        return Message(arrays={FAKE: out.detach()}, config={"rows": rows.tolist()})

    def on_grad(self, message: Message) -> None:
        """Backpropagate the host's ``dL_G/dG(X_rows)`` into ``W`` and step (Alg. 2)."""
        if self._pending is None:
            raise RuntimeError("no generated batch is waiting for a gradient")
        if set(message.arrays) != {GRAD}:
            raise ValueError(f"expected only {GRAD!r}, got {sorted(message.arrays)}")
        out = self._pending
        grad = message.arrays[GRAD]
        if grad.shape != out.shape:
            raise ValueError(f"gradient shape {tuple(grad.shape)} != batch shape {tuple(out.shape)}")
        self.optimizer.zero_grad(set_to_none=True)
        out.backward(grad.to(out.device, out.dtype))  # dL/dW = sum_b grad_b x_b^T
        self.optimizer.step()
        if self.orthogonalize:  # MUSE: W <- (1 + beta) W - beta (W W^T) W
            with torch.no_grad():
                w = self.w.detach().clone()
                self.w.copy_((1 + self.orthogonalize) * w - self.orthogonalize * (w @ w.T) @ w)
        self._pending = None

    @torch.no_grad()
    def translate(self, rows: Tensor) -> Tensor:
        """``W`` applied to any embedding rows (``[n, d] -> [n, d]``): ``G(X)``, ``G(N(X))``."""
        return rows.to(self.w.device, self.w.dtype) @ self.w.T

    def state_dict(self) -> dict:
        return {"w": self.w.detach().clone(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.w.copy_(state["w"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._pending = None


class PPATHost:
    """The discriminator side: ``Y``, ``num_teachers`` PATE teachers, the student, the accountant.

    Args:
        y: ``[m, d]``, the host's embeddings of the aligned items (row ``i`` = client row ``i``).
        num_teachers: ``|T|`` (paper: 4).
        hidden: discriminator width (official code: 1024).
        lam: PATE noise parameter, noise ``Lap(1/lam)`` (paper: 0.05).
        delta, max_order: the accountant's ``delta`` and moment orders.
        lr, momentum: SGD for every discriminator (paper: 0.02, 0.9).
        teacher_fakes: ``"own"`` (each teacher gets the fakes of its partition's rows) or
            ``"all"`` (every teacher gets every fake, PATE-GAN's loss).
        saturating: use the paper's ``L_G = mean log(1 - S(G(x)))`` instead of
            ``mean -log S(G(x))``.
        seed: nets' initialisation and the teacher partition.
        noise_seed: seed of the PATE noise stream. ``None`` (default) seeds it from the
            operating system's secure randomness (:func:`secrets.randbits`): the noise then
            depends on nothing another party knows, which the DP guarantee requires (noise
            a client can recompute can be subtracted from the labels). Pass a seed only for
            tests and bit-reproducible experiments, whose labels are then not private.
        accountant: continue an existing accountant (one per host over all its handshakes).
        smoothing: MUSE's label smoothing: real targets ``1 - s``, fake targets ``s`` for the
            teachers and the student (0: none, the paper's).
        dropout: MUSE's input dropout on every discriminator while it trains (votes and the
            generator's gradient are taken without it).
    """

    def __init__(
        self,
        y: Tensor,
        num_teachers: int = 4,
        hidden: int = 1024,
        lam: float = 0.05,
        delta: float = 1e-5,
        max_order: int = 32,
        lr: float = 0.02,
        momentum: float = 0.9,
        teacher_fakes: str = "own",
        saturating: bool = False,
        seed: int = 0,
        noise_seed: int | None = None,
        accountant: PateMomentsAccountant | None = None,
        smoothing: float = 0.0,
        dropout: float = 0.0,
    ):
        if y.dim() != 2:
            raise ValueError(f"Y must be [m, d], got shape {tuple(y.shape)}")
        if teacher_fakes not in ("own", "all"):
            raise ValueError(f"teacher_fakes must be 'own' or 'all', got {teacher_fakes!r}")
        self.y = y.detach().clone().float()
        m, d = self.y.shape
        self.lam, self.teacher_fakes, self.saturating = float(lam), teacher_fakes, bool(saturating)
        if not 0 <= smoothing < 0.5:
            raise ValueError(f"smoothing must lie in [0, 0.5), got {smoothing}")
        self.smoothing = float(smoothing)
        self.partitions = split_teacher_partitions(m, num_teachers, torch.Generator().manual_seed(seed))
        self.row_teacher = torch.empty(m, dtype=torch.long)  # aligned row -> its teacher
        for i, part in enumerate(self.partitions):
            self.row_teacher[part] = i
        self.row_teacher = self.row_teacher.to(self.y.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.teachers = nn.ModuleList(discriminator(d, hidden, dropout=dropout)
                                          for _ in range(num_teachers)).to(self.y.device)
            self.student = discriminator(d, hidden, dropout=dropout).to(self.y.device)
        self.teacher_opts = [torch.optim.SGD(t.parameters(), lr=lr, momentum=momentum) for t in self.teachers]
        self.student_opt = torch.optim.SGD(self.student.parameters(), lr=lr, momentum=momentum)
        if noise_seed is None:
            noise_seed = secrets.randbits(63)
        self.noise = torch.Generator().manual_seed(int(noise_seed))
        self.accountant = accountant or PateMomentsAccountant(lam, delta=delta, max_order=max_order)
        if self.accountant.lam != self.lam:
            raise ValueError(f"accountant lam {self.accountant.lam} != host lam {self.lam}")
        #: What the last :meth:`on_fake` did (kept here, never sent): losses, votes, labels, gaps.
        self.last: dict[str, Any] = {}

    @property
    def num_teachers(self) -> int:
        return len(self.teachers)

    def on_fake(self, message: Message) -> Message:
        """One alternating step on a generated batch; returns ``dL_G/dG(X_batch)`` only."""
        if set(message.arrays) != {FAKE}:
            raise ValueError(f"expected only {FAKE!r}, got {sorted(message.arrays)}")
        fake = message.arrays[FAKE].to(self.y.device, torch.float32)
        rows = torch.as_tensor(message.config["rows"], dtype=torch.long)
        if fake.dim() != 2 or fake.shape != (rows.numel(), self.y.shape[1]):
            raise ValueError(
                f"fake batch shape {tuple(fake.shape)} does not match {rows.numel()} rows of width {self.y.shape[1]}"
            )
        if rows.numel() and (rows.min() < 0 or rows.max() >= self.y.shape[0]):
            raise ValueError("row ids out of range")
        rows = rows.to(self.y.device)

        # (1) teachers: own real rows (label 1) vs generated rows (label 0)
        owner = self.row_teacher[rows]
        teacher_losses = []
        for i, (teacher, opt) in enumerate(zip(self.teachers, self.teacher_opts)):
            mine = owner == i
            if not mine.any():
                continue
            real = self.y[rows[mine]]
            fakes = fake[mine] if self.teacher_fakes == "own" else fake
            logits = teacher(torch.cat([real, fakes])).squeeze(-1)
            target = torch.cat([torch.ones(len(real)), torch.zeros(len(fakes))]).to(logits)
            target = target * (1 - 2 * self.smoothing) + self.smoothing  # MUSE's label smoothing
            loss = F.binary_cross_entropy_with_logits(logits, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            teacher_losses.append(loss.item())

        # (2) student: noisy PATE labels of the generated rows (one query per sample)
        self.teachers.eval()  # votes without dropout
        with torch.no_grad():
            probs = torch.stack([torch.sigmoid(t(fake).squeeze(-1)) for t in self.teachers])  # [T, B]
        self.teachers.train()
        votes = teacher_votes(probs.cpu())  # [B, 2] hard votes, threshold 0.5
        labels, gaps = noisy_argmax(votes, self.lam, self.noise)
        self.accountant.accumulate(gaps)
        student_target = labels.to(fake) * (1 - 2 * self.smoothing) + self.smoothing
        student_loss = F.binary_cross_entropy_with_logits(self.student(fake).squeeze(-1), student_target)
        self.student_opt.zero_grad(set_to_none=True)
        student_loss.backward()
        self.student_opt.step()

        # (3) generator loss through the (updated) student; gradient w.r.t. the batch only
        g_in = fake.detach().requires_grad_(True)
        self.student.eval()
        logits = self.student(g_in).squeeze(-1)
        self.student.train()
        if self.saturating:
            gen_loss = -F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits))  # mean log(1 - S)
        else:
            gen_loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))  # mean -log S
        (grad,) = torch.autograd.grad(gen_loss, g_in)

        self.last = {
            "size": rows.numel(),
            "loss_teachers": sum(teacher_losses) / max(len(teacher_losses), 1),
            "loss_student": student_loss.item(),
            "loss_generator": gen_loss.item(),
            "votes": votes,
            "labels": labels,
            "gaps": gaps,
        }
        return Message(arrays={GRAD: grad.detach()})

    def epsilon(self) -> float:
        """The host's ``epsilon`` at its ``delta`` over every label it has answered so far."""
        return self.accountant.epsilon()

    def epsilon_after(self, queries: int) -> float:
        """``epsilon`` if ``queries`` more labels were charged at the worst per-query cost
        (:meth:`~lightning_fedkg.privacy.mechanisms.pate_moments.PateMomentsAccountant.epsilon_after`)."""
        return self.accountant.epsilon_after(queries)

    def state_dict(self) -> dict:
        return {
            "teachers": self.teachers.state_dict(),
            "student": self.student.state_dict(),
            "teacher_opts": [o.state_dict() for o in self.teacher_opts],
            "student_opt": self.student_opt.state_dict(),
            "partitions": [p.clone() for p in self.partitions],
            "noise": self.noise.get_state(),
            "accountant": self.accountant.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.teachers.load_state_dict(state["teachers"])
        self.student.load_state_dict(state["student"])
        for opt, s in zip(self.teacher_opts, state["teacher_opts"]):
            opt.load_state_dict(s)
        self.student_opt.load_state_dict(state["student_opt"])
        self.partitions = [p.clone() for p in state["partitions"]]
        for i, part in enumerate(self.partitions):
            self.row_teacher[part.to(self.row_teacher.device)] = i
        self.noise.set_state(state["noise"])
        self.accountant.load_state_dict(state["accountant"])


def run_ppat(
    client: PPATClient,
    host: PPATHost,
    channel,
    epochs: int = 1,
    batch_size: int = 32,
    seed: int = 0,
    client_name: str = "client",
    host_name: str = "host",
    round: int = 0,
    max_epsilon: float | None = None,
) -> dict:
    """Train PPAT for ``epochs`` passes over the aligned rows, every transfer through ``channel``.

    The client draws each epoch's batch order from ``seed`` (its own choice; the host learns
    the row ids with each batch). Convergence criterion: a fixed number of epochs (the paper
    gives none, the code runs one); with ``max_epsilon`` the run also stops before a batch
    whose worst-case charge (:meth:`PPATHost.epsilon_after`) would exceed it.

    Returns ``{"epochs": [per-epoch means of loss_teachers / loss_student / loss_generator,
    "labelled_real" (share of noisy labels "real"), "agreement" (share of noisy labels equal
    to the teachers' plurality, untied votes only; None without any), "teachers_fooled" (share of teacher votes
    "real" on fakes), "epsilon", "queries", "batches"], "epsilon", "queries" (this run),
    "queries_total" (the host's), "batches", "bytes", "wire_bytes", "stopped" ("epochs" |
    "budget"), "seconds"}``. The losses come from the host's local log, not the wire.
    """
    if client.num_rows != host.y.shape[0]:
        raise ValueError(f"client has {client.num_rows} aligned rows, host {host.y.shape[0]}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    start, first_record = time.perf_counter(), len(channel)
    queries_before = host.accountant.queries
    order = torch.Generator().manual_seed(seed)
    history, stopped = [], "epochs"
    for epoch in range(epochs):
        sums = dict.fromkeys(("loss_teachers", "loss_student", "loss_generator"), 0.0)
        samples = batches = real = agree = untied = fooled = 0
        for rows in torch.randperm(client.num_rows, generator=order).split(batch_size):
            if max_epsilon is not None and host.epsilon_after(rows.numel()) > max_epsilon:
                stopped = "budget"
                break
            fake = channel.send(client_name, host_name, FAKE, client.fake_message(rows), round)
            grad = channel.send(host_name, client_name, GRAD, host.on_fake(fake), round)
            client.on_grad(grad)
            last, n = host.last, rows.numel()
            for key in sums:
                sums[key] += last[key] * n
            samples, batches = samples + n, batches + 1
            real += int(last["labels"].sum())
            mask = last["gaps"] > 0
            agree += int((last["labels"][mask] == last["votes"][mask].argmax(dim=1)).sum())
            untied += int(mask.sum())
            fooled += int(last["votes"][:, 1].sum())
        if batches:
            history.append(
                {
                    "epoch": epoch,
                    "batches": batches,
                    **{k: v / samples for k, v in sums.items()},
                    "labelled_real": real / samples,
                    "agreement": agree / untied if untied else None,
                    "teachers_fooled": fooled / (samples * host.num_teachers),
                    "epsilon": host.epsilon(),
                    "queries": host.accountant.queries,
                }
            )
        if stopped == "budget":
            break
    records = channel.records()[first_record:]
    return {
        "epochs": history,
        "epsilon": host.epsilon(),
        "queries": host.accountant.queries - queries_before,
        "queries_total": host.accountant.queries,
        "batches": sum(h["batches"] for h in history),
        "bytes": sum(r.bytes for r in records),
        "wire_bytes": sum(r.wire_bytes for r in records),
        "stopped": stopped,
        "seconds": time.perf_counter() - start,
    }
