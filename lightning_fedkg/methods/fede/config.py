"""The ``fede`` method's config section(s)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_fedkg.config import Range

__all__ = ["FedEConfig"]


@dataclass
class FedEConfig:
    """``federated.fede``: FedE's model fusion (Chen et al., IJCKG 2021, §2.2.3).

    ``fusion`` adds, after the run, a Single model per client (trained in
    ``<run_dir>/fusion_single``) and a 2→1 layer over the two models' scores fit on each
    client's validation triples (:mod:`lightning_fedkg.methods.fede.phase`);
    ``fusion_epochs``, ``fusion_lr``, ``fusion_margin`` (β) and ``fusion_negatives`` are that
    layer's Adam epochs, learning rate, ranking margin and tail negatives per validation
    triple (FedE: 500, 0.01, 10, 256). None of these changes what a round computes, so a
    finished run may be resumed with them changed.
    """

    fusion: bool = field(default=False, metadata={"resume": "free"})
    fusion_epochs: int = field(default=500, metadata={"range": Range(min=0), "resume": "free"})
    fusion_lr: float = field(default=0.01, metadata={"range": Range(min=0, min_exclusive=True), "resume": "free"})
    fusion_margin: float = field(default=10.0, metadata={"range": Range(min=0), "resume": "free"})
    fusion_negatives: int = field(default=256, metadata={"range": Range(min=1), "resume": "free"})
