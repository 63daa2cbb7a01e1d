"""The ``task:`` section of the query-answering task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal

from lightning_fedkg.config import Range

__all__ = ["QueryTaskConfig"]


@dataclass
class QueryTaskConfig:
    """Complex query answering (``federated.task: query_answering``).

    The encoder (``gqe``, ``q2p``, ``tree_lstm``) works in ``model.dim`` dimensions with
    ``train.lr``, ``train.batch_size`` and ``train.eval_batch_size``; ``loss`` is the FedCQA
    code's label-smoothed ``softmax`` over all entities or KGReasoning's
    ``negative_sampling`` with ``negatives`` per query. ``gamma`` is GQE's margin,
    ``particles``, ``heads`` and ``dropout`` Q2P's. One local epoch is ``steps_per_epoch``
    batches. Query sets: ``types`` are evaluated, ``train_types`` trained on;
    ``train_per_type`` / ``eval_per_type`` count queries per structure for the whole graph
    (a client samples that divided by the number of clients on its own graph; a central
    party the whole count), ``cross_per_type`` cross-graph test queries per structure
    (on the union, relations of at least two clients). Sets are sampled with
    ``query_seed``, not the run's seed, so seeds share their queries; they are cached in
    ``cache_dir`` (default ``~/.cache/lightning_fedkg/queries``).
    """

    encoder: Literal["gqe", "q2p", "tree_lstm"] = "gqe"
    loss: Literal["softmax", "negative_sampling"] = "softmax"
    label_smoothing: float = field(default=0.1, metadata={"range": Range(min=0, max=1)})
    negatives: int = field(default=128, metadata={"range": Range(min=1)})
    weight_decay: float = field(default=0.0, metadata={"range": Range(min=0)})
    gamma: float = field(default=24.0, metadata={"range": Range(min=0, min_exclusive=True)})
    particles: int = field(default=2, metadata={"range": Range(min=1)})
    heads: int = field(default=1, metadata={"range": Range(min=1)})
    dropout: float = field(default=0.1, metadata={"range": Range(min=0, max=1)})
    steps_per_epoch: int = field(default=100, metadata={"range": Range(min=1)})
    types: List[str] = field(default_factory=lambda: ["1p", "2p", "3p", "2i", "3i", "ip", "pi", "2u", "up"])
    train_types: List[str] = field(default_factory=lambda: ["1p", "2p", "3p", "2i", "3i"])
    train_per_type: int = field(default=149_689, metadata={"range": Range(min=1)})
    eval_per_type: int = field(default=5_000, metadata={"range": Range(min=1)})
    cross_per_type: int = field(default=5_000, metadata={"range": Range(min=0)})
    query_seed: int = 0
    cache_dir: str = ""
