"""Complex query answering as a federated task (``federated.task: query_answering``).

Each party trains a :class:`~lightning_fedkg.methods.fedcqa.module.QueryAnsweringModule` on
queries sampled on its own graph and is evaluated in-graph (hard answers ranked among its
own entities, filtered; MRR and HR@1/3/10 per structure and their mean). Cross-graph test
queries are issued by the evaluator as keyed hashes and answered by distributed retrieval
(:mod:`.retrieval`), which this task adds to whatever strategy runs it
(:meth:`QueryAnswering.halves`). See docs/methods/fedcqa.md.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.tasks import Task
from lightning_fedkg.seeding import derive_seed

from .config import QueryTaskConfig, cache_dir, query_settings
from .entries import QUERY_METRICS, query_entry
from .module import QueryAnsweringModule, QueryBatches
from .query_sets import federated_query_sets, graph_query_sets, query_stats

__all__ = ["QueryAnswering", "QueryDataModule"]


class QueryDataModule(L.LightningDataModule):
    """A party's query sets (``{split: {type: QuerySet}}``, splits ``train``, ``valid``,
    ``test``) and its training batches: ``steps_per_epoch`` batches of one structure each
    per epoch (``batch_types``: how a batch's structure is drawn, ``task.batch_types``), drawn
    from a generator seeded by ``(seed, epoch)`` so a resumed run goes on with the batches it
    would have drawn."""

    def __init__(self, sets: dict, batch_size: int, steps_per_epoch: int, seed: int, batch_types: str = "size") -> None:
        super().__init__()
        self.sets = sets
        self.batch_size = batch_size
        self.num_train_batches = steps_per_epoch
        self.seed = seed
        self.batch_types = batch_types
        self.epoch = 0

    def train_dataloader(self) -> DataLoader:
        batches = QueryBatches(self.sets["train"], self.batch_size, derive_seed(self.seed, "train", str(self.epoch)),
                               steps=self.num_train_batches, types=self.batch_types)
        self.epoch += 1
        return DataLoader(batches, batch_size=None)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])


class QueryAnswering(Task):
    """Complex query answering: in-graph MRR / HR@k per party, cross-graph by retrieval."""

    name = "query_answering"
    metric_keys = QUERY_METRICS
    splits = ("val", "test")
    table_columns = (("MRR", "mrr"), ("HR@1", "hits@1"), ("HR@3", "hits@3"), ("HR@10", "hits@10"))
    config_class = QueryTaskConfig
    policy_keys = ("retrieval", "reveal_top")
    has_data_stats = True

    def build_module(self, cfg, kg):
        if cfg.trainer.compile:
            raise ConfigError("trainer.compile=true compiles the link-prediction (KGE) training losses whole; a "
                              "query encoder is not (GQE's L1 distances are compiled where trainer.compile is unset): "
                              "leave trainer.compile unset or false for task query_answering")
        if cfg.train.optimizer != "adam" or cfg.train.eval_candidates is not None:
            raise ConfigError("train.optimizer and train.eval_candidates configure the link-prediction (KGE) "
                              "learner; a query encoder trains with Adam and ranks every entity: leave them at "
                              "adam and null for task query_answering")
        tc = cfg.task
        options = {"gqe": {"gamma": tc.gamma}, "q2p": {"particles": tc.particles, "heads": tc.heads,
                                                        "dropout": tc.dropout}, "tree_lstm": {}, "gqe_fedngdb": {}}[tc.encoder]
        module = QueryAnsweringModule(kg.num_entities, 2 * kg.num_relations, encoder=tc.encoder, dim=cfg.model.dim,
                                      lr=cfg.train.lr, negatives=tc.negatives,
                                      eval_batch_size=cfg.train.eval_batch_size, loss=tc.loss,
                                      label_smoothing=tc.label_smoothing, weight_decay=tc.weight_decay,
                                      reset_optimizer=cfg.train.reset_optimizer, **options)
        if hasattr(module.encoder, "compile_distances"):  # GQE's L1 scores
            module.encoder.compile_distances = cfg.trainer.compile
            module.encoder.compile_on_cpu = cfg.trainer.compile_cpu
        return module

    def build_datamodule(self, cfg, kg, seed, party=None):
        tc = cfg.task
        # A client holds its share of the federation's queries; a central party the whole count.
        share = cfg.data.num_clients if party is None or party.startswith("client_") else 1
        sets = graph_query_sets(kg, query_settings(tc), share, cache_dir(tc), label=party or "graph")
        return QueryDataModule(sets, cfg.train.batch_size, tc.steps_per_epoch, seed, tc.batch_types)

    def evaluate(self, party, split):
        sets = party.datamodule.sets["valid" if split == "val" else split]
        result = party.module.evaluate(sets)
        return query_entry(result)

    def weight(self, kg, split):
        raise NotImplementedError("a query-answering party's weight is its number of evaluation queries "
                                  "(its entry's 'triples')")

    def train_size(self, kg):
        return 0  # a party's training examples are queries, counted by its datamodule

    def evaluation_data(self, cfg, fkg):
        from .retrieval import issue_cross_queries

        return issue_cross_queries(cfg, fkg)

    def table_rows(self, metrics):
        """The cross-graph test below the clients: one row per type and their mean."""
        cross = metrics.get("cross_graph")
        if not cross:
            return None
        rows = [(f"cross {name}", int(m["queries"]), m) for name, m in sorted(cross["by_type"].items())]
        rows.append(("cross mean", sum(n for _, n, _ in rows), cross))
        return "cross-graph queries (distributed retrieval, ranked among all entities)", rows

    def data_stats(self, cfg, fkg, workers=1):
        """The query sets of ``cfg`` (FedCQA's Tables 1–2): per set and split the queries of
        each type and their mean number of hard answers; those missing from the cache are
        sampled in ``workers`` processes."""
        settings = query_settings(cfg.task)  # task.query_set resolved: its types, not task.types
        stats = query_stats(federated_query_sets(fkg, settings, cache_dir(cfg.task), workers=workers))
        types = [t for t in settings.types if any(t in r for r in stats)]
        lines = ["", "queries per type (mean hard answers per query in parentheses)",
                 f"{'set':<12}{'split':<6}" + "".join(f"{t:>15}" for t in types)]
        for r in stats:
            cells = [f"{r[t]} ({r[f'{t}/hard']:.1f})" if t in r else "-" for t in types]
            lines.append(f"{r['set']:<12}{r['split']:<6}" + "".join(f"{c:>15}" for c in cells))
        return "\n".join(lines)

    def halves(self, server, client):
        from .retrieval import RetrievalServer
        from .retrieval_client import RetrievalClient

        return (type(f"Retrieval{server.__name__}", (RetrievalServer, server), {}),
                type(f"Retrieval{client.__name__}", (RetrievalClient, client), {}))
