"""Tasks: what a party learns and how it is evaluated.

A :class:`Task` says which LightningModule and DataModule a party builds, how it is
evaluated on a split, which metrics it reports, which single number early stopping
watches (:attr:`Task.monitor`) and how parties are weighted in the federation-wide average
(:meth:`Task.weight`). :class:`LinkPrediction` is the default: filtered ranks among the
party's own entities, weighted by evaluation triples (FedE, Chen et al., IJCKG 2021, §3.1).
Tasks register in :data:`TASKS`; a config names one by ``federated.task`` (or an import path).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from lightning_fedkg.evaluation.ranking import METRIC_KEYS
from lightning_fedkg.registry import STRATEGIES, TASKS

if TYPE_CHECKING:
    from lightning_fedkg.config import ExperimentConfig

__all__ = ["Task", "LinkPrediction", "TASKS", "METRIC_KEYS", "weighted_average", "client_entry", "with_count"]



class Task:
    """Base class of tasks; subclasses implement every method.

    A task is all a :class:`~.party.Party` knows about what it learns: the module and the
    datamodule it builds, the splits it evaluates and how (:meth:`evaluate`), the metrics
    it reports and their table (:attr:`metric_keys`, :attr:`monitor`,
    :attr:`table_columns`), and how parties are weighted (:meth:`weight`,
    :meth:`train_size`).
    """

    name = "task"
    #: The metric early stopping maximises (after weighting).
    monitor = "mrr"
    #: Metric keys a party reports for a split.
    metric_keys: tuple[str, ...] = ()
    #: The splits :meth:`evaluate` takes (``val`` picks the best state, ``test`` reports it).
    splits: tuple[str, ...] = ("val", "test")
    #: ``(label, metric key)`` of the results table's columns; empty: every metric key.
    table_columns: tuple[tuple[str, str], ...] = ()
    #: Dataclass of the task's own ``task:`` config section, or None.
    config_class: type | None = None
    #: Keys of that section that decide what a client reveals (e.g. how query answers are
    #: retrieved): a client's policy pins them (:mod:`~lightning_fedkg.privacy.policy`).
    policy_keys: tuple[str, ...] = ()
    #: Whether the task builds data of its own beyond the graphs (the query task's query
    #: sets), which ``fedkg data stats -c CONFIG`` describes with :meth:`data_stats`.
    has_data_stats: bool = False

    def build_module(self, cfg: "ExperimentConfig", kg: Any):
        raise NotImplementedError

    def table_rows(self, metrics: dict) -> tuple[str, list[tuple[str, int, dict]]] | None:
        """``(title, [(label, #test, metrics)])`` that the results table shows below the
        clients for the task's own ``metrics.json`` blocks, or None (the default: nothing)."""
        return None

    @classmethod
    def format_report(cls, metrics: dict) -> str | None:
        """The whole table of a ``metrics.json`` whose layout is the task's own, or None (the
        default: the generic table, with :attr:`table_columns` and :meth:`table_rows`)."""
        return None

    def data_stats(self, cfg: "ExperimentConfig", fkg: Any, workers: int = 1) -> str:
        """Statistics of the data the task builds for ``cfg`` over the federation ``fkg``, which
        ``fedkg data stats -c`` prints below the clients (only if :attr:`has_data_stats`);
        ``workers``: processes it may build that data in (``--workers``)."""
        raise NotImplementedError

    def build_datamodule(self, cfg: "ExperimentConfig", kg: Any, seed: int, party: str | None = None):
        """The party's datamodule; ``party`` is its name (``client_<k>``, ``central``), for
        a task whose data depends on the party's role (query counts per client)."""
        raise NotImplementedError

    def evaluation_data(self, cfg: "ExperimentConfig", fkg: Any) -> Any:
        """What a trusted evaluator hands the server for evaluation stages of its own
        (default None; the query task's cross-graph test queries, as keyed hashes)."""
        return None

    def halves(self, server: type, client: type) -> tuple[type, type]:
        """The strategy's halves, extended with the task's own stages (default as they are;
        the query task adds distributed retrieval to whatever strategy runs it)."""
        return server, client

    def evaluate(self, party: Any, split: str) -> dict:
        """``{metric: float, "count": int, "triples": int}`` of ``party`` on ``split`` (``triples``
        is the weight of the party in the federation-wide average)."""
        raise NotImplementedError

    def weight(self, kg: Any, split: str) -> int:
        """A party's weight in the federation-wide average of ``split``."""
        raise NotImplementedError

    def train_size(self, kg: Any) -> int:
        """How many training examples a party holds (a round's ``examples``)."""
        raise NotImplementedError


class LinkPrediction(Task):
    """Filtered link prediction (MRR, MR, Hits@k) with a KGE module."""

    name = "link_prediction"
    metric_keys = METRIC_KEYS
    table_columns = (("MRR", "mrr"), ("H@1", "hits@1"), ("H@5", "hits@5"), ("H@10", "hits@10"))

    def build_module(self, cfg, kg):
        """A :class:`~lightning_fedkg.models.KGEModule`, or the learner the strategy asks for
        (:meth:`~lightning_fedkg.federated.strategy.Strategy.learner`)."""
        from lightning_fedkg.builders import build_module

        learner = STRATEGIES.get(cfg.federated.strategy).learner(cfg) if cfg.federated.strategy != "none" else None
        if learner is None:
            return build_module(cfg, kg.num_entities, kg.num_relations)
        module_class, extra = learner
        return build_module(cfg, kg.num_entities, kg.num_relations, module_class, **extra)

    def build_datamodule(self, cfg, kg, seed, party=None):
        """A :class:`~lightning_fedkg.data.KGDataModule` with ``cfg.train``'s settings, as the
        strategy prepares it (:meth:`~lightning_fedkg.federated.strategy.Strategy.prepare_datamodule`)."""
        from lightning_fedkg.builders import build_datamodule

        datamodule = build_datamodule(kg, cfg, seed=seed)
        if cfg.federated.strategy == "none":
            return datamodule
        return STRATEGIES.get(cfg.federated.strategy).prepare_datamodule(cfg, datamodule)

    def evaluate(self, party, split):
        party.run_evaluation(split)
        # KGEModule keeps the split's full result (the query count too) after each evaluation.
        return client_entry(party.module.last_metrics[split], self.weight(party.kg, split), self.metric_keys)

    def weight(self, kg, split):
        return int(kg.triples("valid" if split == "val" else split).shape[0])

    def train_size(self, kg):
        return int(kg.triples("train").shape[0])


def client_entry(metrics: dict, triples: int, keys=METRIC_KEYS) -> dict:
    """One party's ``metrics.json`` entry: the metric keys as floats, ``count``, ``triples``."""
    entry = {k: float(metrics[k]) for k in keys}
    entry["count"] = int(metrics.get("count", 0))
    entry["triples"] = int(triples)
    return entry


def weighted_average(entries, keys=METRIC_KEYS, weight_key: str = "triples") -> dict:
    """``Σ_k w_k m_k / Σ_k w_k`` per key over ``entries`` with ``w_k = entry[weight_key] > 0``
    (parties with no evaluation triples, or that failed, carry no weight)."""
    used = [e for e in entries if e.get(weight_key, 0) > 0]
    total = sum(e[weight_key] for e in used)
    if total == 0:
        return {k: math.nan for k in keys}
    return {k: sum(e[weight_key] * float(e[k]) for e in used) / total for k in keys}


def with_count(average: dict, entries) -> dict:
    """``metrics.json``'s ``"test"`` block: the weighted ``average`` plus ``count``, the
    number of ranked queries over ``entries``."""
    block = dict(average)
    block["count"] = int(sum(e.get("count", 0) for e in entries))
    return block
