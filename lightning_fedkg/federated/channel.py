"""The one path by which messages move between federated parties, with a traffic log.

Parties are plain strings (``"server"``, ``"client_3"``). A :class:`Channel` serializes every
message (:mod:`.message`, safetensors) and hands the receiver a decoded copy, so no party
shares storage with another; other transports (Flower) replace the delivery, not the log.
Each record has ``bytes`` (tensor bytes, ``bytes_sent``) and ``wire_bytes`` (serialized);
:meth:`open_log` appends them to ``channel_log.jsonl`` and ``record_payloads`` keeps the
bytes under ``payloads/``. See docs/DESIGN.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Iterable, Mapping

from torch import Tensor

from lightning_fedkg.federated.message import Message, decode, encode, tensor_bytes

__all__ = ["Channel", "Record"]


@dataclass(frozen=True)
class Record:
    """One logged transfer: who sent what to whom in which round, and its size."""

    round: int
    sender: str
    receiver: str
    name: str
    shapes: dict[str, list[int]]
    dtypes: dict[str, str]
    bytes: int
    wire_bytes: int = 0
    metrics: tuple[str, ...] = ()
    config: tuple[str, ...] = ()


class Channel:
    """Moves :class:`~.message.Message` objects (or plain ``{str: Tensor}`` payloads)
    between named parties through their serialized bytes, and records each transfer."""

    def __init__(self) -> None:
        self._records: list[Record] = []
        self._log: IO[str] | None = None
        self._payload_dir: Path | None = None

    # ------------------------------------------------------------------ files
    def open_log(self, path: str | Path, payload_dir: str | Path | None = None) -> None:
        """Write the records so far to ``path`` and append every later one as it happens.

        Rewriting on open drops any transfer logged after the last saved state (a round
        cut short by a crash), so a resumed run's log equals an uninterrupted run's.
        ``payload_dir``: also store each transfer's serialized bytes there.
        """
        self.close()
        self._log = open(path, "w")
        for r in self._records:
            self._write(r)
        if payload_dir is not None:
            self._payload_dir = Path(payload_dir)
            self._payload_dir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _write(self, record: Record) -> None:
        assert self._log is not None
        self._log.write(json.dumps(asdict(record)) + "\n")
        self._log.flush()

    # ------------------------------------------------------------------ sending
    def send(
        self,
        sender: str,
        receiver: str,
        name: str,
        payload: Message | Mapping[str, Tensor],
        round: int,
    ) -> Message | dict[str, Tensor]:
        """Deliver ``payload`` from ``sender`` to ``receiver``; log it under ``name``/``round``.

        Returns what the receiver decodes from the bytes: a :class:`Message` for a message,
        a ``{str: Tensor}`` dict for a plain payload. Raises ``TypeError`` for anything
        else, so no Python object can slip across unlogged.
        """
        if sender == receiver:
            raise ValueError(f"a party cannot send to itself ({sender!r})")
        plain = not isinstance(payload, Message)
        if plain:
            if not isinstance(payload, Mapping):
                raise TypeError(f"payload {name!r} must be a Message or a str->Tensor mapping")
            for key, value in payload.items():
                if not isinstance(key, str) or not isinstance(value, Tensor):
                    raise TypeError(
                        f"payload {name!r} must map str to Tensor; key {key!r} holds {type(value).__name__}"
                    )
            payload = Message(arrays=dict(payload))
        data = encode(payload)
        delivered = self._log_transfer(sender, receiver, name, data, round)
        return delivered.arrays if plain else delivered

    def relay(self, sender: str, receiver: str, name: str, data: bytes, round: int,
              wire_bytes: int | None = None) -> bytes:
        """Log a message that another process already serialized (:func:`~.message.encode`'s
        bytes) and return the same bytes, to forward unchanged.

        The record is built from the decoded bytes exactly as :meth:`send` builds it, so a
        router between processes (the Ray backend, :mod:`~lightning_fedkg.backends.ray.peer`) writes the same log
        without encoding twice; bytes that are not a valid message raise here, before they
        are forwarded. ``wire_bytes``: what the transport really sent for it, when it wraps
        the bytes in framing of its own (Flower's records); default ``len(data)``.
        """
        if sender == receiver:
            raise ValueError(f"a party cannot send to itself ({sender!r})")
        data = bytes(data)
        self._log_transfer(sender, receiver, name, data, round, wire_bytes)
        return data

    def _log_transfer(self, sender: str, receiver: str, name: str, data: bytes, round: int,
                      wire_bytes: int | None = None) -> Message:
        """Decode ``data``, record the transfer (log file, payload file) and return the message."""
        delivered = decode(data)
        record = Record(
            round=int(round),
            sender=sender,
            receiver=receiver,
            name=name,
            shapes={k: list(v.shape) for k, v in delivered.arrays.items()},
            dtypes={k: str(v.dtype).removeprefix("torch.") for k, v in delivered.arrays.items()},
            bytes=tensor_bytes(delivered.arrays),
            wire_bytes=len(data) if wire_bytes is None else int(wire_bytes),
            metrics=tuple(sorted(delivered.metrics)),
            config=tuple(sorted(delivered.config)),
        )
        self._records.append(record)
        if self._log is not None:
            self._write(record)
        if self._payload_dir is not None:
            fname = f"r{int(round):04d}_{len(self._records):06d}_{sender}_to_{receiver}_{name}.safetensors"
            (self._payload_dir / fname).write_bytes(data)
        return delivered

    def broadcast(
        self,
        sender: str,
        receivers: Iterable[str],
        name: str,
        payloads: Mapping[str, Mapping[str, Tensor]] | Mapping[str, Tensor],
        round: int,
    ) -> dict[str, dict[str, Tensor]]:
        """Send to several receivers; each transfer is logged separately (unicast accounting).

        ``payloads`` is either one payload for everybody or a ``{receiver: payload}`` map.
        """
        receivers = list(receivers)
        per_receiver = bool(payloads) and all(isinstance(v, Mapping) for v in payloads.values())
        return {
            r: self.send(sender, r, name, payloads[r] if per_receiver else payloads, round)
            for r in receivers
        }

    # ------------------------------------------------------------------ reading the log
    def records(
        self,
        round: int | None = None,
        sender: str | None = None,
        receiver: str | None = None,
        name: str | None = None,
    ) -> list[Record]:
        """The logged transfers matching every given filter (``None`` = any), in send order."""
        return [
            r
            for r in self._records
            if (round is None or r.round == round)
            and (sender is None or r.sender == sender)
            and (receiver is None or r.receiver == receiver)
            and (name is None or r.name == name)
        ]

    def bytes_per_round(self) -> dict[int, int]:
        """Total tensor bytes sent in each round that saw traffic, ordered by round."""
        totals: dict[int, int] = {}
        for r in sorted(self._records, key=lambda rec: rec.round):
            totals[r.round] = totals.get(r.round, 0) + r.bytes
        return totals

    @property
    def total_bytes(self) -> int:
        """Tensor bytes sent over the whole run."""
        return sum(r.bytes for r in self._records)

    @property
    def total_wire_bytes(self) -> int:
        """Serialized bytes sent over the whole run."""
        return sum(r.wire_bytes for r in self._records)

    def __len__(self) -> int:
        return len(self._records)

    def to_jsonl(self, path: str | Path) -> None:
        """Write one JSON object per transfer (the run directory's ``channel_log.jsonl``)."""
        with open(path, "w") as f:
            for r in self._records:
                f.write(json.dumps(asdict(r)) + "\n")

    def state_dict(self) -> dict:
        """The log as plain data, so a resumed run continues the same accounting."""
        return {"records": [asdict(r) for r in self._records]}

    def load_state_dict(self, state: dict) -> None:
        """Replace the log with one saved by :meth:`state_dict`."""
        self._records = [
            Record(**{**r, "metrics": tuple(r.get("metrics", ())), "config": tuple(r.get("config", ()))})
            for r in state["records"]
        ]
