"""What parties exchange: named arrays, metrics and config, serialized to bytes.

A :class:`Message` mirrors Flower's ``RecordDict`` (an ``ArrayRecord``, a ``MetricRecord``
and a ``ConfigRecord``): a client can send trained rows *and* report validation metrics,
and a server can send rows *and* instructions (which split to evaluate). On the wire a
message is one `safetensors <https://huggingface.co/docs/safetensors>`_ buffer: the arrays
as tensors and the metrics/config as JSON in the header's metadata. safetensors holds only
raw tensor data and a JSON header, so decoding another party's bytes can never execute code
(unlike pickle), and the receiver always gets freshly allocated tensors.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save
from torch import Tensor

__all__ = ["Message", "encode", "decode", "tensor_bytes"]

_METRICS, _CONFIG = "fedkg.metrics", "fedkg.config"


@dataclass
class Message:
    """One transfer's content.

    Attributes:
        arrays: ``{name: Tensor}`` (embedding rows, masks, hashes, ...).
        metrics: ``{name: float | int}`` (validation MRR, number of examples, ...).
        config: JSON-able ``{name: value}`` (instructions: split to evaluate, epochs, ...).
    """

    arrays: dict[str, Tensor] = field(default_factory=dict)
    metrics: dict[str, float | int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, value in self.arrays.items():
            if not isinstance(key, str) or not isinstance(value, Tensor):
                raise TypeError(f"message arrays must map str to Tensor; key {key!r} holds {type(value).__name__}")
        for key, value in self.metrics.items():
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"message metrics must map str to a number; key {key!r} holds {value!r}")

    def is_empty(self) -> bool:
        """True when there is nothing to send."""
        return not (self.arrays or self.metrics or self.config)


def tensor_bytes(arrays: Mapping[str, Tensor]) -> int:
    """Raw bytes of the tensors (the traffic measure FedE's papers use; no framing)."""
    return sum(t.numel() * t.element_size() for t in arrays.values())


def encode(message: Message) -> bytes:
    """The safetensors bytes of ``message`` (tensors moved to CPU, made contiguous)."""
    arrays = {k: v.detach().to("cpu").contiguous() for k, v in message.arrays.items()}
    metadata = {_METRICS: json.dumps(message.metrics), _CONFIG: json.dumps(message.config)}
    return _st_save(arrays, metadata=metadata)


def decode(data: bytes) -> Message:
    """Rebuild a :class:`Message` from :func:`encode`'s bytes (new CPU tensors)."""
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    meta = header.get("__metadata__") or {}
    # safetensors hands tensors back in an order that varies between processes: sort by name
    # so logs and anything iterating over a message are reproducible.
    return Message(
        arrays=dict(sorted(_st_load(data).items())),
        metrics=json.loads(meta.get(_METRICS, "{}")),
        config=json.loads(meta.get(_CONFIG, "{}")),
    )

