"""Modules declare what they may share: named groups of tensors, how rows are indexed,
and how a fresh row is initialised.

A federated strategy never reaches into a module's parameters by name prefix; it asks the
module for :class:`SharedGroup` objects by group name (``"entity"``, ``"relation"``, FedLU's
``"avatar"``, a CQA encoder's ``"operators"``) and moves only those. A second entity table
that a module does not declare (FedLU's local embeddings) therefore cannot leak with the
first, and nested sub-modules can be shared as easily as top-level tables.

Each tensor's initial value is described as data (:class:`InitSpec`), so a server can
build its own copy of a table from the declaration alone, without building the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch
from torch import Tensor, nn

__all__ = ["InitSpec", "SharedGroup", "ROW_INDEXES"]

#: What the rows of a shared tensor stand for; ``None`` means the tensor is not row-indexed.
ROW_INDEXES = ("entity", "relation", None)


@dataclass(frozen=True)
class InitSpec:
    """How to draw a fresh value of one row (or of a whole non-indexed tensor).

    ``kind``: ``"uniform"`` with ``params = (low, high)``, or ``"eye"`` with
    ``params = (rows, cols)``: the flattened ``rows × cols`` identity (TransR's projection
    matrices), identical for every row.
    """

    kind: str
    params: tuple[float, ...]

    def draw(self, u: Tensor) -> Tensor:
        """Values from ``u`` (uniform ``[0, 1)`` numbers shaped like the result)."""
        if self.kind == "uniform":
            low, high = self.params
            return low + (high - low) * u
        if self.kind == "eye":
            rows, cols = (int(p) for p in self.params)
            eye = torch.eye(rows, cols, dtype=u.dtype).reshape(-1)
            return eye.expand_as(u).clone()
        raise ValueError(f"unknown init kind {self.kind!r}")

    def to_json(self) -> list:
        return [self.kind, *self.params]

    @classmethod
    def from_json(cls, value: list) -> "InitSpec":
        return cls(str(value[0]), tuple(float(p) for p in value[1:]))


@dataclass
class SharedGroup:
    """A named set of parameters a module lets a strategy read and overwrite.

    Attributes:
        tensors: ``{wire name: Parameter}``.
        index: ``"entity"`` or ``"relation"`` when the first dimension runs over the
            party's entities/relations (so a server can align rows across parties), or
            ``None`` for tensors shared whole (operator networks).
        init: ``{wire name: InitSpec}`` for every tensor.
    """

    tensors: dict[str, nn.Parameter]
    index: str | None
    init: dict[str, InitSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.index not in ROW_INDEXES:
            raise ValueError(f"index must be one of {ROW_INDEXES}, got {self.index!r}")
        missing = set(self.tensors) - set(self.init)
        if missing:
            raise ValueError(f"no InitSpec for {sorted(missing)}")

    def read(self) -> dict[str, Tensor]:
        """Detached views of the tensors (a transport copies them on send)."""
        return {n: p.detach() for n, p in self.tensors.items()}

    @torch.no_grad()
    def write(self, arrays: Mapping[str, Tensor]) -> None:
        """Copy ``arrays`` into the tensors *in place* (a persistent optimizer stays bound).

        Every name must belong to the group and every shape must match exactly.
        """
        for name, value in arrays.items():
            if name not in self.tensors:
                raise KeyError(f"{name!r} is not in this shared group ({', '.join(self.tensors)})")
            target = self.tensors[name]
            if target.shape != value.shape:
                raise ValueError(f"{name!r} has shape {tuple(value.shape)}, the module's has {tuple(target.shape)}")
            target.copy_(value.to(device=target.device, dtype=target.dtype))

    def spec(self) -> dict:
        """The declaration as JSON-able data (sent to a server during alignment)."""
        return {
            "index": self.index,
            "tensors": {
                n: {"shape": list(p.shape[1:] if self.index else p.shape), "init": self.init[n].to_json()}
                for n, p in self.tensors.items()
            },
        }
