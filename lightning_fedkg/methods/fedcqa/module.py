"""Complex query answering on one KG as a LightningModule (a plain ``Trainer`` trains it).

Each batch holds queries of one structure, every query with one of its answers as the
positive. ``loss="softmax"`` (the default, the FedCQA code's) is a label-smoothed
cross-entropy over every entity's score. ``loss="negative_sampling"`` follows KGReasoning
(its models.py): ``negatives`` uniformly drawn entities per query, and the loss

    L = ½ [Σ w_q (−log σ(s(pos))) + Σ w_q (−mean_j log σ(−s(neg_j)))] / Σ w_q,

with ``w_q = (4 + |answers(q)|)^(-1/2)``. A step's negatives and dropout
come from a seed its batch carries, not from the process's RNG. Evaluation ranks every hard
answer with the other answers filtered (:mod:`lightning_fedkg.methods.fedcqa.ranking`): MRR
and HR@1/3/10 per structure, and their mean over structures."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from lightning_fedkg.methods.fedcqa.encoders import GQE, Q2P, DeepSetsGQE, TreeLSTM
from lightning_fedkg.methods.fedcqa.queries import STRUCTURES, QuerySet, anchors_and_relations
from lightning_fedkg.methods.fedcqa.ranking import HITS, filtered_ranks, per_query_metrics
from lightning_fedkg.models.epoch_log import EpochMeanLogging
from lightning_fedkg.models.shareable import InitSpec, SharedGroup
from lightning_fedkg.seeding import derive_seed

__all__ = ["QueryBatches", "QueryAnsweringModule", "ENCODERS", "LOSSES"]

#: ``gqe_fedngdb`` is the FedCQA authors' code's "GQE" (dot-product scores, DeepSets ∩ and ∪).
ENCODERS = {"gqe": GQE, "q2p": Q2P, "tree_lstm": TreeLSTM, "gqe_fedngdb": DeepSetsGQE}
#: ``negative_sampling`` (KGReasoning's) or ``softmax`` (label-smoothed cross-entropy over
#: all entities, the FedCQA code's).
LOSSES = ("negative_sampling", "softmax")


class QueryBatches(IterableDataset):
    """Endless batches of training queries, each of one structure drawn in proportion to its
    set's size (``types="size"``) or uniformly over the structures (``"uniform"``):
    ``{"structure", "queries", "positive", "weight", "seed"}`` (use ``batch_size=None``);
    ``seed`` seeds the step's negatives and dropout (:meth:`QueryAnsweringModule.training_step`)."""

    def __init__(self, sets: dict[str, QuerySet], batch_size: int, seed: int = 0, steps: int | None = None,
                 types: str = "size") -> None:
        if types not in ("size", "uniform"):
            raise ValueError(f"types must be 'size' or 'uniform', not {types!r}")
        self.sets = {k: v for k, v in sets.items() if len(v)}
        self.batch_size = batch_size
        self.seed = seed
        self.steps = steps  # None: endless
        self.types = types

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        # A stream of its own: the batches drawn from ``generator`` stay what they were.
        noise = torch.Generator().manual_seed(derive_seed(self.seed, "batches", "noise"))
        names = sorted(self.sets)
        sizes = torch.tensor([len(self.sets[n]) if self.types == "size" else 1 for n in names], dtype=torch.float)
        step = 0
        while self.steps is None or step < self.steps:
            step += 1
            name = names[int(torch.multinomial(sizes, 1, generator=generator))]
            qs = self.sets[name]
            rows = torch.randint(len(qs), (self.batch_size,), generator=generator)
            counts = (qs.hard_offsets[rows + 1] - qs.hard_offsets[rows])
            pick = qs.hard_offsets[rows] + (torch.rand(rows.shape[0], generator=generator) * counts).long()
            yield {"structure": name, "queries": qs.queries[rows], "positive": qs.hard_ids[pick],
                   "weight": (4.0 + counts.float()).rsqrt(), "seed": int(torch.randint(2**62, (), generator=noise))}


class QueryAnsweringModule(EpochMeanLogging, L.LightningModule):
    """An encoder (``"gqe"``, ``"q2p"``, ``"tree_lstm"``, ``"gqe_fedngdb"``) over
    ``num_entities`` entities and ``num_relations`` relation ids (inverses included);
    ``encoder_options`` go to the encoder (GQE's ``gamma``, Q2P's ``particles``, ``heads``,
    ``dropout``). ``loss`` defaults to ``"softmax"``, as ``task.loss`` does."""

    def __init__(self, num_entities: int, num_relations: int, encoder: str = "gqe", dim: int = 400,
                 lr: float = 1e-4, negatives: int = 128, eval_batch_size: int = 256,
                 loss: str = "softmax", label_smoothing: float = 0.1, weight_decay: float = 0.0,
                 reset_optimizer: bool = True, **encoder_options) -> None:
        super().__init__()
        if encoder not in ENCODERS:
            raise ValueError(f"unknown query encoder {encoder!r}; valid: {', '.join(ENCODERS)}")
        if loss not in LOSSES:
            raise ValueError(f"unknown query loss {loss!r}; valid: {', '.join(LOSSES)}")
        self.save_hyperparameters()
        if num_relations % 2:
            raise ValueError(f"num_relations counts inverse ids too and must be even, got {num_relations}")
        self.encoder = ENCODERS[encoder](num_entities, num_relations, dim, **encoder_options)
        # A server draws fresh shared values from these: the tables' own init, and for the
        # operators the mean and variance of a twin built from a fixed seed (every party
        # must declare the same, whatever its number of entities).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            twin = ENCODERS[encoder](2, 2, dim, **encoder_options)
        self._init = {name: init_like(p) for name, p in twin.named_parameters()} | self.encoder.table_inits
        self.regularizers: list = []  # extra loss terms a federated method adds (FedProx-like)
        self._optimizer: torch.optim.Optimizer | None = None
        self._named: dict[str, Tensor] | None = None  # rows the batches named, while tracked

    def configure_optimizers(self):
        """AdamW, as the FedCQA and Q2P code train (``weight_decay`` 0 is Adam): a fresh one
        at every ``fit()`` with ``reset_optimizer``, else one that outlives the fits (a
        client's moments carry over rounds; checkpointed with the party)."""
        if self.hparams.reset_optimizer or self._optimizer is None:
            self._optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr,
                                                weight_decay=self.hparams.weight_decay)
        return self._optimizer

    def optimizer_state_dict(self) -> dict | None:
        """The state of an optimizer that outlives a ``fit()``; None with ``reset_optimizer``."""
        if self.hparams.reset_optimizer or self._optimizer is None:
            return None
        return self._optimizer.state_dict()

    def load_optimizer_state_dict(self, state: dict | None) -> None:
        """Restore the state :meth:`optimizer_state_dict` gave (None clears it)."""
        if state is None:
            self._optimizer = None
            return
        self.configure_optimizers().load_state_dict(state)

    def shareable_groups(self) -> dict[str, SharedGroup]:
        """``"entity"`` (the entity table, and Q2P's entity bias), ``"relation"`` (the
        relation table, a row per KG relation: its forward and inverse ids side by side)
        and ``"operators"`` (every other parameter, shared whole: the FedAvg'd networks)."""
        params = dict(self.encoder.named_parameters())
        entity = {n: params.pop(n) for n in ("entity_emb", "entity_bias") if n in params}
        relation = params.pop("relation_emb")
        # a view: writes into it land in the parameter
        relation_rows = relation.view(relation.shape[0] // 2, -1)
        return {
            "entity": SharedGroup(entity, "entity", {n: self._init[n] for n in entity}),
            "relation": SharedGroup({"relation_emb": relation_rows}, "relation", {"relation_emb": self._init["relation_emb"]}),
            "operators": SharedGroup(params, None, {n: self._init[n] for n in params}),
        }

    def track_named_rows(self) -> None:
        """From now on record which entity and relation rows the training batches name: a
        query's anchors and relations and its positive answer (``federated.aggregation=
        named_rows``, the FedCQA code's partial update; softmax candidates are not named)."""
        device = self.encoder.entity_emb.device
        self._named = {"entity": torch.zeros(self.hparams.num_entities, dtype=torch.bool, device=device),
                       "relation": torch.zeros(self.hparams.num_relations // 2, dtype=torch.bool, device=device)}

    def named_rows(self) -> dict[str, Tensor]:
        """``{"entity": BoolTensor[E], "relation": BoolTensor[R]}``: the rows named since
        :meth:`track_named_rows` (a relation row holds a relation's forward and inverse ids)."""
        if self._named is None:
            raise RuntimeError("named_rows() before track_named_rows()")
        return self._named

    def _record_named(self, batch: dict) -> None:
        anchors, relations = anchors_and_relations(STRUCTURES[batch["structure"]])
        queries = batch["queries"]
        self._named["entity"][queries[:, anchors].reshape(-1)] = True
        self._named["entity"][batch["positive"]] = True
        self._named["relation"][queries[:, relations].reshape(-1) // 2] = True

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        """The loss of one batch, its negatives and dropout drawn from the batch's ``seed``
        (without one, from the process's RNG). The process's RNG is left as it was: a client's
        training does not depend on which clients trained before it in the same process, or
        on anything else that drew from it (a run's result is the same with its clients side
        by side, ``federated.clients: ray``, and in a test process)."""
        if self._named is not None:
            self._record_named(batch)
        if "seed" not in batch:
            return self._loss(batch)
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(batch["seed"])
            return self._loss(batch)

    def _loss(self, batch: dict) -> Tensor:
        q = self.encoder.embed(batch["structure"], batch["queries"])
        b = q.shape[0]
        if self.hparams.loss == "softmax":
            # the FedCQA code's loss: every entity scored by the tied decoder, one answer the
            # label, smoothed
            loss = torch.nn.functional.cross_entropy(self.encoder.score(q), batch["positive"],
                                                     label_smoothing=self.hparams.label_smoothing)
            return self._logged(loss, b)
        negatives = torch.randint(self.encoder.entity_emb.shape[0], (b, self.hparams.negatives), device=q.device)
        pos = self.encoder.score_candidates(q, batch["positive"][:, None]).squeeze(1)
        neg = self.encoder.score_candidates(q, negatives)
        w = batch["weight"]
        positive_loss = -(w * torch.nn.functional.logsigmoid(pos)).sum() / w.sum()
        negative_loss = -(w * torch.nn.functional.logsigmoid(-neg).mean(1)).sum() / w.sum()
        return self._logged(0.5 * (positive_loss + negative_loss), b)

    def _logged(self, loss: Tensor, batch_size: int) -> Tensor:
        self.log_epoch_mean("train/loss", loss, batch_size)
        for term in self.regularizers:
            loss = loss + term()
        return loss

    @torch.no_grad()
    def evaluate(self, sets: dict[str, QuerySet]) -> dict:
        """``{"by_type": {structure: {"mrr", "hits@k", "queries"}}, "mrr", "hits@k"}`` (the
        overall numbers are means over structures, as FedCQA and KGReasoning report)."""
        was_training = self.training
        self.eval()  # no dropout while ranking
        try:
            return self._evaluate(sets)
        finally:
            self.train(was_training)

    def _evaluate(self, sets: dict[str, QuerySet]) -> dict:
        by_type = {}
        size = self.hparams.eval_batch_size
        for name, qs in sorted(sets.items()):
            if not len(qs):
                continue
            totals = {"mrr": 0.0, **{f"hits@{k}": 0.0 for k in HITS}}
            for start in range(0, len(qs), size):
                stop = min(start + size, len(qs))
                scores = self.encoder.score(self.encoder.embed(name, qs.queries[start:stop].to(self.device)))
                hard = _rows(qs.hard_offsets, start, stop)
                easy = _rows(qs.easy_offsets, start, stop)
                ranks = filtered_ranks(scores, hard.to(self.device), qs.hard_ids[qs.hard_offsets[start]:
                                                                            qs.hard_offsets[stop]].to(self.device),
                                       easy.to(self.device),
                                       qs.easy_ids[qs.easy_offsets[start]:qs.easy_offsets[stop]].to(self.device))
                metrics = per_query_metrics(ranks, hard.to(self.device), stop - start)
                for key in totals:
                    totals[key] += float(metrics[key].sum())
            by_type[name] = {key: value / len(qs) for key, value in totals.items()} | {"queries": len(qs)}
        keys = ["mrr", *[f"hits@{k}" for k in HITS]]
        overall = {key: sum(m[key] for m in by_type.values()) / max(len(by_type), 1) for key in keys}
        return {"by_type": by_type, **overall}


def init_like(p: Tensor) -> InitSpec:
    """A uniform :class:`InitSpec` with the mean and variance of ``p``'s values (a constant
    tensor, LayerNorm's ones, stays that constant)."""
    mean, std = float(p.detach().mean()), float(p.detach().std()) if p.numel() > 1 else 0.0
    half = 3 ** 0.5 * std  # a uniform on [m - h, m + h] has variance h^2 / 3
    return InitSpec("uniform", (mean - half, mean + half))


def _rows(offsets: Tensor, start: int, stop: int) -> Tensor:
    """Row ids (``0 .. stop-start-1``) of the CSR entries of rows ``start..stop-1``."""
    counts = offsets[start + 1:stop + 1] - offsets[start:stop]
    return torch.repeat_interleave(torch.arange(stop - start), counts)
