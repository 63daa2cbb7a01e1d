"""The ``task:`` section of the query-answering task."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Literal

from lightning_fedkg.config import ConfigError, Range

from .queries import STRUCTURES
from .query_sets import QuerySettings

__all__ = ["QueryTaskConfig", "FedCQAConfig", "query_settings", "cache_dir", "default_cache_dir"]


@dataclass
class FedCQAConfig:
    """``federated.fedcqa``: how FedCQA keeps the entity rows from the server.

    ``secret: secure`` (default): Bonawitz-style secure aggregation with the aggregate
    hidden (``federated.secure_aggregation: {enabled: true, hide_aggregate: true}``): the
    server sees neither an upload nor the mean. ``secret: paper``: the paper's own scheme
    (Hu et al., FedCQA §4.1, Eq. 2–4, appendix A), kept for comparison: each client adds
    one static mask to its entity rows, every client can compute every other client's mask,
    and the server holder-averages the masked rows in clear; one client colluding with the
    server unmasks everyone (:mod:`~lightning_fedkg.methods.fedcqa.paper_secret`).
    """

    secret: Literal["secure", "paper"] = "secure"


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

    ``retrieval`` is how cross-graph queries are answered: ``private`` (default) seals the
    query states between clients and pads the score tables so that only a querying client
    (in evaluation the first client) sees the combined scores and the server only the ranks
    (or ``fedkg query``'s top-k); ``paper`` is the paper's retrieval (§4.2, Eq. 5–6), states
    and score tables in clear at the server, which lets it rebuild every entity and relation
    row: for comparison only.
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
    retrieval: Literal["private", "paper"] = "private"


def default_cache_dir() -> Path:
    """Where query sets are cached unless ``task.cache_dir`` says otherwise."""
    return Path.home() / ".cache" / "lightning_fedkg" / "queries"


def query_settings(tc: QueryTaskConfig) -> QuerySettings:
    """The sampler settings of the ``task:`` section."""
    unknown = [t for t in (*tc.types, *tc.train_types) if t not in STRUCTURES]
    if unknown:
        raise ConfigError(f"task.types / task.train_types: unknown query types {unknown}; "
                          f"valid: {', '.join(STRUCTURES)}")
    return QuerySettings(types=tuple(tc.types), train_types=tuple(tc.train_types),
                         train_per_type=tc.train_per_type, eval_per_type=tc.eval_per_type,
                         cross_per_type=tc.cross_per_type, seed=tc.query_seed)


def cache_dir(tc: QueryTaskConfig) -> Path:
    """The query-set cache folder of the ``task:`` section."""
    return Path(tc.cache_dir).expanduser() if tc.cache_dir else default_cache_dir()
