"""Lightning data module for one KG: training batches with negatives, filtered eval batches.

:class:`KGDataModule` yields training dicts (``positive`` ``[B, 3]``, ``negatives``
``[B, n]`` per triple or ``[n]`` shared, ``mode`` tail/head/mixed) and evaluation dicts
(``triples``, ``mode``, and the other true answers of each query as ``filter_row`` /
``filter_col``). Batches are made on the module's device (:meth:`KGDataModule.to_device`),
and every draw comes from ``dm.generator``, saved by ``state_dict()``, so a resumed run
draws the same batches. The batch layout and device rules are in docs/DESIGN.md.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from lightning_fedkg.keys import pack_keys, unpack_keys

from .kg import KnowledgeGraph, triple_keys

CORRUPTIONS = ("tail", "head", "both")
SAMPLERS = ("uniform", "bernoulli")
NEGATIVE_MODES = ("per_triple", "shared")
FILTER_METHODS = ("auto", "index", "search")
EVAL_SIDES = ("tail", "both")
VALID_FILTERS = ("all", "without_unlearn")


def searchsorted(sorted_keys: Tensor, query: Tensor) -> Tensor:
    """``torch.searchsorted`` (left), computed by numpy for CPU tensors.

    torch's CPU kernel always fans out to the intra-op thread pool; for the small batches
    of a data loader that costs far more than the search (measured 9.5 ms vs 0.02 ms for
    1k queries on a busy 2-core machine). numpy shares the memory, so nothing is copied.
    """
    if sorted_keys.device.type == "cpu" and query.device.type == "cpu":
        return torch.from_numpy(np.searchsorted(sorted_keys.numpy(), query.numpy()))
    return torch.searchsorted(sorted_keys, query)


class FilterIndex:
    """CSR index of the true answers of tail queries ``(h, r, ?)`` and head queries ``(?, r, t)``.

    Built once from a set of true triples: query keys (``h * R + r`` for tails,
    ``r * N + t`` for heads) are sorted and unique, ``offsets[k]:offsets[k + 1]`` delimits
    the sorted answers of key ``k`` in ``values``. Lookups for a batch are vectorized:
    ``searchsorted`` on the keys, then ``repeat_interleave`` over the answer counts.
    """

    def __init__(self, triples: Tensor, num_entities: int, num_relations: int) -> None:
        self.num_entities = int(num_entities)
        self.num_relations = int(num_relations)
        t = triples.long().reshape(-1, 3)
        keys = torch.unique(triple_keys(t, self.num_entities, self.num_relations))
        self.triple_keys = keys  # sorted: also serves membership tests
        n, r = self.num_entities, self.num_relations
        h_, rel_, t_ = unpack_keys(keys, (n, r, n))
        # Tail side: triple keys are sorted by (h, r) then t already.
        self._tail = self._csr(pack_keys((h_, rel_), (n, r)), t_)
        # Head side: sort by (r, t) then h.
        head_query = pack_keys((rel_, t_), (r, n))
        order = torch.sort(pack_keys((head_query, h_), (r * n, n))).indices
        self._head = self._csr(head_query[order], h_[order])
        self._rows: tuple[Tensor, Tensor] | None = None  # built by row_answers on first use

    @staticmethod
    def _csr(query_keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        uniq, counts = torch.unique_consecutive(query_keys, return_counts=True)
        offsets = torch.zeros(uniq.numel() + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(counts, 0)
        return uniq, offsets, values.contiguous()

    @staticmethod
    def _gather(index: tuple[Tensor, Tensor, Tensor], query: Tensor) -> tuple[Tensor, Tensor]:
        keys, offsets, values = index
        if keys.numel() == 0 or query.numel() == 0:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty.clone()
        pos = searchsorted(keys, query).clamp_(max=keys.numel() - 1)
        found = keys[pos] == query
        start = offsets[pos]
        count = torch.where(found, offsets[pos + 1] - start, torch.zeros_like(start))
        return _expand(values, start, count)

    @staticmethod
    def _query_rows(index: tuple[Tensor, Tensor, Tensor], query: Tensor, first: int, none: int) -> Tensor:
        keys = index[0]
        if keys.numel() == 0:
            return torch.full_like(query, none)
        pos = searchsorted(keys, query).clamp_(max=keys.numel() - 1)
        return torch.where(keys[pos] == query, pos + first, torch.full_like(pos, none))

    def query_rows(self, triples: Tensor, head_side: Tensor) -> Tensor:
        """``[B]``: the row of each triple's query among all queries of the index — its head
        query ``(?, r, t)`` where ``head_side``, else its tail query ``(h, r, ?)`` — for
        :meth:`row_answers`. Tail queries come first, then head queries; a query with no
        true answer gets the empty row at the end. Equal queries get equal rows."""
        n, r = self.num_entities, self.num_relations
        num_tail = self._tail[0].numel()
        none = num_tail + self._head[0].numel()
        any_head, all_head = bool(head_side.any()), bool(head_side.all())
        tails = None if all_head else self._query_rows(
            self._tail, pack_keys((triples[:, 0], triples[:, 1]), (n, r)), 0, none)
        heads = None if not any_head else self._query_rows(
            self._head, pack_keys((triples[:, 1], triples[:, 2]), (r, n)), num_tail, none)
        return tails if heads is None else heads if tails is None else torch.where(head_side, heads, tails)

    def row_answers(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """The true answers of the queries ``rows`` (from :meth:`query_rows`) as
        (position in ``rows``, entity) pairs."""
        if self._rows is None:  # both sides' answers in one CSR, plus the empty row
            tail_offsets, head_offsets = self._tail[1], self._head[1]
            offsets = torch.cat([tail_offsets, head_offsets[1:] + tail_offsets[-1]])
            offsets = torch.cat([offsets, offsets[-1:]])
            self._rows = offsets, torch.cat([self._tail[2], self._head[2]])
        offsets, values = self._rows
        start = offsets[rows]
        return _expand(values, start, offsets[rows + 1] - start)

    def tail_answers(self, heads: Tensor, relations: Tensor) -> tuple[Tensor, Tensor]:
        """All true tails of the queries ``(heads[i], relations[i], ?)`` as (row, entity) pairs."""
        return self._gather(self._tail, pack_keys((heads, relations), (self.num_entities, self.num_relations)))

    def head_answers(self, relations: Tensor, tails: Tensor) -> tuple[Tensor, Tensor]:
        """All true heads of the queries ``(?, relations[i], tails[i])`` as (row, entity) pairs."""
        return self._gather(self._head, pack_keys((relations, tails), (self.num_relations, self.num_entities)))

    def answers(self, triples: Tensor, mode: str) -> tuple[Tensor, Tensor]:
        """True answers of each row's tail (``mode="tail"``) or head query."""
        if mode == "tail":
            return self.tail_answers(triples[:, 0], triples[:, 1])
        if mode == "head":
            return self.head_answers(triples[:, 1], triples[:, 2])
        raise ValueError(f"mode must be 'tail' or 'head', got {mode!r}")

    def filter_pairs(self, triples: Tensor, mode: str) -> tuple[Tensor, Tensor]:
        """Like :meth:`answers` without each row's own target (the pairs to exclude)."""
        row, col = self.answers(triples, mode)
        target = triples[:, 2] if mode == "tail" else triples[:, 0]
        keep = col != target[row]
        return row[keep], col[keep]

    def contains(self, triples: Tensor) -> Tensor:
        """``BoolTensor[E]``: whether each triple is in the index."""
        q = triple_keys(triples.reshape(-1, 3), self.num_entities, self.num_relations)
        return sorted_contains(self.triple_keys, q)

    def __len__(self) -> int:
        return self.triple_keys.numel()


def _expand(values: Tensor, start: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """``(row, values[start[row] + k])`` for ``k < count[row]``: the CSR slices of each row."""
    total = int(count.sum())
    row = torch.repeat_interleave(torch.arange(start.numel()), count, output_size=total)
    # answer k of the output is values[start[row] + (k - first output of its row)]
    shift = torch.repeat_interleave(start - (torch.cumsum(count, 0) - count), count, output_size=total)
    return row, values[shift + torch.arange(total)]


def sorted_contains(sorted_keys: Tensor, query: Tensor) -> Tensor:
    """Membership of ``query`` (any shape) in the sorted 1-D ``sorted_keys``."""
    if sorted_keys.numel() == 0:
        return torch.zeros_like(query, dtype=torch.bool)
    pos = searchsorted(sorted_keys, query.reshape(-1)).clamp_(max=sorted_keys.numel() - 1)
    return (sorted_keys[pos] == query.reshape(-1)).view(query.shape)


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


class _TrainBatches(IterableDataset):
    def __init__(self, dm: "KGDataModule") -> None:
        self.dm = dm

    def __len__(self) -> int:
        return math.ceil(self.dm.num_train_batches / self.dm.batches_per_step)

    def __iter__(self) -> Iterator[dict | list[dict]]:
        k = self.dm.batches_per_step
        if k == 1:
            return self.dm._train_epoch()
        return _groups(self.dm._train_epoch(), k)


def _groups(batches: Iterator[dict], k: int) -> Iterator[list[dict]]:
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == k:
            yield group
            group = []
    if group:
        yield group


class _EvalBatches(IterableDataset):
    def __init__(self, triples: Tensor, index: FilterIndex, batch_size: int, sides: tuple[str, ...]):
        self.triples, self.index, self.batch_size, self.sides = triples, index, batch_size, sides

    def __len__(self) -> int:
        return math.ceil(self.triples.shape[0] / self.batch_size) * len(self.sides)

    def __iter__(self) -> Iterator[dict]:
        if self.triples.shape[0] == 0:  # torch.split would yield one empty chunk
            return
        for mode in self.sides:
            for chunk in torch.split(self.triples, self.batch_size):
                row, col = self.index.filter_pairs(chunk, mode)
                yield {"triples": chunk, "mode": mode, "filter_row": row, "filter_col": col}


def subsampling_weights(triples: Tensor, num_entities: int, num_relations: int) -> Tensor:
    """``[n]`` frequency weights ``1 / sqrt(c(h, r) + c(t, r⁻¹))`` of ``triples``.

    ``c(h, r)`` is 3 plus the number of triples with head ``h`` and relation ``r``, and
    ``c(t, r⁻¹)`` 3 plus the number with tail ``t`` and relation ``r``: the counts of the
    RotatE code (Sun et al., ICLR 2019), which start every key at 4 on its first
    occurrence, and which FedLU's code inherits (its default, ``uni_weight`` off). Triples
    of frequent (entity, relation) pairs weigh less, like word2vec's subsampling.
    """
    triples = torch.as_tensor(triples).long()
    if triples.numel() == 0:
        return torch.zeros(0)
    head_keys = triples[:, 0] * num_relations + triples[:, 1]
    tail_keys = triples[:, 2] * num_relations + triples[:, 1]
    _, head_slot, head_count = torch.unique(head_keys, return_inverse=True, return_counts=True)
    _, tail_slot, tail_count = torch.unique(tail_keys, return_inverse=True, return_counts=True)
    count = head_count[head_slot] + tail_count[tail_slot] + 6
    return count.double().rsqrt().float()


class KGDataModule(LightningDataModule):
    """Training and filtered-evaluation loaders for one :class:`KnowledgeGraph`.

    Args:
        kg: the graph (train split for training, valid/test for evaluation).
        batch_size: positives per training batch.
        num_negatives: negatives per positive (``per_triple``) or per batch (``shared``).
        corruption: ``"tail"``, ``"head"`` or ``"both"``; ``"both"`` visits every train
            triple once per side per epoch, alternating tail and head batches (the
            RotatE/FedLU scheme). Ignored by the Bernoulli sampler, which picks the side.
        negative_sampler: ``"uniform"`` or ``"bernoulli"`` (side per triple with
            probability ``tph / (tph + hpt)`` of corrupting the head; TransH, Wang et al.
            2014). Bernoulli batches have ``mode="mixed"`` and a ``head_mask``.
        negative_mode: ``"per_triple"`` or ``"shared"`` (one negative set per batch; not
            combinable with ``bernoulli``; with ``filter_negatives`` the batch carries a
            ``"negative_mask"`` ``[B, n]`` instead of redrawing).
        filter_negatives: resample negatives that form a known train triple (vectorized,
            at most ``max_filter_retries`` rounds; survivors of the last round are kept).
        eval_batch_size: queries per evaluation batch.
        eval_sides: ``"tail"`` (FedE protocol) or ``"both"``.
        seed: seed of ``dm.generator``.
        filter_triples: the true triples used to filter evaluation; default
            ``kg.all_true_triples()`` (train ∪ valid ∪ test).
        negative_pool: optional ``LongTensor`` of entity ids negatives are drawn from
            (default: all ``kg.num_entities`` ids).
        max_filter_retries: bound on resampling rounds of ``filter_negatives``.
        shuffle: shuffle the train triples each epoch.
        subsampling: give each training batch a ``"weight"`` ``[B]`` of frequency weights
            (:func:`subsampling_weights`; RotatE's and FedLU's code), which the losses use
            for a weighted instead of a plain mean over the batch.
        fixed_negatives: draw one epoch of batches (order, sides and negatives) once and
            replay it in every later epoch and round, as the official FedLU code does
            (its client.py materialises its loaders into a list in ``init_model``). Off by
            default: fresh negatives each epoch see more of the entity table. The epoch is
            drawn lazily, batch by batch, from a generator seeded with ``seed`` (not
            ``dm.generator``) and kept in memory: with ``per_triple`` negatives that is
            8 bytes for each of the ``n_train · sides · num_negatives`` negative ids.
        valid_filter: ``"all"`` filters validation like the test (``filter_triples``);
            ``"without_unlearn"`` leaves the KG's ``unlearn`` triples out of the
            validation filter, as the official FedLU client does (its validation loaders
            use train ∪ valid ∪ test minus unlearn; the test keeps the full filter). For
            parity only: validation then ranks some queries against known true triples.
        filter_method: how ``filter_negatives`` finds the train triples among negatives:
            ``"index"`` gathers each batch's few known answers from the train CSR index
            (data-dependent sizes, cheap on a CPU; CPU only: :meth:`to_device` refuses
            another device);
            ``"search"`` looks every candidate up in the sorted train keys with fixed
            shapes (nothing read back; more work on a CPU); ``"auto"`` (default): index
            on the CPU, search elsewhere (``scripts/bench_sampling.py``). Both reject the
            same negatives; per-triple redraws differ in which draws they use.
        batches_per_step: the train loader yields lists of this many batches (the last
            one shorter), one Lightning step each; :class:`~lightning_fedkg.models.KGEModule`
            takes one optimizer step per batch of a list. 1 (default): plain batches.
    """

    def __init__(
        self,
        kg: KnowledgeGraph,
        batch_size: int = 512,
        num_negatives: int = 256,
        corruption: str = "tail",
        negative_sampler: str = "uniform",
        negative_mode: str = "per_triple",
        filter_negatives: bool = False,
        eval_batch_size: int = 256,
        eval_sides: str = "both",
        seed: int = 0,
        filter_triples: Tensor | None = None,
        negative_pool: Tensor | None = None,
        max_filter_retries: int = 10,
        shuffle: bool = True,
        subsampling: bool = False,
        fixed_negatives: bool = False,
        valid_filter: str = "all",
        filter_method: str = "auto",
        batches_per_step: int = 1,
    ) -> None:
        super().__init__()
        for label, value, allowed in (("corruption", corruption, CORRUPTIONS),
                                      ("negative_sampler", negative_sampler, SAMPLERS),
                                      ("negative_mode", negative_mode, NEGATIVE_MODES),
                                      ("eval_sides", eval_sides, EVAL_SIDES),
                                      ("valid_filter", valid_filter, VALID_FILTERS),
                                      ("filter_method", filter_method, FILTER_METHODS)):
            if value not in allowed:
                raise ValueError(f"{label} must be one of {allowed}, got {value!r}")
        if negative_mode == "shared" and negative_sampler == "bernoulli":
            raise ValueError("negative_mode='shared' draws one set per batch; it cannot be "
                             "combined with the Bernoulli sampler")
        if batch_size < 1 or eval_batch_size < 1 or num_negatives < 0 or batches_per_step < 1:
            raise ValueError("batch sizes and batches_per_step must be >= 1 and num_negatives >= 0")
        self.kg = kg
        self.batch_size = int(batch_size)
        self.num_negatives = int(num_negatives)
        self.corruption = corruption
        self.negative_sampler = negative_sampler
        self.negative_mode = negative_mode
        self.filter_negatives = bool(filter_negatives)
        self.eval_batch_size = int(eval_batch_size)
        self.eval_sides = eval_sides
        self.seed = int(seed)
        self.max_filter_retries = int(max_filter_retries)
        self.shuffle = bool(shuffle)
        self.subsampling = bool(subsampling)
        self.fixed_negatives = bool(fixed_negatives)
        self.valid_filter = valid_filter
        self.filter_method = filter_method
        self.batches_per_step = int(batches_per_step)
        self._valid_filter_index: FilterIndex | None = None
        # (batches drawn so far, the iterator still drawing the rest of the fixed epoch)
        self._fixed_epoch: tuple[list[dict], Iterator[dict]] | None = None
        self._train_weights: Tensor | None = None
        self._filter_triples = filter_triples
        if negative_pool is not None:
            negative_pool = torch.as_tensor(negative_pool).long().reshape(-1)
            if negative_pool.numel() == 0:
                raise ValueError("negative_pool is empty")
        self.negative_pool = negative_pool
        self.device = torch.device("cpu")
        self.generator = torch.Generator().manual_seed(self.seed)
        self._resident: dict[str, Tensor] = {}  # device copies of what training batches are cut from
        self._filter_index: FilterIndex | None = None
        self._train_index: FilterIndex | None = None
        self._head_prob: Tensor | None = None

    # ---- sizes -------------------------------------------------------------------------

    @property
    def num_entities(self) -> int:
        return self.kg.num_entities

    @property
    def num_relations(self) -> int:
        return self.kg.num_relations

    @property
    def _train_sides(self) -> tuple[str, ...]:
        if self.negative_sampler == "bernoulli":
            return ("mixed",)
        return ("tail", "head") if self.corruption == "both" else (self.corruption,)

    @property
    def num_train_batches(self) -> int:
        """Training batches per epoch."""
        n = self.kg.triples("train").shape[0]
        return math.ceil(n / self.batch_size) * len(self._train_sides)

    # ---- lazily built indexes (setup() is cheap and idempotent) -------------------------

    @property
    def filter_index(self) -> FilterIndex:
        """CSR index of the evaluation filter set (``filter_triples``)."""
        if self._filter_index is None:
            self._filter_index = FilterIndex(self._evaluation_truth(), self.num_entities, self.num_relations)
        return self._filter_index

    def _evaluation_truth(self) -> Tensor:
        """The triples the evaluation filters: ``filter_triples``, else train ∪ valid ∪ test."""
        if self._filter_triples is None:
            return self.kg.all_true_triples()
        return torch.as_tensor(self._filter_triples).long()

    @property
    def valid_filter_index(self) -> FilterIndex:
        """The validation filter: :attr:`filter_index`, or with ``valid_filter="without_unlearn"``
        the same set without the KG's ``unlearn`` triples."""
        if self.valid_filter == "all" or "unlearn" not in self.kg.split_names:
            return self.filter_index
        if self._valid_filter_index is None:
            kg, triples = self.kg, self._evaluation_truth()
            unlearn = triple_keys(kg.triples("unlearn"), kg.num_entities, kg.num_relations)
            keep = ~torch.isin(triple_keys(triples, kg.num_entities, kg.num_relations), unlearn)
            self._valid_filter_index = FilterIndex(triples[keep], self.num_entities, self.num_relations)
        return self._valid_filter_index

    @property
    def train_index(self) -> FilterIndex:
        """CSR index of the train triples (what ``filter_negatives`` rejects)."""
        if self._train_index is None:
            self._train_index = FilterIndex(self.kg.triples("train"), self.num_entities,
                                            self.num_relations)
        return self._train_index

    @property
    def train_weights(self) -> Tensor:
        """``[n_train]`` subsampling weights of the train triples (see :func:`subsampling_weights`)."""
        if self._train_weights is None:
            self._train_weights = subsampling_weights(self.kg.triples("train"), self.num_entities,
                                                      self.num_relations)
        return self._train_weights

    @property
    def head_probability(self) -> Tensor:
        """Bernoulli sampler: per-relation probability of corrupting the head."""
        if self._head_prob is None:
            self._head_prob = bernoulli_head_probability(self.kg.triples("train"), self.num_relations)
        return self._head_prob

    def setup(self, stage: str | None = None) -> None:
        """Build the indexes the stage needs (once; later calls do nothing)."""
        if stage in (None, "fit"):
            if self.filter_negatives:
                _ = self.train_index
            if self.negative_sampler == "bernoulli":
                _ = self.head_probability
        if stage in (None, "fit", "validate", "test"):
            _ = self.filter_index

    # ---- the device training batches are made on ------------------------------------------

    def to_device(self, device: torch.device | str) -> "KGDataModule":
        """Make training batches on ``device`` from now on (returns ``self``).

        The generator moves with them: a new one on ``device``, seeded from the old one's
        next draw (deterministic), so call this before training, as ``Party`` does. Moving
        to the device the module is already on changes nothing.
        """
        device = torch.device(device)
        if self.filter_method == "index" and device.type != "cpu":
            raise ValueError(f"filter_method='index' gathers known answers with the CPU's index; on {device} "
                             f"use 'search' or 'auto' (which picks 'search' off the CPU)")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device == self.device:
            return self
        seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.device = device
        self._resident.clear()
        self._fixed_epoch = None
        return self

    def _resident_tensor(self, name: str) -> Tensor:
        """``name`` (train triples, their weights, the Bernoulli probabilities, the sorted
        train keys, the negative pool) on :attr:`device`, copied there once."""
        if name not in self._resident:
            source = {"train": lambda: self.kg.triples("train").long(),
                      "weights": lambda: self.train_weights,
                      "head_probability": lambda: self.head_probability,
                      "train_keys": lambda: self.train_index.triple_keys,
                      "pool": lambda: self.negative_pool}[name]()
            self._resident[name] = source.to(self.device)
        return self._resident[name]

    # ---- negative sampling ------------------------------------------------------------

    @property
    def _search_filter(self) -> bool:
        return self.filter_method == "search" or (self.filter_method == "auto" and self.device.type != "cpu")

    def _draw(self, shape: tuple[int, ...], generator: torch.Generator | None = None) -> Tensor:
        generator = self.generator if generator is None else generator
        if self.negative_pool is None:
            return torch.randint(0, self.num_entities, shape, generator=generator, device=self.device)
        pool = self._resident_tensor("pool")
        idx = torch.randint(0, pool.numel(), shape, generator=generator, device=self.device)
        return pool[idx]

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

    def sample_negatives(self, positive: Tensor, head_mask: Tensor,
                         generator: torch.Generator | None = None) -> Tensor:
        """``LongTensor[B, n]`` of per-triple negatives (filtered if ``filter_negatives``).

        Filtering tests every negative against the batch's forbidden (row, entity) keys — a
        small sorted set gathered from the train CSR index, much faster to search than all
        train triples — then redraws only the rejected positions, at most
        ``max_filter_retries`` times. Draws from ``generator`` (default ``dm.generator``).
        """
        neg = self._draw((positive.shape[0], self.num_negatives), generator)
        if not (self.filter_negatives and neg.numel()):
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
        # batch. An entity drawn twice gets one slot, which slot[negatives] hands to each
        # of its positions.
        queries, inverse = torch.unique(self.train_index.query_rows(positive, head_mask), return_inverse=True)
        rows, cols = self.train_index.row_answers(queries)
        n = negatives.numel()
        slot = torch.full((self.num_entities,), n, dtype=torch.long)
        slot[negatives] = torch.arange(n)
        # Built transposed: gathering whole rows of it is several times faster than
        # gathering columns of a [queries, n + 1] table.
        allowed = torch.ones(n + 1, queries.numel(), dtype=torch.bool)
        allowed[slot[cols], rows] = False
        return allowed[slot[negatives]].t().contiguous()[inverse]

    def make_batch(self, positive: Tensor, mode: str, weight: Tensor | None = None,
                   generator: torch.Generator | None = None) -> dict:
        """One training batch for ``positive`` triples; ``mode`` is tail, head or mixed;
        ``weight`` (``[B]``, optional) is passed on as the batch's ``"weight"``; randomness
        from ``generator`` (default ``dm.generator``)."""
        generator = self.generator if generator is None else generator
        b = positive.shape[0]
        batch: dict[str, Any] = {"positive": positive, "mode": mode}
        if weight is not None:
            batch["weight"] = weight
        if mode == "mixed":
            probability = self._resident_tensor("head_probability")[positive[:, 1]]
            head_mask = torch.rand(b, generator=generator, device=self.device) < probability
            batch["head_mask"] = head_mask
        else:
            head_mask = torch.full((b,), mode == "head", dtype=torch.bool, device=self.device)
        if self.negative_mode == "shared":
            batch["negatives"] = self._draw((self.num_negatives,), generator)
            if self.filter_negatives:
                batch["negative_mask"] = self.shared_negative_mask(positive, head_mask, batch["negatives"])
        else:
            batch["negatives"] = self.sample_negatives(positive, head_mask, generator)
        return batch

    def _draw_epoch(self, generator: torch.Generator) -> Iterator[dict]:
        train = self._resident_tensor("train")
        n = train.shape[0]
        sides = self._train_sides
        # all permutations first, so the draw order does not depend on consumption
        perms = [torch.randperm(n, generator=generator, device=self.device) if self.shuffle
                 else torch.arange(n, device=self.device) for _ in sides]
        weights = self._resident_tensor("weights") if self.subsampling else None
        for start in range(0, n, self.batch_size):
            for mode, perm in zip(sides, perms):
                rows = perm[start:start + self.batch_size]
                yield self.make_batch(train[rows], mode, None if weights is None else weights[rows], generator)

    def _train_epoch(self) -> Iterator[dict]:
        if not self.fixed_negatives:
            yield from self._draw_epoch(self.generator)
            return
        if self._fixed_epoch is None:
            self._fixed_epoch = ([], self._draw_epoch(torch.Generator(device=self.device).manual_seed(self.seed)))
        cache, source = self._fixed_epoch
        # Drawn on first use, so an epoch cut short (limit_train_batches) draws only what it trains.
        for i in range(self.num_train_batches):
            if i == len(cache):
                cache.append(next(source))
            yield cache[i]

    # ---- loaders -----------------------------------------------------------------------

    def train_dataloader(self) -> DataLoader:
        """Training batches, made on :attr:`device` (a Trainer this data module was given
        moves it to the Trainer's device first)."""
        trainer = self.trainer
        if trainer is not None:
            self.to_device(trainer.strategy.root_device)
        return DataLoader(_TrainBatches(self), batch_size=None)

    def eval_dataloader(self, split: str) -> DataLoader:
        """Filtered evaluation batches over any split of the KG (e.g. ``"unlearn"``)."""
        sides = ("tail", "head") if self.eval_sides == "both" else ("tail",)
        index = self.valid_filter_index if split == "valid" else self.filter_index
        data = _EvalBatches(self.kg.triples(split), index, self.eval_batch_size, sides)
        return DataLoader(data, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("valid")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")

    # ---- checkpointing -----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The generator state and its device (saved into checkpoints)."""
        return {"generator_state": self.generator.get_state(), "seed": self.seed, "device": self.device.type}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the generator state saved by :meth:`state_dict`, moving to the kind of
        device it was saved on (a CUDA generator's state means nothing to a CPU one)."""
        saved = state_dict.get("device", "cpu")
        if saved != self.device.type:
            if saved == "cuda" and not torch.cuda.is_available():
                raise ValueError("this sampler state was saved on a GPU and cannot be restored without "
                                 "one: resume the run where CUDA is available")
            self.to_device(saved)
        self.generator.set_state(state_dict["generator_state"])
