"""The one path by which payloads move between federated parties, with a traffic log.

Every party is a plain string (``"server"``, ``"client_3"``, ...), so server-client and
peer-to-peer protocols (FKGE handshakes, pairwise secure-aggregation masks) use the same
``send``. The log is what tests read to prove that something *never* crossed (triples,
FedE relation embeddings, unmasked uploads) and what communication-cost numbers come from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Mapping

from torch import Tensor

__all__ = ["Channel", "Record", "payload_bytes"]


@dataclass(frozen=True)
class Record:
    """One logged transfer: who sent what to whom in which round, and its size in bytes."""

    round: int
    sender: str
    receiver: str
    name: str
    shapes: dict[str, list[int]]
    dtypes: dict[str, str]
    bytes: int


def payload_bytes(payload: Mapping[str, Tensor]) -> int:
    """Size of a payload on the wire: the raw bytes of its tensors (no framing overhead)."""
    return sum(t.numel() * t.element_size() for t in payload.values())


class Channel:
    """Moves ``dict[str, Tensor]`` payloads between named parties and records each transfer.

    ``send`` returns *detached clones*, so the receiver can never mutate or backpropagate
    into the sender's tensors: what arrives is a copy, as over a network.
    """

    def __init__(self) -> None:
        self._records: list[Record] = []

    def send(
        self, sender: str, receiver: str, name: str, payload: Mapping[str, Tensor], round: int
    ) -> dict[str, Tensor]:
        """Deliver ``payload`` from ``sender`` to ``receiver``; log it under ``name``/``round``.

        Returns the receiver's copy (detached clones of every tensor). Raises ``TypeError``
        for anything that is not a string-keyed mapping of tensors, so no Python object can
        slip across unlogged.
        """
        if sender == receiver:
            raise ValueError(f"a party cannot send to itself ({sender!r})")
        for key, value in payload.items():
            if not isinstance(key, str) or not isinstance(value, Tensor):
                raise TypeError(
                    f"payload {name!r} must map str to Tensor; key {key!r} holds {type(value).__name__}"
                )
        delivered = {k: v.detach().clone() for k, v in payload.items()}
        self._records.append(
            Record(
                round=int(round),
                sender=sender,
                receiver=receiver,
                name=name,
                shapes={k: list(v.shape) for k, v in delivered.items()},
                dtypes={k: str(v.dtype).removeprefix("torch.") for k, v in delivered.items()},
                bytes=payload_bytes(delivered),
            )
        )
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
        """Total bytes sent in each round that saw traffic, ordered by round."""
        totals: dict[int, int] = {}
        for r in sorted(self._records, key=lambda rec: rec.round):
            totals[r.round] = totals.get(r.round, 0) + r.bytes
        return totals

    @property
    def total_bytes(self) -> int:
        """Bytes sent over the whole run."""
        return sum(r.bytes for r in self._records)

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
        self._records = [Record(**r) for r in state["records"]]

