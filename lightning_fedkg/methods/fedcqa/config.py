"""The ``task:`` section of the query-answering task."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Literal, Optional

from lightning_fedkg.config import ConfigError, Range

from .queries import STRUCTURES
from .query_sets import BETAE_TRAIN_TYPES, BETAE_TYPES, QUERY_SETS, QuerySettings

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

    The encoder (``gqe``, ``q2p``, ``tree_lstm``; ``gqe_fedngdb``, the FedCQA authors' code's
    GQE: dot-product scores, MLP intersection and union) works in ``model.dim`` dimensions with
    ``train.lr``, ``train.batch_size`` and ``train.eval_batch_size``; ``loss`` is the FedCQA
    code's label-smoothed ``softmax`` over the client's entities or KGReasoning's
    ``negative_sampling`` with ``negatives`` per query. ``gamma`` is GQE's margin,
    ``particles``, ``heads`` and ``dropout`` Q2P's. One local epoch is ``steps_per_epoch``
    batches, each of one structure: ``batch_types: size`` (default, KGReasoning's) draws it in
    proportion to its training set's size, ``uniform`` uniformly over the trained structures
    (the FedCQA code's). Query sets: ``query_set: betae`` (default) evaluates ``types`` and trains on
    ``train_types`` (by default BetaE's: nine evaluated, five trained on); ``query_set:
    paper`` is the FedCQA authors' set: eight types (no 3p), all trained on, and
    ``require_train_answer`` (valid, test and cross-graph queries need an answer on the
    training graph, as their sampler requires; default: the query set's, false for betae);
    ``train_per_type`` / ``eval_per_type`` count queries per structure for the whole graph
    (a client samples that divided by the number of clients on its own graph; a central
    party the whole count), ``cross_per_type`` cross-graph test queries per structure
    (on the union, relations of at least two clients); a set holds its count, or every
    query the graph has if fewer. Sets are sampled with
    ``query_seed``, not the run's seed, so seeds share their queries; they are cached in
    ``cache_dir`` (default ``~/.cache/lightning_fedkg/queries``).

    ``retrieval`` is how cross-graph queries are answered: ``private`` (default) seals the
    query states between clients and pads the score tables so that only a querying client
    (the first client) sees the combined scores and the server only each query's metrics
    (or ``fedkg query``'s top-k); ``paper`` is the paper's retrieval (§4.2, Eq. 5–6), states
    and score tables in clear at the server, which lets it rebuild every entity and relation
    row: for comparison only. ``reveal_top`` (default 10, at least 1) is how many answers,
    with their scores, the querier reveals for a query it has no answers to rank
    (``fedkg query --top`` sets it); the querier reads it from its own config, never from
    the server's message.
    """

    # "trained": what the run's state is (its parameters' shapes, its scores); `fedkg test
    # --from` refuses to override these (config.trained_differences).
    encoder: Literal["gqe", "q2p", "tree_lstm", "gqe_fedngdb"] = field(default="gqe", metadata={"trained": True})
    loss: Literal["softmax", "negative_sampling"] = "softmax"
    label_smoothing: float = field(default=0.1, metadata={"range": Range(min=0, max=1)})
    negatives: int = field(default=128, metadata={"range": Range(min=1)})
    weight_decay: float = field(default=0.0, metadata={"range": Range(min=0)})
    gamma: float = field(default=24.0, metadata={"range": Range(min=0, min_exclusive=True), "trained": True})
    particles: int = field(default=2, metadata={"range": Range(min=1), "trained": True})
    heads: int = field(default=1, metadata={"range": Range(min=1), "trained": True})
    dropout: float = field(default=0.1, metadata={"range": Range(min=0, max=1)})
    steps_per_epoch: int = field(default=100, metadata={"range": Range(min=1)})
    batch_types: Literal["size", "uniform"] = "size"
    query_set: Literal["betae", "paper"] = "betae"
    types: List[str] = field(default_factory=lambda: list(BETAE_TYPES))
    train_types: List[str] = field(default_factory=lambda: list(BETAE_TRAIN_TYPES))
    require_train_answer: Optional[bool] = None
    train_per_type: int = field(default=149_689, metadata={"range": Range(min=1)})
    eval_per_type: int = field(default=5_000, metadata={"range": Range(min=1)})
    cross_per_type: int = field(default=5_000, metadata={"range": Range(min=0)})
    query_seed: int = 0
    cache_dir: str = ""
    retrieval: Literal["private", "paper"] = "private"
    reveal_top: int = field(default=10, metadata={"range": Range(min=1)})


def default_cache_dir() -> Path:
    """Where query sets are cached unless ``task.cache_dir`` says otherwise."""
    return Path.home() / ".cache" / "lightning_fedkg" / "queries"


def query_settings(tc: QueryTaskConfig) -> QuerySettings:
    """The sampler settings of the ``task:`` section, ``query_set`` resolved."""
    unknown = [t for t in (*tc.types, *tc.train_types) if t not in STRUCTURES]
    if unknown:
        raise ConfigError(f"task.types / task.train_types: unknown query types {unknown}; "
                          f"valid: {', '.join(STRUCTURES)}")
    types, train_types, require = tuple(tc.types), tuple(tc.train_types), QUERY_SETS[tc.query_set][2]
    if tc.query_set != "betae":
        preset = QUERY_SETS[tc.query_set][:2]
        # the preset fixes both lists: types given beside it would be ignored, so they are refused
        if (types, train_types) not in ((BETAE_TYPES, BETAE_TRAIN_TYPES), preset):
            raise ConfigError(f"task.query_set: {tc.query_set} sets task.types to {list(preset[0])} and "
                              f"task.train_types to {list(preset[1])}; leave them out, or choose your own "
                              f"with task.query_set: betae")
        types, train_types = preset
    if tc.require_train_answer is not None:
        require = tc.require_train_answer
    return QuerySettings(types=types, train_types=train_types, train_per_type=tc.train_per_type,
                         eval_per_type=tc.eval_per_type, cross_per_type=tc.cross_per_type, seed=tc.query_seed,
                         require_train_answer=require)


def cache_dir(tc: QueryTaskConfig) -> Path:
    """The query-set cache folder of the ``task:`` section."""
    return Path(tc.cache_dir).expanduser() if tc.cache_dir else default_cache_dir()
