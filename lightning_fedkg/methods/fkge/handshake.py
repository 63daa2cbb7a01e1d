"""FKGE's handshake state as typed records: a peer's state, the host's side of the handshake
it hosts, the client side of each handshake it serves, and the record of a finished one.

Each record turns into plain containers for the checkpoint (``state_dict``) and back; a
finished handshake turns into its row of ``metrics.json``'s ``handshakes``
(:meth:`HandshakeRecord.to_dict`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Callable

from torch import Tensor

from .ppat import PPATClient, PPATHost

__all__ = ["HELLO", "REQUEST", "START", "STOP", "TRANSLATED", "DECLINE", "HELDOUT_KEYS", "PeerState", "Convergence", "Hosting", "ClientSide", "PPATClientSide", "SupervisedClientSide",
           "Exchange", "UpdateOutcome", "HandshakeRecord"]

#: The handshake's events (PPAT's batches are :data:`.ppat.FAKE` and :data:`.ppat.GRAD`, the
#: supervised release's :data:`.supervised.ROWS` and :data:`.supervised.CROSSCOV`).
HELLO, REQUEST, START, STOP, TRANSLATED = "fkge_hello", "fkge_request", "fkge_start", "ppat_stop", "fkge_translated"
DECLINE = "fkge_decline"


class PeerState(str, Enum):
    """Alg. 1's states of a KG owner as a host: ``Busy`` while it hosts a handshake, ``Sleep``
    when no partner is queued, ``Ready`` between two handshakes."""

    READY = "Ready"
    BUSY = "Busy"
    SLEEP = "Sleep"


@dataclass
class Convergence:
    """PPAT's stopping rule on the host: the running sum of this epoch's generator losses
    (weighted by rows), the best epoch mean so far and how many epochs in a row missed it."""

    sum: float = 0.0
    rows: int = 0
    best: float = math.inf
    stale: int = 0
    losses: list[float] = field(default_factory=list)  # each finished epoch's mean loss


@dataclass
class Hosting:
    """The handshake a peer hosts: its partner (the client), the aligned rows ``y`` of the host,
    its PPAT half (``None`` for the supervised alignment) and the Trainer fitting it, and what
    the handshake cost."""

    partner: str
    number: int  # the host's count of hosted handshakes, this one included
    entities: Tensor  # the host's aligned entity ids, in alignment order
    relations: Tensor
    y: Tensor  # the host's rows of those items
    ppat: PPATHost | None
    queries_before: int  # the ledger's PATE queries when the handshake began
    batches: int = 0
    seconds: float = 0.0
    bytes: int = 0
    ppat_bytes: int = 0
    stopped: str = "epochs"  # why PPAT ended: "epochs", "converged" or "budget"
    sigma: float | None = None  # the supervised release's noise scale
    convergence: Convergence | None = None
    # the Trainer fitting the PPAT half for this handshake (ppat_module.HostTrainer): a live
    # thread, not state; a resumed host starts a new one from ``ppat``'s saved state
    trainer: object | None = field(default=None, repr=False, compare=False)

    def state_dict(self) -> dict:
        state = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.name not in ("ppat", "convergence", "trainer")}
        state["ppat"] = None if self.ppat is None else self.ppat.state_dict()
        state["convergence"] = None if self.convergence is None else asdict(self.convergence)
        return state

    @classmethod
    def from_state(cls, state: dict, make_ppat: Callable[[Tensor, str, int], PPATHost]) -> "Hosting":
        """Undo :meth:`state_dict`; ``make_ppat(y, partner, number)`` builds the PPAT half."""
        state = dict(state)
        ppat_state, convergence = state.pop("ppat"), state.pop("convergence")
        hosting = cls(**state, ppat=None)
        if ppat_state is not None:
            hosting.ppat = make_ppat(hosting.y, hosting.partner, hosting.number)
            hosting.ppat.load_state_dict(ppat_state)
        if convergence is not None:
            hosting.convergence = Convergence(**convergence)
        return hosting


@dataclass
class ClientSide:
    """A peer's client side of a handshake a partner hosts: its aligned items and the time it
    spent; subclasses hold how it translates its rows ``X``."""

    entities: Tensor
    relations: Tensor
    seconds: float

    @property
    def x(self) -> Tensor:
        raise NotImplementedError

    def translate(self, rows: Tensor) -> Tensor:
        raise NotImplementedError


@dataclass
class PPATClientSide(ClientSide):
    """The PPAT client: its generator, the batches still to send, the batch whose gradient it
    waits for (``pending``) and ``W``'s start (to report how far PPAT moved it)."""

    ppat: PPATClient
    batches: list[Tensor]
    w_start: Tensor
    pending: Tensor | None = None

    @property
    def x(self) -> Tensor:
        return self.ppat.x

    def translate(self, rows: Tensor) -> Tensor:
        return self.ppat.translate(rows)

    def generator_moved(self) -> float:
        """``|W - W_start| / |W_start|``: a local record, never sent."""
        return float((self.ppat.w.detach() - self.w_start).norm() / self.w_start.norm())

    def state_dict(self) -> dict:
        return {"kind": "ppat", "entities": self.entities, "relations": self.relations, "seconds": self.seconds,
                "ppat": self.ppat.state_dict(), "x": self.ppat.x, "batches": self.batches,
                "w_start": self.w_start, "pending": self.pending}


@dataclass
class SupervisedClientSide(ClientSide):
    """The supervised alignment's client: its rows ``X``, secret rotation ``W0`` and whitening
    ``power``; ``W`` once the host's noisy cross-covariance came back. The random-translation
    control uses it too, with ``W = W0`` a random rotation from the start."""

    w0: Tensor
    rows: Tensor
    w: Tensor | None = None
    power: float = 0.0

    @property
    def x(self) -> Tensor:
        return self.rows

    def translate(self, rows: Tensor) -> Tensor:
        return rows.to(self.w.dtype) @ self.w.T

    def state_dict(self) -> dict:
        return {"kind": "supervised", "entities": self.entities, "relations": self.relations,
                "seconds": self.seconds, "w0": self.w0, "x": self.rows, "power": self.power}


#: The held-out alignment scores of an :class:`Exchange`, last in a metrics.json row.
HELDOUT_KEYS = ("heldout_pairs", "heldout_cosine", "heldout_hits1", "heldout_hits10")


@dataclass
class Exchange:
    """What a handshake exchanged, as its host saw it."""

    aligned_entities: int
    aligned_relations: int
    ppat_batches: int
    stopped: str
    queries: int  # PATE queries charged to the host
    sigma: float | None
    ppat_generator_losses: list[float]
    seconds_ppat: float
    translation_cosine: float | None
    mismatched_cosine: float | None
    # the translation on aligned pairs no alignment or update used (federated.fkge.holdout_fraction)
    heldout_pairs: int = 0
    heldout_cosine: float | None = None
    heldout_hits1: float | None = None
    heldout_hits10: float | None = None


@dataclass
class UpdateOutcome:
    """The host's backtracking decision: whether the update beat its best validation score."""

    accepted: bool
    seconds_update: float
    virtual_entities: int
    valid_before: float | None
    valid_after: float | None
    skipped: str | None = None  # "epsilon": the budget allowed no PPAT step, nothing was updated

    def to_dict(self) -> dict:
        skipped = {} if self.skipped is None else {"skipped": self.skipped}
        return {"accepted": self.accepted, **skipped, "seconds_update": self.seconds_update,
                "virtual_entities": self.virtual_entities, "valid_before": self.valid_before,
                "valid_after": self.valid_after}


@dataclass
class HandshakeRecord:
    """One finished handshake, recorded by its host. Without :attr:`exchange` the partner
    declined it (its privacy budget was spent) and nothing was exchanged."""

    client: str
    host: str
    number: int
    finished_at: float
    exchange: Exchange | None = None
    outcome: UpdateOutcome | None = None
    epsilon: float | None = None  # the host's epsilon after the handshake
    bytes: int = 0
    bytes_per_ppat_batch: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.outcome is not None and self.outcome.accepted

    def to_dict(self) -> dict:
        """The handshake's row of ``metrics.json``."""
        head = {"client": self.client, "host": self.host, "number": self.number}
        if self.exchange is None:
            return {**head, "accepted": False, "skipped": "partner_epsilon", "finished_at": self.finished_at}
        exchange = asdict(self.exchange)
        heldout = {k: exchange.pop(k) for k in HELDOUT_KEYS}  # appended last: older keys keep their places
        return {**head, **exchange, **self.outcome.to_dict(), "epsilon": self.epsilon,
                "bytes": self.bytes, "bytes_per_ppat_batch": self.bytes_per_ppat_batch,
                "finished_at": self.finished_at, **heldout}

    @classmethod
    def from_dict(cls, row: dict) -> "HandshakeRecord":
        """Undo :meth:`to_dict`."""
        record = cls(row["client"], row["host"], row["number"], row["finished_at"])
        if row.get("skipped") == "partner_epsilon":
            return record
        record.exchange = Exchange(**{f.name: row[f.name] for f in fields(Exchange) if f.name in row})
        record.outcome = UpdateOutcome(**{f.name: row.get(f.name) for f in fields(UpdateOutcome)})
        record.epsilon, record.bytes = row["epsilon"], row["bytes"]
        record.bytes_per_ppat_batch = row["bytes_per_ppat_batch"]
        return record
