"""Negative samplers: which side of a positive triple is corrupted, and with which entities.

A sampler holds one strategy's settings; :class:`~.datamodule.KGDataModule` binds a copy
to its KG (:meth:`NegativeSampler.bind`) and asks it to corrupt each training batch
(:meth:`NegativeSampler.corrupt`), drawing from the generator and on the device the data
module gives, so a seed gives the same batches.

* :class:`UniformSampler`: the side is fixed per batch (tail, head, or both in turn);
* :class:`BernoulliSampler`: the side is drawn per triple (TransH's ``tph / (tph + hpt)``).

Entities are drawn uniformly, from all entities or a ``pool``. ``filtered`` redraws
per-triple negatives that form a train triple, or masks shared ones (``negative_mask``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from lightning_fedkg.keys import pack_keys

from .index import FilterIndex, searchsorted, sorted_contains
from .kg import KnowledgeGraph

__all__ = ["NegativeSampler", "UniformSampler", "BernoulliSampler", "bernoulli_head_probability",
           "CORRUPTIONS", "NEGATIVE_MODES", "FILTER_METHODS"]

CORRUPTIONS = ("tail", "head", "both")
NEGATIVE_MODES = ("per_triple", "shared")
FILTER_METHODS = ("auto", "index", "search")


def bernoulli_head_probability(triples: Tensor, num_relations: int) -> Tensor:
    """Per relation, the probability ``tph / (tph + hpt)`` of corrupting the head.

    Wang et al., "Knowledge Graph Embedding by Translating on Hyperplanes" (TransH),
    AAAI 2014, Sec. "Reducing false negative labels": ``tph`` is the average number of
    tails per distinct head of the relation, ``hpt`` the average number of heads per
    distinct tail. Relations without triples get 0.5.
    """
    t = torch.unique(triples.long(), dim=0)
    r = t[:, 1]
    count = torch.bincount(r, minlength=num_relations).double()
    heads = torch.bincount(torch.unique(t[:, [1, 0]], dim=0)[:, 0], minlength=num_relations).double()
    tails = torch.bincount(torch.unique(t[:, [1, 2]], dim=0)[:, 0], minlength=num_relations).double()
    tph = count / heads.clamp(min=1)
    hpt = count / tails.clamp(min=1)
    p = torch.where(count > 0, tph / (tph + hpt).clamp(min=1e-12), torch.full_like(count, 0.5))
    return p.float()


class NegativeSampler:
    """Draws the negatives of training batches; subclasses choose the corrupted side.

    Args:
        num_negatives: negatives per positive (``per_triple``) or per batch (``shared``).
        mode: ``"per_triple"`` or ``"shared"`` (one negative set per batch; with
            ``filtered`` the batch carries a ``"negative_mask"`` ``[B, n]`` instead of redrawing).
        filtered: resample negatives that form a known train triple (vectorized, at most
            ``max_filter_retries`` rounds; survivors of the last round are kept).
        max_filter_retries: bound on resampling rounds of ``filtered``.
        filter_method: how ``filtered`` finds the train triples among negatives:
            ``"index"`` gathers each batch's few known answers from the train CSR index
            (data-dependent sizes, cheap on a CPU; CPU only); ``"search"`` looks every
            candidate up in the sorted train keys with fixed shapes (nothing read back; more
            work on a CPU); ``"auto"`` (default): index on the CPU, search elsewhere
            (``scripts/benchmarks/bench_sampling.py``). Both reject the same negatives; per-triple
            redraws differ in which draws they use.
        pool: optional ``LongTensor`` of entity ids negatives are drawn from (default: all
            ``kg.num_entities`` ids).
    """

    def __init__(self, num_negatives: int = 256, mode: str = "per_triple", filtered: bool = False,
                 max_filter_retries: int = 10, filter_method: str = "auto", pool: Tensor | None = None) -> None:
        for label, value, allowed in (("negative_mode", mode, NEGATIVE_MODES),
                                      ("filter_method", filter_method, FILTER_METHODS)):
            if value not in allowed:
                raise ValueError(f"{label} must be one of {allowed}, got {value!r}")
        if num_negatives < 0:
            raise ValueError(f"num_negatives must be >= 0, got {num_negatives}")
        if pool is not None:
            pool = torch.as_tensor(pool).long().reshape(-1)
            if pool.numel() == 0:
                raise ValueError("negative_pool is empty")
        self.num_negatives = int(num_negatives)
        self.mode = mode
        self.filtered = bool(filtered)
        self.max_filter_retries = int(max_filter_retries)
        self.filter_method = filter_method
        self.pool = pool
        self._unbind()

    def _unbind(self) -> None:
        self.kg: KnowledgeGraph | None = None
        self.device = torch.device("cpu")
        self._resident: dict[str, Tensor] = {}  # device copies of what negatives are drawn and checked with
        self._train_index: FilterIndex | None = None

    def bind(self, kg: KnowledgeGraph) -> "NegativeSampler":
        """A copy of this sampler for ``kg``'s train triples (on the CPU): one sampler's
        settings can serve several data modules, each with its own indexes."""
        bound = copy.copy(self)
        bound._unbind()
        bound.kg = kg
        return bound

    # ---- what subclasses define ------------------------------------------------------------

    @property
    def sides(self) -> tuple[str, ...]:
        """The batch modes of one epoch, in turn: ``"tail"``/``"head"``, or ``"mixed"``."""
        raise NotImplementedError

    def head_mask(self, positive: Tensor, mode: str, generator: torch.Generator) -> Tensor:
        """``BoolTensor[B]``: which positives have their head corrupted (True) in a batch of ``mode``."""
        return torch.full((positive.shape[0],), mode == "head", dtype=torch.bool, device=self.device)

    # ---- sizes and indexes -------------------------------------------------------------------

    @property
    def num_entities(self) -> int:
        return self._kg.num_entities

    @property
    def num_relations(self) -> int:
        return self._kg.num_relations

    @property
    def _kg(self) -> KnowledgeGraph:
        if self.kg is None:
            raise RuntimeError(f"{type(self).__name__} is not bound to a KG: use sampler.bind(kg)")
        return self.kg

    @property
    def train_index(self) -> FilterIndex:
        """CSR index of the train triples (what ``filtered`` rejects)."""
        if self._train_index is None:
            self._train_index = FilterIndex(self._kg.triples("train"), self.num_entities, self.num_relations)
        return self._train_index

    def setup(self) -> None:
        """Build the indexes training needs (once)."""
        if self.filtered:
            _ = self.train_index

    def to_device(self, device: torch.device) -> None:
        """Draw on ``device`` from now on (the data module moves its generator itself)."""
        self.check_device(device)
        self.device = device
        self._resident.clear()

    def check_device(self, device: torch.device) -> None:
        """Refuse a device this sampler's settings cannot draw on."""
        if self.filter_method == "index" and device.type != "cpu":
            raise ValueError(f"filter_method='index' gathers known answers with the CPU's index; on {device} "
                             f"use 'search' or 'auto' (which picks 'search' off the CPU)")

    def _resident_tensor(self, name: str) -> Tensor:
        """``name`` (the sorted train keys, the pool, a subclass's tensors) on :attr:`device`,
        copied there once."""
        if name not in self._resident:
            self._resident[name] = self._source(name).to(self.device)
        return self._resident[name]

    def _source(self, name: str) -> Tensor:
        return {"train_keys": lambda: self.train_index.triple_keys, "pool": lambda: self.pool}[name]()

    # ---- drawing ---------------------------------------------------------------------------

    @property
    def _search_filter(self) -> bool:
        return self.filter_method == "search" or (self.filter_method == "auto" and self.device.type != "cpu")

    def _draw(self, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        if self.pool is None:
            return torch.randint(0, self.num_entities, shape, generator=generator, device=self.device)
        pool = self._resident_tensor("pool")
        idx = torch.randint(0, pool.numel(), shape, generator=generator, device=self.device)
        return pool[idx]

    def corrupt(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        """Add the negatives of ``batch`` (its ``"positive"`` and ``"mode"``): ``"negatives"``,
        with ``mode="mixed"`` a ``"head_mask"``, with shared filtered negatives a
        ``"negative_mask"``. Returns ``batch``."""
        positive, mode = batch["positive"], batch["mode"]
        head_mask = self.head_mask(positive, mode, generator)
        if mode == "mixed":
            batch["head_mask"] = head_mask
        if self.mode == "shared":
            batch["negatives"] = self._draw((self.num_negatives,), generator)
            if self.filtered:
                batch["negative_mask"] = self.shared_negative_mask(positive, head_mask, batch["negatives"])
        else:
            batch["negatives"] = self.sample_negatives(positive, head_mask, generator)
        return batch

    def is_train_triple(self, positive: Tensor, head_mask: Tensor, entities: Tensor) -> Tensor:
        """``BoolTensor[B, n]``: whether putting ``entities`` (``[B, n]``, or ``[n]`` shared by
        every row) in the corrupted side of each positive (its head where ``head_mask``)
        gives a train triple. Fixed shapes and a binary search in the sorted train keys: no
        value is read back to the host, on any device."""
        h, r, t = (positive[:, i].unsqueeze(1) for i in range(3))
        side = head_mask.unsqueeze(1)
        entities = entities.expand(positive.shape[0], -1)
        keys = pack_keys((torch.where(side, entities, h), r, torch.where(side, t, entities)),
                         (self.num_entities, self.num_relations, self.num_entities), "triples")
        return sorted_contains(self._resident_tensor("train_keys"), keys)

    def _forbidden_pairs(self, positive: Tensor, head_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(rows, entities)``: the entities that would turn a row's negative into a train
        triple (true heads of ``(?, r, t)`` / true tails of ``(h, r, ?)``)."""
        # (the CPU's path: reading the mask back costs nothing here)
        if not bool(head_mask.any()):
            return self.train_index.tail_answers(positive[:, 0], positive[:, 1])
        if bool(head_mask.all()):
            return self.train_index.head_answers(positive[:, 1], positive[:, 2])
        rows_t = (~head_mask).nonzero().flatten()
        rows_h = head_mask.nonzero().flatten()
        rt, ct = self.train_index.tail_answers(positive[rows_t, 0], positive[rows_t, 1])
        rh, ch = self.train_index.head_answers(positive[rows_h, 1], positive[rows_h, 2])
        return torch.cat([rows_t[rt], rows_h[rh]]), torch.cat([ct, ch])

    def _forbidden_keys(self, positive: Tensor, head_mask: Tensor) -> Tensor:
        """Sorted keys ``row * N + entity`` of :meth:`_forbidden_pairs`."""
        rows, cols = self._forbidden_pairs(positive, head_mask)
        return pack_keys((rows, cols), (positive.shape[0], self.num_entities)).sort().values

    def sample_negatives(self, positive: Tensor, head_mask: Tensor, generator: torch.Generator) -> Tensor:
        """``LongTensor[B, n]`` of per-triple negatives (filtered if ``filtered``).

        Filtering tests every negative against the batch's forbidden (row, entity) keys — a
        small sorted set gathered from the train CSR index, much faster to search than all
        train triples — then redraws only the rejected positions, at most
        ``max_filter_retries`` times.
        """
        neg = self._draw((positive.shape[0], self.num_negatives), generator)
        if not (self.filtered and neg.numel()):
            return neg
        if self._search_filter:
            # Redraw every position each time and keep the fresh draw where the old one was
            # a train triple: a fixed shape, so no count of rejections goes to the host.
            for _ in range(self.max_filter_retries):
                bad = self.is_train_triple(positive, head_mask, neg)
                neg = torch.where(bad, self._draw(neg.shape, generator), neg)
            return neg
        forbidden = self._forbidden_keys(positive, head_mask)
        flat = neg.view(-1)
        rows = torch.arange(positive.shape[0]).repeat_interleave(self.num_negatives)
        sizes = (positive.shape[0], self.num_entities)
        bad = sorted_contains(forbidden, pack_keys((rows, flat), sizes)).nonzero().flatten()
        for _ in range(self.max_filter_retries):
            if bad.numel() == 0:
                break
            flat[bad] = self._draw((bad.numel(),), generator)
            bad = bad[sorted_contains(forbidden, pack_keys((rows[bad], flat[bad]), sizes))]
        return neg

    def shared_negative_mask(self, positive: Tensor, head_mask: Tensor, negatives: Tensor) -> Tensor:
        """``BoolTensor[B, n]``: False where shared negative ``j`` would turn row ``i`` into a
        train triple. One shared set cannot be redrawn per row, so known positives are
        masked out of that row's loss instead (``kge_loss(negative_mask=...)``)."""
        if self._search_filter:
            return ~self.is_train_triple(positive, head_mask, negatives)
        # Mark each distinct query's known answers (the train CSR index gives them) in a
        # table through each entity's slot among the negatives (slot n: not a negative),
        # instead of testing all B x n pairs. Distinct queries, because a popular one (a
        # head query on a frequent tail, thousands of answers) recurs dozens of times in a
        # batch. An entity drawn twice gets one slot (its first place in sorted order), which
        # slot_of(negatives) hands to each of its positions. Slots come from a binary search
        # in the sorted negatives, not a table over all entities: a batch costs what it
        # draws and looks up, not the entity count.
        queries, inverse = torch.unique(self.train_index.query_rows(positive, head_mask), return_inverse=True)
        rows, cols = self.train_index.row_answers(queries)
        n = negatives.numel()
        ordered, order = torch.sort(negatives, stable=True)

        def slot_of(entities: Tensor) -> Tensor:
            at = searchsorted(ordered, entities).clamp_(max=n - 1)
            return torch.where(ordered[at] == entities, order[at], torch.full_like(at, n))

        # Built transposed: gathering whole rows of it is several times faster than
        # gathering columns of a [queries, n + 1] table.
        allowed = torch.ones(n + 1, queries.numel(), dtype=torch.bool)
        allowed[slot_of(cols), rows] = False
        return allowed[slot_of(negatives)].t().contiguous()[inverse]


class UniformSampler(NegativeSampler):
    """Corrupts one side per batch: ``corruption`` ``"tail"``, ``"head"`` or ``"both"``
    (every train triple once per side per epoch, tail and head batches in turn: the
    RotatE/FedLU scheme). Other arguments: :class:`NegativeSampler`."""

    def __init__(self, num_negatives: int = 256, corruption: str = "tail", **kwargs) -> None:
        if corruption not in CORRUPTIONS:
            raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}")
        super().__init__(num_negatives, **kwargs)
        self.corruption = corruption

    @property
    def sides(self) -> tuple[str, ...]:
        return ("tail", "head") if self.corruption == "both" else (self.corruption,)


class BernoulliSampler(NegativeSampler):
    """Corrupts each triple's head with probability ``tph / (tph + hpt)`` of its relation
    (TransH, Wang et al. 2014); batches have ``mode="mixed"`` and a ``head_mask``. Per-triple
    negatives only. Other arguments: :class:`NegativeSampler`."""

    def __init__(self, num_negatives: int = 256, **kwargs) -> None:
        super().__init__(num_negatives, **kwargs)
        if self.mode == "shared":
            raise ValueError("negative_mode='shared' draws one set per batch; it cannot be "
                             "combined with the Bernoulli sampler")

    def _unbind(self) -> None:
        super()._unbind()
        self._head_prob: Tensor | None = None

    @property
    def sides(self) -> tuple[str, ...]:
        return ("mixed",)

    @property
    def head_probability(self) -> Tensor:
        """Per-relation probability of corrupting the head."""
        if self._head_prob is None:
            self._head_prob = bernoulli_head_probability(self._kg.triples("train"), self.num_relations)
        return self._head_prob

    def setup(self) -> None:
        super().setup()
        _ = self.head_probability

    def _source(self, name: str) -> Tensor:
        return self.head_probability if name == "head_probability" else super()._source(name)

    def head_mask(self, positive: Tensor, mode: str, generator: torch.Generator) -> Tensor:
        probability = self._resident_tensor("head_probability")[positive[:, 1]]
        return torch.rand(positive.shape[0], generator=generator, device=self.device) < probability
