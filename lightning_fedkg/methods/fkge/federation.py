"""FKGE's federation: one peer per KG, pairwise PPAT handshakes, KGEmb-Update with backtracking.

Peng et al., "Differentially Private Federated Knowledge Graphs Embedding", CIKM 2021,
Alg. 1. There is no server: every KG owner is an :class:`FKGEPeer` on the core's
event loop (local FIFO scheduler or Ray). A peer pre-trains, aligns with every
partner by keyed hashes and asks to be translated (``fkge_request``); a host takes one
queued client at a time, runs PPAT or the supervised alignment with it, receives the
translated rows and keeps the update only if its validation improved, then broadcasts.
The run ends when no message is pending or the budgets are spent. The protocol, its
events and where it differs from Alg. 1: docs/methods/fkge.md.
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
import time
from pathlib import Path

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError, ExperimentConfig
from lightning_fedkg.federated.alignment import pairwise_alignment
from lightning_fedkg.federated.message import Message, tensor_bytes
from lightning_fedkg.federated.peer import Outgoing, PeerHalf, PeerStrategy
from lightning_fedkg.seeding import derive_seed

from .classification import triple_classification
from .config import FKGEConfig, check_fkge_config
from .handshake import (ClientSide, Convergence, Exchange, HandshakeRecord, Hosting, PeerState, PPATClientSide,
                        SupervisedClientSide, UpdateOutcome)
from .ledger import PrivacyLedger
from .ppat import FAKE, GRAD, PPATClient, PPATHost, initial_generator
from .ppat_module import HostTrainer
from .pretraining import Pretraining, load_pretrained, pretrain, save_pretrained
from .report import format_kgs_table
from .supervised import CROSSCOV, ROWS, AlignmentHost, decode, precondition, release_cost, unit_rows, whitening_power
from .update import kgemb_update

__all__ = ["FKGE", "FKGEPeer", "neighbour_edges", "QUALITY_KEYS", "random_rotation"]

log = logging.getLogger("lightning_fedkg")

#: Link-prediction keys of a ``before``/``after`` block (plus ``"accuracy"``).
QUALITY_KEYS = ("mrr", "mr", "hits@1", "hits@3", "hits@10")
HELLO, REQUEST, START, STOP, TRANSLATED = "fkge_hello", "fkge_request", "fkge_start", "ppat_stop", "fkge_translated"
DECLINE = "fkge_decline"


def neighbour_edges(train: Tensor, anchors: Tensor, excluded: Tensor, per_anchor: int) -> Tensor:
    """The client's joining triples for ``G(N(X))``: ``LongTensor[v, 4]`` rows
    ``(anchor position, relation, neighbour, neighbour_is_head)``.

    A candidate is a train triple with one end an aligned entity (``anchors[p]`` for
    position ``p``) and the other end an entity not in ``excluded`` (everything the partner
    already holds). Each neighbour is used once, by its first candidate in train order;
    each anchor keeps its first ``per_anchor`` neighbours.
    """
    if per_anchor <= 0 or anchors.numel() == 0 or train.numel() == 0:
        return torch.zeros(0, 4, dtype=torch.long)
    size = int(max(train[:, [0, 2]].max(), anchors.max(), excluded.max() if excluded.numel() else 0)) + 1
    position = torch.full((size,), -1, dtype=torch.long)
    position[anchors] = torch.arange(anchors.numel())
    shut = torch.zeros(size, dtype=torch.bool)
    shut[excluded] = True
    shut[anchors] = True
    h, r, t = train[:, 0], train[:, 1], train[:, 2]
    tail_side = (position[h] >= 0) & ~shut[t]  # anchor is the head, the neighbour the tail
    head_side = (position[t] >= 0) & ~shut[h]
    order = torch.arange(train.shape[0])
    cand = torch.cat([
        torch.stack([position[h], r, t, torch.zeros_like(h), order], 1)[tail_side],
        torch.stack([position[t], r, h, torch.ones_like(h), order], 1)[head_side],
    ])
    if cand.numel() == 0:
        return torch.zeros(0, 4, dtype=torch.long)
    cand = cand[torch.argsort(cand[:, 4] * 2 + cand[:, 3], stable=True)]  # train order, tail side first
    # first candidate of each neighbour
    nb = cand[:, 2]
    first = torch.full((size,), cand.shape[0], dtype=torch.long).scatter_reduce(
        0, nb, torch.arange(cand.shape[0]), reduce="amin")
    cand = cand[first[nb] == torch.arange(cand.shape[0])]
    # rank within each anchor (stable: train order), keep the first per_anchor
    by_anchor = torch.argsort(cand[:, 0], stable=True)
    cand = cand[by_anchor]
    anchor = cand[:, 0].contiguous()
    starts = torch.searchsorted(anchor, anchor)
    keep = (torch.arange(cand.shape[0]) - starts) < per_anchor
    return cand[keep][:, :4]


def random_rotation(d: int, seed: int) -> Tensor:
    """A Haar-random orthogonal ``[d, d]`` matrix drawn from ``seed``: QR of a Gaussian matrix
    with the signs of R's diagonal fixed (without the fix, Q is not Haar-distributed)."""
    g = torch.Generator().manual_seed(int(seed))
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def planned_partners(path: str, host: str) -> list[str]:
    """The partners ``host`` hosted, in order, in the run whose ``metrics.json`` is ``path``
    (``federated.fkge.schedule``: the equal-schedule control replays them)."""
    file = Path(path)
    if file.is_dir():
        file = file / "metrics.json"
    try:
        handshakes = json.loads(file.read_text())["handshakes"]
    except (OSError, KeyError, ValueError) as err:
        raise ConfigError(f"federated.fkge.schedule: cannot read the handshakes of {file}: {err}") from err
    mine = sorted((h for h in handshakes if h["host"] == host), key=lambda h: h["number"])
    return [h["client"] for h in mine]


class FKGEPeer(PeerHalf):
    """One KG owner of FKGE: host and client of pairwise handshakes (see the module docstring).

    Its handshake state is typed (:mod:`.handshake`): :attr:`state` a :class:`PeerState`,
    :attr:`host` the :class:`Hosting` it hosts, :attr:`serving` its :class:`ClientSide` of
    each handshake a partner hosts, :attr:`handshakes` the :class:`HandshakeRecord` of each
    one it hosted.
    """

    def __init__(self, party, strategy, peers) -> None:
        super().__init__(party, strategy, peers)
        self.fk = self.settings
        self.entity_pairs: dict[str, tuple[Tensor, Tensor]] = {}  # partner -> (mine, theirs) ids
        self.relation_pairs: dict[str, tuple[Tensor, Tensor]] = {}
        self.queue: list[str] = []
        self.state = PeerState.READY
        self.best: float | None = None
        self.before: dict | None = None
        self.hosted = 0
        self.handshakes: list[HandshakeRecord] = []
        self.ledger = PrivacyLedger(self.fk.lam, delta=self.fk.delta, neighbours=self.fk.dp_neighbours)
        self.planned = planned_partners(self.fk.schedule, self.name) if self.fk.schedule else None
        self.host: Hosting | None = None
        self.serving: dict[str, ClientSide] = {}  # host name -> this peer's client side
        self.exhausted = ""  # why this peer hosts no more ("" while it may)
        self.started_at = time.time()
        self.served: list[dict] = []  # this peer's client sides: how far each generator moved
        self.pretrain: Pretraining | None = None

    def _seed(self, partner: str, number: int, purpose: str) -> int:
        """A seed for ``purpose`` in this peer's ``number``-th handshake with ``partner``."""
        return derive_seed(self.cfg.seed, self.name, f"{partner}:{number}:{purpose}")

    # ------------------------------------------------------------------ items
    @property
    def uses_relations(self) -> bool:
        return self.fk.align in ("relations", "both")

    def aligned_ids(self, partner: str) -> tuple[Tensor, Tensor]:
        """This peer's ``(entity ids, relation ids)`` of the rows PPAT uses with ``partner``, in
        alignment order; the first ``ceil(align_fraction * k)`` aligned entities (the code's
        ``gan_ratio``)."""
        ents = self.entity_pairs.get(partner, (torch.zeros(0, dtype=torch.long),))[0]
        ents = ents[: ents.numel() - self._holdout_count(ents.numel())]
        if self.fk.align == "relations":
            ents = ents[:0]
        else:
            ents = ents[: math.ceil(self.fk.align_fraction * ents.numel())]
        rels = self.relation_pairs.get(partner, (torch.zeros(0, dtype=torch.long),))[0]
        return ents, rels if self.uses_relations else rels[:0]

    def _holdout_count(self, aligned: int) -> int:
        return math.floor(self.fk.holdout_fraction * aligned)

    def heldout_ids(self, partner: str) -> Tensor:
        """This peer's ids of the aligned entities held out from every alignment and update
        with ``partner``: the last ``floor(holdout_fraction * k)`` in alignment order (both
        sides hold the pairs in the same order). They only score the translation."""
        ents = self.entity_pairs.get(partner, (torch.zeros(0, dtype=torch.long),))[0]
        return ents[ents.numel() - self._holdout_count(ents.numel()):]

    def rows(self, entity_ids: Tensor, relation_ids: Tensor) -> Tensor:
        """``[k_e + k_r, d]``: ``entity_emb`` rows then ``relation_emb`` rows (one space for W)."""
        model = self.party.model
        ent = model.entity_emb.detach()[entity_ids]
        if relation_ids.numel() == 0:
            return ent.float().cpu().clone()
        rel = model.relation_emb.detach()[relation_ids]
        if rel.shape[1] != ent.shape[1]:
            raise ConfigError(f"{self.name}: relation alignment needs relation rows as wide as entity rows "
                              f"({rel.shape[1]} vs {ent.shape[1]}); use federated.fkge.align=entities")
        return torch.cat([ent, rel]).float().cpu().clone()

    # ------------------------------------------------------------------ quality
    def best_score(self) -> float:
        split = "val" if self.fk.backtrack_on == "valid" else "test"
        return float(self.party.evaluate(split)["mrr"])

    def quality(self) -> dict:
        """Test link prediction (filtered, both sides) and triple-classification accuracy."""
        lp = self.party.evaluate("test")
        kg, model = self.party.kg, self.party.model
        known = torch.cat([kg.triples(s) for s in kg.split_names])
        device = next(model.parameters()).device
        with torch.no_grad():
            tc = triple_classification(
                lambda h, r, t: model(h.to(device), r.to(device), t.to(device)),
                kg.triples("valid"), kg.triples("test"), kg.num_entities, known,
                torch.Generator().manual_seed(derive_seed(self.cfg.seed, self.name, "triple_classification")),
                num_relations=kg.num_relations, corruption="tail", type_constraint=True, device=device)
        return {"accuracy": float(tc["accuracy"]), **{k: float(lp[k]) for k in QUALITY_KEYS},
                "count": int(lp.get("count", 0))}

    # ------------------------------------------------------------------ protocol
    def start(self) -> list[Outgoing]:
        self.started_at = time.time()
        if self.fk.pretrained_from:
            self.pretrain = load_pretrained(self.party, self.fk.pretrained_from)
        else:
            self.pretrain = pretrain(self.party, self.fk, self.best_score)
            save_pretrained(self.party, self.pretrain)
        self.best = self.best_score()
        self.before = self.quality()
        arrays = {"entity_digests": self.digests("entity")}
        if self.uses_relations:
            arrays["relation_digests"] = self.digests("relation")
        return [(p, HELLO, Message(arrays=arrays)) for p in sorted(self.peers)]

    def on_fkge_hello(self, message: Message, sender: str) -> list[Outgoing]:
        mine, theirs = pairwise_alignment(self.digests("entity"), message.arrays["entity_digests"])
        self.entity_pairs[sender] = (mine, theirs)
        if self.uses_relations and "relation_digests" in message.arrays:
            self.relation_pairs[sender] = pairwise_alignment(self.digests("relation"),
                                                             message.arrays["relation_digests"])
        if sum(t.numel() for t in self.aligned_ids(sender)) == 0:
            return []
        return [(sender, REQUEST, Message())]

    def on_fkge_request(self, message: Message, sender: str) -> list[Outgoing]:
        # Also from the partner being hosted: it improved after fkge_start snapshotted its
        # rows, and that improvement is offered only by a later handshake. With a planned
        # schedule a request only wakes the host: whom it hosts next is the plan's.
        if self.planned is None and sender not in self.queue and not self.exhausted:
            self.queue.append(sender)
        return self._next()

    def _out_of_budget(self) -> str:
        """Why this peer may host no more handshakes ("" if it may)."""
        if self.hosted >= self.fk.handshakes_per_kg:
            return "handshakes"
        if self.fk.max_seconds is not None and time.time() - self.started_at >= self.fk.max_seconds:
            return "seconds"
        if self.spent():
            return "epsilon"
        if self.planned is not None and not self.planned:
            return "schedule"
        return ""

    def spent(self) -> bool:
        """Whether this party's next accounted release would take it past ``max_epsilon``; a
        spent party releases nothing more: it neither hosts, nor serves, nor broadcasts."""
        if self.fk.max_epsilon is None:
            return False
        if self.fk.alignment == "random":  # the control releases nothing under a mechanism
            return False
        if self.fk.alignment == "supervised":
            cost = release_cost(self.fk.dp_epsilon, self.fk.delta, self.ledger.max_order, self.fk.dp_neighbours)
            return self.ledger.epsilon_after_gaussian(cost.log_moments, cost.mu) > self.fk.max_epsilon
        return self.ledger.epsilon_after_pate(1) > self.fk.max_epsilon

    def _next(self) -> list[Outgoing]:
        """Host the oldest queued partner if not hosting; otherwise stay Busy or go to Sleep."""
        if self.host is not None:
            return []
        if self.planned is not None:  # the equal-schedule control: the plan's next partner, once aligned
            self.queue = self.planned[:1] if self.planned and self.planned[0] in self.entity_pairs else []
        while self.queue:
            self.exhausted = self._out_of_budget()
            if self.exhausted:
                self.queue.clear()
                break
            partner = self.queue.pop(0)
            if self.planned is not None:
                self.planned.pop(0)
            ents, rels = self.aligned_ids(partner)
            if ents.numel() + rels.numel() == 0:
                continue
            self.hosted += 1
            self.host = self._new_host(partner, ents, rels, self.rows(ents, rels))
            self.state = PeerState.BUSY
            start = Message(config={"handshake": self.hosted})
            return [(partner, START, start)]
        self.state = PeerState.SLEEP
        return []

    def _ppat_host(self, y: Tensor, partner: str, number: int) -> PPATHost:
        fk = self.fk
        return PPATHost(y, num_teachers=fk.teachers, hidden=fk.hidden, lam=fk.lam, delta=fk.delta,
                        lr=fk.lr, momentum=fk.momentum, teacher_fakes=fk.teacher_fakes,
                        smoothing=fk.smoothing, dropout=fk.dropout,
                        saturating=fk.saturating, seed=self._seed(partner, number, "host"),
                        noise_seed=self._seed(partner, number, "pate_noise") if fk.reproducible_noise else None,
                        accountant=self.ledger.pate)

    def _new_host(self, partner: str, ents: Tensor, rels: Tensor, y: Tensor) -> Hosting:
        ppat = self._ppat_host(y, partner, self.hosted) if self.fk.alignment == "ppat" else None
        return Hosting(partner=partner, number=self.hosted, entities=ents, relations=rels, y=y, ppat=ppat,
                       queries_before=self.ledger.pate.queries)

    def _ppat_client(self, x: Tensor, seed: int = 0) -> PPATClient:
        fk = self.fk
        return PPATClient(x, init=fk.generator_init, lr=fk.generator_lr if fk.generator_lr is not None else fk.lr,
                          momentum=fk.generator_momentum if fk.generator_momentum is not None else fk.momentum,
                          orthogonalize=fk.orthogonalize, seed=seed)

    def on_fkge_start(self, message: Message, sender: str) -> list[Outgoing]:
        if self.spent():
            return [(sender, DECLINE, Message())]
        ents, rels = self.aligned_ids(sender)
        number = int(message.config["handshake"])
        tic = time.perf_counter()
        # W's start is the client's secret: derived from the run's seed, the names and the
        # handshake number, the host could recompute it and read X ≈ W₀ᵀ G(X) off the wire.
        w_seed = self._seed(sender, number, "generator") if self.fk.reproducible_noise else secrets.randbits(63)
        if self.fk.alignment == "supervised":
            return self._send_rotated_rows(sender, ents, rels, w_seed, tic)
        if self.fk.alignment == "random":
            return self._send_randomly_translated(sender, ents, rels, number, tic)
        ppat = self._ppat_client(self.rows(ents, rels), w_seed)
        w_start = ppat.w.detach().clone()
        order = torch.Generator().manual_seed(self._seed(sender, number, "order"))
        batches = [rows for _ in range(self.fk.ppat_epochs)
                   for rows in torch.randperm(ppat.num_rows, generator=order).split(self.fk.ppat_batch_size)]
        self.serving[sender] = PPATClientSide(entities=ents, relations=rels, seconds=time.perf_counter() - tic,
                                              ppat=ppat, batches=batches, w_start=w_start)
        return self._send_next(sender)

    # ------------------------------------------------------------------ the random-translation control
    def _send_randomly_translated(self, host: str, ents: Tensor, rels: Tensor, number: int,
                                  tic: float) -> list[Outgoing]:
        """Client of ``alignment: random``: its rows under a fresh Haar-random rotation, drawn
        from the run's seed (a control, not a protocol: the host could recompute it)."""
        x = self.rows(ents, rels)
        w = random_rotation(x.shape[1], self._seed(host, number, "random_translation"))
        side = SupervisedClientSide(entities=ents, relations=rels, seconds=0.0, w0=w, rows=x, w=w)
        message = self._translated(host, side)
        side.seconds = time.perf_counter() - tic
        message.metrics["seconds_client"] = float(side.seconds)
        return [(host, TRANSLATED, message)]

    # ------------------------------------------------------------------ supervised DP alignment
    def _whitening(self, z: Tensor) -> float:
        """The client's whitening power: ``whiten_power``, or the one with the smallest
        predicted error; 0 (plain Procrustes) for the exact release, which has no noise."""
        if self.fk.whiten_power is not None:
            return float(self.fk.whiten_power)
        return 0.0 if self.fk.dp_epsilon is None else whitening_power(z)

    def _send_rotated_rows(self, host: str, ents: Tensor, rels: Tensor, w_seed: int, tic: float) -> list[Outgoing]:
        """Client: its aligned rows' directions under its secret ``W0``, whitened (:mod:`.supervised`)."""
        x = self.rows(ents, rels)
        w0 = initial_generator(x.shape[1], "orthogonal", w_seed)
        z = unit_rows(x @ w0.T)
        power = self._whitening(z)
        sent, _ = precondition(z, power)
        self.ledger.declare("rotated_rows", z.shape[0])
        self.serving[host] = SupervisedClientSide(entities=ents, relations=rels, seconds=time.perf_counter() - tic,
                                                  w0=w0, rows=x, power=power)
        return [(host, ROWS, Message(arrays={ROWS: sent}))]

    def on_align_rows(self, message: Message, sender: str) -> list[Outgoing]:
        """Host: the noisy cross-covariance, charged to this party's ledger."""
        host, fk = self._hosting(sender), self.fk
        host.bytes += tensor_bytes(message.arrays)
        host.ppat_bytes += tensor_bytes(message.arrays)
        tic = time.perf_counter()
        noise_seed = self._seed(host.partner, host.number, "dp_noise") if fk.reproducible_noise else None
        # no budget check here: _next hosted only if this release fits (spent()), and nothing
        # else charges a supervised host's ledger in between
        align = AlignmentHost(host.y, fk.dp_epsilon, fk.delta, self.ledger.max_order, noise_seed=noise_seed,
                              neighbours=fk.dp_neighbours)
        reply = align.on_rows(message)
        if fk.dp_epsilon is None:
            self.ledger.declare("exact_crosscov", 1)
        else:
            self.ledger.charge_gaussian(align.log_moments, add_remove=align.log_moments_add_remove,
                                        mu=align.cost.mu, mu_add_remove=align.cost.mu_add_remove)
        host.batches, host.sigma = 1, align.sigma
        host.seconds += time.perf_counter() - tic
        host.bytes += tensor_bytes(reply.arrays)
        host.ppat_bytes += tensor_bytes(reply.arrays)
        return [(sender, CROSSCOV, reply)]

    def on_dp_crosscov(self, message: Message, sender: str) -> list[Outgoing]:
        """Client: ``W = V W0`` with ``V`` the Procrustes solution on the noisy cross-covariance."""
        side = self.serving.pop(sender)
        if self.spent():  # spent while the host computed: the translated rows are not sent
            return [(sender, DECLINE, Message())]
        tic = time.perf_counter()
        _, b = precondition(unit_rows(side.rows @ side.w0.T), side.power)  # from the client's own rows
        side.w = decode(message.arrays[CROSSCOV].float(), b, side.power) @ side.w0
        side.seconds += time.perf_counter() - tic
        return [(sender, TRANSLATED, self._translated(sender, side))]

    def on_fkge_decline(self, message: Message, sender: str) -> list[Outgoing]:
        """The partner's privacy budget is spent: it sends nothing more; the handshake ends unused."""
        host = self._hosting(sender)
        self._end_trainer(host)
        self.handshakes.append(HandshakeRecord(client=sender, host=self.name, number=host.number,
                                               finished_at=time.time()))
        self.host, self.state = None, PeerState.READY
        log.info("fkge: %s hosted %s (#%d): declined by %s (its privacy budget is spent), epsilon %s",
                 self.name, sender, host.number, sender, self.epsilon_text())
        return self._next()

    @staticmethod
    def _end_trainer(host: Hosting) -> None:
        """End the handshake's PPAT fit, if one runs."""
        if host.trainer is not None:
            host.trainer.close()
            host.trainer = None

    def _send_next(self, host: str) -> list[Outgoing]:
        if self.spent():  # no more batches nor translated rows once this party's budget is spent
            del self.serving[host]
            return [(host, DECLINE, Message())]
        side = self.serving[host]
        tic = time.perf_counter()
        if side.batches:
            rows = side.batches.pop(0)
            side.pending = rows
            out = [(host, FAKE, side.ppat.fake_message(rows))]
            self.ledger.declare("generated_rows", rows.numel())  # G(X_batch): not noised
        else:
            out = [(host, TRANSLATED, self._translated(host, side))]
            del self.serving[host]
        side.seconds += time.perf_counter() - tic
        return out

    def on_ppat_fake(self, message: Message, sender: str) -> list[Outgoing]:
        host = self._hosting(sender)
        n = len(message.config["rows"])
        host.bytes += tensor_bytes(message.arrays)
        host.ppat_bytes += tensor_bytes(message.arrays)
        if self.fk.max_epsilon is not None and self.ledger.epsilon_after_pate(n) > self.fk.max_epsilon:
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

    def on_ppat_grad(self, message: Message, sender: str) -> list[Outgoing]:
        side = self.serving[sender]
        tic = time.perf_counter()
        side.ppat.on_grad(message)
        side.pending = None
        side.seconds += time.perf_counter() - tic
        return self._send_next(sender)

    def on_ppat_stop(self, message: Message, sender: str) -> list[Outgoing]:
        side = self.serving[sender]
        side.batches.clear()
        side.pending = None
        side.ppat._pending = None
        return self._send_next(sender)

    def _translated(self, host: str, side: ClientSide) -> Message:
        """``G(X)`` (entity rows, then relation rows) and ``G(N(X))`` with their joining triples."""
        ents = side.entities
        if isinstance(side, PPATClientSide):  # how far PPAT moved the generator: a local record, never sent
            self.served.append({"host": host, "generator_moved": side.generator_moved()})
        translated = side.translate(side.x)
        arrays = {"entities": translated[: ents.numel()].contiguous(),
                  "relations": translated[ents.numel():].contiguous()}
        mine_all = self.entity_pairs[host][0]
        edges = neighbour_edges(self.party.kg.triples("train"), ents, mine_all, self.fk.neighbours)
        rel_position = torch.full((self.party.kg.num_relations,), -1, dtype=torch.long)
        if self.uses_relations and host in self.relation_pairs:
            aligned_rel = self.relation_pairs[host][0]
            rel_position[aligned_rel] = torch.arange(aligned_rel.numel())
        model = self.party.model
        arrays["neighbours"] = side.translate(model.entity_emb.detach()[edges[:, 2]].float().cpu())
        arrays["neighbour_anchor"] = edges[:, 0].contiguous()
        arrays["neighbour_relation"] = rel_position[edges[:, 1]].contiguous()
        arrays["neighbour_is_head"] = edges[:, 3].contiguous()
        # not noised: what the host receives as a client's rows is declared, not accounted
        self.ledger.declare("translated_rows", translated.shape[0] + edges.shape[0])
        heldout = self.heldout_ids(host)
        if heldout.numel():  # only to score the translation on pairs no alignment used
            arrays["heldout"] = side.translate(self.rows(heldout, heldout[:0]))
            self.ledger.declare("heldout_rows", heldout.numel())
        return Message(arrays=arrays, metrics={"seconds_client": float(side.seconds)})

    @staticmethod
    def _translation_cosine(host: Hosting, message: Message) -> dict:
        """How well PPAT aligned the two spaces, a local diagnostic of the host: the mean
        cosine between ``G(x_i)`` and its own ``y_i`` (``translation_cosine``) and between
        ``G(x_i)`` and another item's ``y_{i+1}`` (``mismatched_cosine``, the level any shared
        direction of the tables gives); the gap is what the translation matched."""
        translated = torch.cat([message.arrays["entities"], message.arrays["relations"]]).float()
        y = host.y
        if translated.shape != y.shape or translated.shape[0] < 2:
            return {"translation_cosine": None, "mismatched_cosine": None}
        cos = torch.nn.functional.cosine_similarity
        return {"translation_cosine": float(cos(translated, y, dim=1).mean()),
                "mismatched_cosine": float(cos(translated, y.roll(1, dims=0), dim=1).mean())}

    def _heldout_alignment(self, host: Hosting, message: Message) -> dict:
        """The translation scored on the held-out pairs, a local diagnostic of the host: the
        mean cosine of ``G(x_i)`` and ``y_i`` and the share of translated rows whose own
        ``y_i`` ranks first / in the top 10 by cosine among all the host's entity rows."""
        ids = self.heldout_ids(host.partner)
        if "heldout" not in message.arrays or ids.numel() == 0:
            return {"heldout_pairs": 0, "heldout_cosine": None, "heldout_hits1": None, "heldout_hits10": None}
        normalize = torch.nn.functional.normalize
        translated = normalize(message.arrays["heldout"].float(), dim=1)
        table = normalize(self.party.model.entity_emb.detach().float().cpu(), dim=1)
        sims = translated @ table.T  # [h, n]
        own = sims.gather(1, ids.view(-1, 1))
        rank = (sims > own).sum(dim=1) + 1  # ties in the host's favour: an optimistic rank
        n = int(ids.numel())
        return {"heldout_pairs": n, "heldout_cosine": float(own.mean()),
                "heldout_hits1": int((rank <= 1).sum()) / n, "heldout_hits10": int((rank <= 10).sum()) / n}

    def _hosting(self, partner: str) -> Hosting:
        if self.host is None or self.host.partner != partner:
            raise RuntimeError(f"{self.name} is not hosting a handshake with {partner}")
        return self.host

    def on_fkge_translated(self, message: Message, sender: str) -> list[Outgoing]:
        host = self._hosting(sender)
        self._end_trainer(host)
        host.bytes += tensor_bytes(message.arrays)
        exchange = Exchange(
            aligned_entities=int(host.entities.numel()), aligned_relations=int(host.relations.numel()),
            ppat_batches=host.batches, stopped=host.stopped, queries=self.ledger.pate.queries - host.queries_before,
            sigma=host.sigma, ppat_generator_losses=[] if host.convergence is None else host.convergence.losses,
            seconds_ppat=host.seconds + float(message.metrics.get("seconds_client", 0.0)),
            **self._translation_cosine(host, message), **self._heldout_alignment(host, message))
        if host.batches == 0 and host.stopped == "budget":  # the budget allowed no PPAT step: nothing to update
            outcome = UpdateOutcome(accepted=False, skipped="epsilon", seconds_update=0.0, virtual_entities=0,
                                    valid_before=self.best, valid_after=None)
        else:
            outcome = self._update(host, message)
        record = HandshakeRecord(client=sender, host=self.name, number=host.number, exchange=exchange,
                                 outcome=outcome, epsilon=self.ledger.epsilon(), bytes=host.bytes,
                                 bytes_per_ppat_batch=host.ppat_bytes / max(host.batches, 1),
                                 finished_at=time.time())
        self.handshakes.append(record)
        self.host, self.state = None, PeerState.READY
        log.info("fkge: %s hosted %s (#%d): %s, validation MRR %s -> %s, epsilon %s", self.name, sender, host.number,
                 "accepted" if record.accepted else (f"skipped ({outcome.skipped})" if outcome.skipped else "rejected"),
                 _mrr(outcome.valid_before), _mrr(outcome.valid_after), self.epsilon_text())
        out = []
        if record.accepted and not self.spent():  # a broadcast tells each partner "my validation improved"
            out = [(p, REQUEST, Message()) for p in sorted(self.entity_pairs)
                   if sum(t.numel() for t in self.aligned_ids(p))]
            self.ledger.declare("accept_broadcasts", len(out))
        return out + self._next()

    def _update(self, host: Hosting, message: Message) -> UpdateOutcome:
        """The host's KGEmb-Update with what the client sent (``mode: none``: without it)."""
        if self.fk.mode == "none":  # the control: the same update, nothing received is used
            width = self.party.model.entity_emb.shape[1]
            return self._kgemb_update(host, torch.zeros(0, dtype=torch.long), torch.zeros(0, width))
        a = message.arrays
        kg = self.party.kg
        n, r = kg.num_entities, kg.num_relations
        anchors = host.entities[a["neighbour_anchor"]]
        virtual = torch.arange(n, n + anchors.numel())
        relation_ids = torch.full((anchors.numel(),), r, dtype=torch.long)  # the update's fresh relation
        known = a["neighbour_relation"] >= 0
        if known.any():
            relation_ids[known] = self.relation_pairs[host.partner][0][a["neighbour_relation"][known]]
        is_head = a["neighbour_is_head"].bool()
        triples = torch.stack([torch.where(is_head, virtual, anchors), relation_ids,
                               torch.where(is_head, anchors, virtual)], 1)
        relations = host.relations.numel() > 0
        translated = a["entities"]
        if self.fk.shuffle_received:  # the diagnostic control: right values, wrong items
            order = torch.Generator().manual_seed(self._seed(host.partner, host.number, "shuffle"))
            translated = translated[torch.randperm(translated.shape[0], generator=order)]
        return self._kgemb_update(
            host, host.entities, translated, a["neighbours"], triples,
            virtual_relations=1 if bool((~known).any()) else None,
            aligned_relation_ids=host.relations if relations else None,
            translated_relations=a["relations"] if relations else None)

    def _kgemb_update(self, host: Hosting, ids: Tensor, rows: Tensor, virtual_entities: Tensor | None = None,
                      virtual_triples: Tensor | None = None, **extra) -> UpdateOutcome:
        from lightning_fedkg.builders import datamodule_kwargs, trainer_kwargs

        out = kgemb_update(
            self.party.kg, self.party.module, ids, rows, virtual_entities, virtual_triples,
            mode="replace" if self.fk.mode == "none" else self.fk.mode, epochs=self.fk.update_epochs,
            trainer_kwargs=trainer_kwargs(self.cfg.trainer), datamodule_kwargs=datamodule_kwargs(self.cfg),
            eval_datamodule=self.party.datamodule, backtrack_on=self.fk.backtrack_on, valid_before=self.best,
            seed=self._seed(host.partner, host.number, "update"), **extra)
        if out["accepted"]:
            self.best = out["valid_after"]
        return UpdateOutcome(accepted=out["accepted"], seconds_update=out["seconds"],
                             virtual_entities=0 if virtual_entities is None else int(virtual_entities.shape[0]),
                             valid_before=out["valid_before"], valid_after=out["valid_after"])

    def close(self) -> None:
        """A run that ends mid-handshake (``federated.rounds``) ends its PPAT fit too."""
        if self.host is not None:
            self._end_trainer(self.host)

    # ------------------------------------------------------------------ reporting and state
    def epsilon_text(self) -> str:
        """This party's epsilon as the terminal shows it: ``not private`` after an exact release."""
        privacy = self.ledger.summary()
        return "not private" if not privacy["private"] else f"{privacy['epsilon']:.2f}"

    def report(self) -> dict:
        privacy = self.ledger.summary()
        return {"name": self.name, "model": self.cfg.model.name,
                "pretrain": None if self.pretrain is None else self.pretrain.to_dict(),
                "before": self.before, "after": self.quality(),
                # None after an exact release: no epsilon bounds what it showed (privacy.private)
                "epsilon": privacy["epsilon"] if privacy["private"] else None, "privacy": privacy,
                "queries": self.ledger.pate.queries,
                "hosted": self.hosted, "served": self.served,
                "accepted": sum(bool(h.accepted) for h in self.handshakes), "best": self.best,
                "state": self.state.value, "stopped_hosting": self.exhausted or None,
                "handshakes": [h.to_dict() for h in self.handshakes]}

    def state_dict(self) -> dict:
        return {"entity_pairs": self.entity_pairs, "relation_pairs": self.relation_pairs, "queue": list(self.queue),
                "state": self.state.value, "best": self.best, "before": self.before, "hosted": self.hosted,
                "handshakes": [h.to_dict() for h in self.handshakes], "ledger": self.ledger.state_dict(),
                "host": None if self.host is None else self.host.state_dict(),
                "serving": {name: side.state_dict() for name, side in self.serving.items()},
                "exhausted": self.exhausted, "planned": self.planned, "served": self.served,
                "pretrain": None if self.pretrain is None else self.pretrain.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.entity_pairs = dict(state["entity_pairs"])
        self.relation_pairs = dict(state["relation_pairs"])
        self.queue = list(state["queue"])
        self.state, self.best, self.before = PeerState(state["state"]), state["best"], state["before"]
        self.hosted, self.exhausted = state["hosted"], state["exhausted"]
        self.handshakes = [HandshakeRecord.from_dict(h) for h in state["handshakes"]]
        self.ledger.load_state_dict(state["ledger"])
        self.planned, self.served = state["planned"], list(state["served"])
        self.pretrain = None if state["pretrain"] is None else Pretraining.from_dict(state["pretrain"])
        self.host = None if state["host"] is None else Hosting.from_state(state["host"], self._ppat_host)
        self.serving = {name: self._client_side(side) for name, side in state["serving"].items()}

    def _client_side(self, state: dict) -> ClientSide:
        """A :class:`ClientSide` from its ``state_dict``."""
        common = dict(entities=state["entities"], relations=state["relations"], seconds=state["seconds"])
        if state["kind"] == "supervised":  # W0, X and the whitening power are the whole client side
            return SupervisedClientSide(**common, w0=state["w0"], rows=state["x"], power=state.get("power", 0.0))
        ppat = self._ppat_client(state["x"])
        ppat.load_state_dict(state["ppat"])
        if state["pending"] is not None:  # W has not stepped since this batch went out
            ppat.fake_message(state["pending"])
        return PPATClientSide(**common, ppat=ppat, batches=state["batches"], w_start=state["w_start"],
                              pending=state["pending"])


def _mrr(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _party_name(kg, k: int, taken: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", kg.name or "") or f"kg_{k}"
    return name if name not in taken else f"{name}_{k}"


class FKGE(PeerStrategy):
    """FKGE (Peng et al., CIKM 2021): one :class:`FKGEPeer` per KG of a multi-source federation."""

    name = "fkge"
    Peer = FKGEPeer
    groups = ()
    config_class = FKGEConfig
    # PPAT's batches are many small messages; a resume point at the protocol's boundaries
    checkpoint_events = frozenset({HELLO, REQUEST, TRANSLATED})

    @staticmethod
    def sources(cfg: ExperimentConfig) -> dict:
        """``{party name: KnowledgeGraph}`` of ``cfg.data``'s multi-source federation."""
        from lightning_fedkg.methods.fkge.multisource import load_multisource

        check_fkge_config(cfg.federated.fkge)  # before any party is built or trained
        d = cfg.data
        if d.client_entities != "own":
            raise ConfigError("data.client_entities=all is not for fkge: its KGs keep their own entities and "
                              "align them by name; leave data.client_entities=own")
        kgs = load_multisource(d.name, num_sources=d.num_clients, seed=d.partition_seed, fmt=d.format,
                               shared_relations=cfg.federated.fkge.shared_relations)
        named = {}
        for k, kg in enumerate(kgs):
            named[_party_name(kg, k, set(named))] = kg
        return named

    @classmethod
    def party_names(cls, cfg: ExperimentConfig) -> list[str]:
        return list(cls.sources(cfg))

    @classmethod
    def build_parties(cls, cfg: ExperimentConfig, task, run_dir, purge_step, only: str | None = None):
        from lightning_fedkg.federated.party import build_party

        return [build_party(cfg, task, name, kg, {"entity": list(kg.entity_names), "relation": list(kg.relation_names)},
                            run_dir=run_dir, purge_step=purge_step)
                for name, kg in cls.sources(cfg).items() if only is None or name == only]

    @classmethod
    def summarize(cls, reports: dict[str, dict]) -> dict:
        kgs = [{k: v for k, v in rep.items() if k != "handshakes"} for rep in reports.values()]
        handshakes = sorted((h for rep in reports.values() for h in rep["handshakes"]),
                            key=lambda h: h["finished_at"])
        return {"kgs": kgs, "handshakes": handshakes}

    @classmethod
    def format_report(cls, metrics: dict) -> str | None:
        """FKGE's per-KG table (:func:`~.report.format_kgs_table`) of its ``metrics.json``."""
        return format_kgs_table(metrics) if "kgs" in metrics else None
