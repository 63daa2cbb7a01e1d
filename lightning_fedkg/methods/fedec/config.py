"""The ``fedec`` method's config section(s)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_fedkg.config import Range

__all__ = ["FedECConfig"]


@dataclass
class FedECConfig:
    """``federated.fedec``: FedEC (Chen et al., "Federated Knowledge Graph Embedding with
    Embedding-Contrastive learning") on FedE's entity rows, FedLU's baseline (Zhu et al.,
    WWW 2023): each client adds ``−mu · log(e^{g} / (e^{g} + e^{p}))`` to its local loss, ``g``
    and ``p`` being the mean row-wise cosine similarity of its entity rows to the rows it
    received that round and to its own rows after its previous local fit, divided by
    ``temperature`` (FedLU's code: μ = 0.1, τ = 0.2)."""

    mu: float = field(default=0.1, metadata={"range": Range(min=0)})
    temperature: float = field(default=0.2, metadata={"range": Range(min=0, min_exclusive=True)})
