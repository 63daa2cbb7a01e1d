"""How our messages ride in Flower's: one ``ConfigRecord`` with a JSON head and our bytes.

A request or reply is ``RecordDict({"fedkg": ConfigRecord({"head": <JSON>, "payload":
<bytes>})})``: ``head`` says what to do (``kind``, ``stage``, ``round``, ...), ``payload`` is
:func:`~lightning_fedkg.federated.message.encode`'s safetensors buffer, unchanged (no
pickle crosses, as in-process). :func:`serialized_size` is what Flower puts on the wire
for the content (its own serialization of every nested record), which the wire log records.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["RECORD", "pack", "unpack", "serialized_size"]

RECORD = "fedkg"


def pack(head: dict[str, Any], payload: bytes = b""):
    """The ``RecordDict`` of ``head`` (JSON-able) and ``payload``."""
    from flwr.app import ConfigRecord, RecordDict

    return RecordDict({RECORD: ConfigRecord({"head": json.dumps(head), "payload": bytes(payload)})})


def unpack(content) -> tuple[dict[str, Any], bytes]:
    """``(head, payload)`` of a ``RecordDict`` made by :func:`pack`."""
    record = content[RECORD]
    return json.loads(record["head"]), bytes(record["payload"])


def serialized_size(content) -> int:
    """Bytes of Flower's serialization of ``content`` (every nested object it sends)."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return int(sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values()))
