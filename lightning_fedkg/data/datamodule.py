"""Lightning data module for one KG: training batches with negatives, filtered eval batches.

:class:`KGDataModule` yields training dicts (``positive`` ``[B, 3]``, its sampler's ``negatives``
``[B, n]`` per triple or ``[n]`` shared, ``mode`` tail/head/mixed) and evaluation dicts
(``triples``, ``mode``, and the other true answers of each query as ``filter_row`` /
``filter_col``). Batches are made on the module's device (:meth:`KGDataModule.to_device`),
and every draw comes from ``dm.generator``, saved by ``state_dict()``, so a resumed run
draws the same batches. Why batches live on the device: docs/performance.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from .index import FilterIndex, searchsorted, sorted_contains
from .kg import KnowledgeGraph
from .sampling import NegativeSampler, UniformSampler

__all__ = ["KGDataModule", "LoaderSettings", "FilterIndex", "subsampling_weights", "searchsorted",
           "sorted_contains"]

EVAL_SIDES = ("tail", "both")


class _TrainBatches(IterableDataset):
    def __init__(self, dm: "KGDataModule") -> None:
        self.dm = dm

    def __len__(self) -> int:
        return math.ceil(self.dm.num_train_batches / self.dm.loader.batches_per_step)

    def __iter__(self) -> Iterator[dict | list[dict]]:
        k = self.dm.loader.batches_per_step
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


@dataclass(frozen=True)
class LoaderSettings:
    """How :class:`KGDataModule` cuts and orders its batches.

    Args:
        batch_size: positives per training batch.
        eval_batch_size: queries per evaluation batch.
        eval_sides: ``"tail"`` (FedE protocol) or ``"both"``.
        shuffle: shuffle the train triples each epoch.
        subsampling: give each training batch a ``"weight"`` ``[B]`` of frequency weights
            (:func:`subsampling_weights`; RotatE's and FedLU's code), which the losses use
            for a weighted instead of a plain mean over the batch.
        fixed_negatives: draw one epoch of batches (order, sides and negatives) once and
            replay it in every later epoch and round, as the official FedLU code does
            (its client.py materialises its loaders into a list in ``init_model``). Off by
            default: fresh negatives each epoch see more of the entity table. The epoch is
            drawn lazily, batch by batch, from a generator seeded with the data module's
            ``seed`` (not ``dm.generator``) and kept in memory: with ``per_triple``
            negatives that is 8 bytes for each of the ``n_train · sides · num_negatives``
            negative ids.
        batches_per_step: the train loader yields lists of this many batches (the last
            one shorter), one Lightning step each; :class:`~lightning_fedkg.models.KGEModule`
            takes one optimizer step per batch of a list. 1 (default): plain batches.
    """

    batch_size: int = 512
    eval_batch_size: int = 256
    eval_sides: str = "both"
    shuffle: bool = True
    subsampling: bool = False
    fixed_negatives: bool = False
    batches_per_step: int = 1

    def __post_init__(self) -> None:
        if self.eval_sides not in EVAL_SIDES:
            raise ValueError(f"eval_sides must be one of {EVAL_SIDES}, got {self.eval_sides!r}")
        if self.batch_size < 1 or self.eval_batch_size < 1 or self.batches_per_step < 1:
            raise ValueError("batch sizes and batches_per_step must be >= 1")


class KGDataModule(LightningDataModule):
    """Training and filtered-evaluation loaders for one :class:`KnowledgeGraph`.

    Args:
        kg: the graph (train split for training, valid/test for evaluation).
        sampler: the negative sampler (:mod:`.sampling`; default
            ``UniformSampler()``: 256 uniform tail negatives per triple); the data module
            binds its own copy to ``kg``.
        loader: batch sizes, order and evaluation sides (:class:`LoaderSettings`).
        seed: seed of ``dm.generator`` (and of the replayed epoch of ``fixed_negatives``).
        filter_triples: the true triples used to filter evaluation; default
            ``kg.all_true_triples()`` (train ∪ valid ∪ test).
        valid_filter_triples: the true triples that filter validation; default None, the
            test's (``filter_triples``). A method with a rule of its own sets them
            (:meth:`set_valid_filter`; FedLU's official filter leaves its forgetting sets out).
    """

    def __init__(
        self,
        kg: KnowledgeGraph,
        sampler: NegativeSampler | None = None,
        loader: LoaderSettings | None = None,
        seed: int = 0,
        filter_triples: Tensor | None = None,
        valid_filter_triples: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.kg = kg
        self.sampler = (UniformSampler() if sampler is None else sampler).bind(kg)
        self.loader = LoaderSettings() if loader is None else loader
        self.seed = int(seed)
        self._valid_filter_triples = valid_filter_triples
        self._valid_filter_index: FilterIndex | None = None
        # (batches drawn so far, the iterator still drawing the rest of the fixed epoch)
        self._fixed_epoch: tuple[list[dict], Iterator[dict]] | None = None
        self._train_weights: Tensor | None = None
        self._filter_triples = filter_triples
        self.device = torch.device("cpu")
        self.generator = torch.Generator().manual_seed(self.seed)
        self._resident: dict[str, Tensor] = {}  # device copies of what training batches are cut from
        self._filter_index: FilterIndex | None = None

    # ---- sizes -------------------------------------------------------------------------

    @property
    def num_entities(self) -> int:
        return self.kg.num_entities

    @property
    def num_relations(self) -> int:
        return self.kg.num_relations

    @property
    def num_train_batches(self) -> int:
        """Training batches per epoch."""
        n = self.kg.triples("train").shape[0]
        return math.ceil(n / self.loader.batch_size) * len(self.sampler.sides)

    # ---- lazily built indexes (setup() is cheap and idempotent) -------------------------

    @property
    def filter_index(self) -> FilterIndex:
        """CSR index of the evaluation filter set (``filter_triples``)."""
        if self._filter_index is None:
            self._filter_index = FilterIndex(self.evaluation_truth(), self.num_entities, self.num_relations)
        return self._filter_index

    def evaluation_truth(self) -> Tensor:
        """The triples the evaluation filters: ``filter_triples``, else train ∪ valid ∪ test."""
        if self._filter_triples is None:
            return self.kg.all_true_triples()
        return torch.as_tensor(self._filter_triples).long()

    def set_valid_filter(self, triples: Tensor | None) -> None:
        """Filter validation by ``triples`` from now on (None: by :attr:`filter_index`, the test's)."""
        self._valid_filter_triples = triples
        self._valid_filter_index = None

    @property
    def valid_filter_index(self) -> FilterIndex:
        """The validation filter: :attr:`filter_index`, or the index of ``valid_filter_triples``."""
        if self._valid_filter_triples is None:
            return self.filter_index
        if self._valid_filter_index is None:
            triples = torch.as_tensor(self._valid_filter_triples).long()
            self._valid_filter_index = FilterIndex(triples, self.num_entities, self.num_relations)
        return self._valid_filter_index

    @property
    def train_weights(self) -> Tensor:
        """``[n_train]`` subsampling weights of the train triples (see :func:`subsampling_weights`)."""
        if self._train_weights is None:
            self._train_weights = subsampling_weights(self.kg.triples("train"), self.num_entities,
                                                      self.num_relations)
        return self._train_weights

    def setup(self, stage: str | None = None) -> None:
        """Build the indexes the stage needs (once; later calls do nothing)."""
        if stage in (None, "fit"):
            self.sampler.setup()
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
        self.sampler.check_device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device == self.device:
            return self
        seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.device = device
        self.sampler.to_device(device)
        self._resident.clear()
        self._fixed_epoch = None
        return self

    def _resident_tensor(self, name: str) -> Tensor:
        """``name`` (the train triples or their weights) on :attr:`device`, copied there once."""
        if name not in self._resident:
            source = {"train": lambda: self.kg.triples("train").long(),
                      "weights": lambda: self.train_weights}[name]()
            self._resident[name] = source.to(self.device)
        return self._resident[name]

    # ---- training batches -------------------------------------------------------------

    def make_batch(self, positive: Tensor, mode: str, weight: Tensor | None = None,
                   generator: torch.Generator | None = None) -> dict:
        """One training batch for ``positive`` triples; ``mode`` is tail, head or mixed;
        ``weight`` (``[B]``, optional) is passed on as the batch's ``"weight"``; the
        sampler's negatives drawn from ``generator`` (default ``dm.generator``)."""
        generator = self.generator if generator is None else generator
        batch: dict[str, Any] = {"positive": positive, "mode": mode}
        if weight is not None:
            batch["weight"] = weight
        return self.sampler.corrupt(batch, generator)

    def _draw_epoch(self, generator: torch.Generator) -> Iterator[dict]:
        train = self._resident_tensor("train")
        n, size = train.shape[0], self.loader.batch_size
        sides = self.sampler.sides
        # all permutations first, so the draw order does not depend on consumption
        perms = [torch.randperm(n, generator=generator, device=self.device) if self.loader.shuffle
                 else torch.arange(n, device=self.device) for _ in sides]
        weights = self._resident_tensor("weights") if self.loader.subsampling else None
        for start in range(0, n, size):
            for mode, perm in zip(sides, perms):
                rows = perm[start:start + size]
                yield self.make_batch(train[rows], mode, None if weights is None else weights[rows], generator)

    def _train_epoch(self) -> Iterator[dict]:
        if not self.loader.fixed_negatives:
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
        sides = ("tail", "head") if self.loader.eval_sides == "both" else ("tail",)
        index = self.valid_filter_index if split == "valid" else self.filter_index
        data = _EvalBatches(self.kg.triples(split), index, self.loader.eval_batch_size, sides)
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
