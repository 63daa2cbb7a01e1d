"""FKGE's federation: one peer per KG, pairwise PPAT handshakes, KGEmb-Update with backtracking.

Peng et al., "Differentially Private Federated Knowledge Graphs Embedding", CIKM 2021,
Alg. 1. There is no server: every KG owner is an :class:`FKGEPeer` on the core's
event loop (local FIFO scheduler or Ray). A peer pre-trains, aligns with every
partner by keyed hashes and asks to be translated (``fkge_request``); a host takes one
queued client at a time, runs PPAT or the supervised alignment with it, receives the
translated rows and keeps the update only if its validation improved, then broadcasts.
The run ends when no message is pending or the budgets are spent. The protocol, its
events and where it differs from Alg. 1: docs/methods/fkge.md.

The peer is the handshake's state machine; what happens between ``fkge_start`` and
``fkge_translated`` is its alignment mode's (:mod:`.modes`: PPAT, supervised, random), and
the end of a handshake (the translated rows, their scores, the update) is :mod:`.translation`.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
import time

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError, ExperimentConfig
from lightning_fedkg.federated.alignment import pairwise_alignment
from lightning_fedkg.federated.message import Message, tensor_bytes
from lightning_fedkg.federated.peer import Outgoing, PeerHalf, PeerStrategy
from lightning_fedkg.seeding import derive_seed

from .classification import triple_classification
from .config import FKGEConfig, check_fkge_config
from .handshake import (DECLINE, HELLO, REQUEST, START, TRANSLATED, ClientSide, Exchange, HandshakeRecord, Hosting,
                        PeerState, UpdateOutcome)
from .ledger import PrivacyLedger
from .modes import MODES
from .pretraining import Pretraining, load_pretrained, pretrain, save_pretrained
from .report import format_kgs_table, planned_partners
from .translation import heldout_alignment, translation_cosine, update_with

__all__ = ["FKGE", "FKGEPeer", "QUALITY_KEYS"]

log = logging.getLogger("lightning_fedkg")

#: Link-prediction keys of a ``before``/``after`` block (plus ``"accuracy"``).
QUALITY_KEYS = ("mrr", "mr", "hits@1", "hits@3", "hits@10")


class FKGEPeer(PeerHalf):
    """One KG owner of FKGE: host and client of pairwise handshakes (see the module docstring).

    Its handshake state is typed (:mod:`.handshake`): :attr:`state` a :class:`PeerState`,
    :attr:`host` the :class:`Hosting` it hosts, :attr:`serving` its :class:`ClientSide` of
    each handshake a partner hosts, :attr:`handshakes` the :class:`HandshakeRecord` of each
    one it hosted. :attr:`mode` is its alignment (:mod:`.modes`), which handles the events
    of its own exchange.
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
        self.mode = MODES[self.fk.alignment](self)

    def handle(self, event: str, message: Message, sender: str) -> list[Outgoing]:
        """The handshake's events are the peer's (``on_fkge_*``), its alignment's exchange
        (PPAT's batches, the supervised release) the mode's."""
        handler = getattr(self, f"on_{event}", None) or getattr(self.mode, f"on_{event}", None)
        if handler is None:
            raise NotImplementedError(f"{type(self).__name__} ({self.fk.alignment}) has no handler for event {event!r}")
        return list(handler(message, sender) or [])

    def handshake_seed(self, partner: str, number: int, purpose: str) -> int:
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
        return self.fk.max_epsilon is not None and self.mode.release_exceeds(self.fk.max_epsilon)

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

    def _new_host(self, partner: str, ents: Tensor, rels: Tensor, y: Tensor) -> Hosting:
        ppat = self.mode.ppat_host(y, partner, self.hosted)
        return Hosting(partner=partner, number=self.hosted, entities=ents, relations=rels, y=y, ppat=ppat,
                       queries_before=self.ledger.pate.queries)

    def on_fkge_start(self, message: Message, sender: str) -> list[Outgoing]:
        if self.spent():
            return [(sender, DECLINE, Message())]
        ents, rels = self.aligned_ids(sender)
        number = int(message.config["handshake"])
        tic = time.perf_counter()
        # W's start is the client's secret: derived from the run's seed, the names and the
        # handshake number, the host could recompute it and read X ≈ W₀ᵀ G(X) off the wire.
        w_seed = self.handshake_seed(sender, number, "generator") if self.fk.reproducible_noise else secrets.randbits(63)
        return self.mode.start_client(sender, ents, rels, number, w_seed, tic)

    def on_fkge_decline(self, message: Message, sender: str) -> list[Outgoing]:
        """The partner's privacy budget is spent: it sends nothing more; the handshake ends unused."""
        host = self.hosting(sender)
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

    def hosting(self, partner: str) -> Hosting:
        """The handshake this peer hosts with ``partner`` (an error if it hosts none with it)."""
        if self.host is None or self.host.partner != partner:
            raise RuntimeError(f"{self.name} is not hosting a handshake with {partner}")
        return self.host

    def on_fkge_translated(self, message: Message, sender: str) -> list[Outgoing]:
        host = self.hosting(sender)
        self._end_trainer(host)
        host.bytes += tensor_bytes(message.arrays)
        exchange = Exchange(
            aligned_entities=int(host.entities.numel()), aligned_relations=int(host.relations.numel()),
            ppat_batches=host.batches, stopped=host.stopped, queries=self.ledger.pate.queries - host.queries_before,
            sigma=host.sigma, ppat_generator_losses=[] if host.convergence is None else host.convergence.losses,
            seconds_ppat=host.seconds + float(message.metrics.get("seconds_client", 0.0)),
            **translation_cosine(host, message), **heldout_alignment(self, host, message))
        if host.batches == 0 and host.stopped == "budget":  # the budget allowed no PPAT step: nothing to update
            outcome = UpdateOutcome(accepted=False, skipped="epsilon", seconds_update=0.0, virtual_entities=0,
                                    valid_before=self.best, valid_after=None)
        else:
            outcome = update_with(self, host, message)
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
        self.host = None if state["host"] is None else Hosting.from_state(state["host"], self.mode.ppat_host)
        self.serving = {name: self.mode.client_side(side) for name, side in state["serving"].items()}


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
