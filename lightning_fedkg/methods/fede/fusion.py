"""FedE model fusion: a learned 2→1 combination of a Single and a federated KGE model.

Chen et al., "FedE: Embedding Knowledge Graphs in Federated Setting", IJCKG 2021, §2.2.3,
Eq. 5–6. For a triple the fused score is ``w·[s_single, s_fed] + b`` (:class:`ScoreFusion`),
fit on the client's validation triples with a margin ranking loss against the mean of
``num_negatives`` tail corruptions (:func:`fusion_loss`). Both models are frozen, so their
scores are computed once and fitting takes seconds: :func:`fit_fusion` caches them and fits
:class:`FusionModule`, a LightningModule over the cached scores, with a Trainer (the
client's own in a run). Validation metrics after fusion are not clean: report test
numbers only. See docs/methods/fede.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import lightning as L
import torch
from torch import Tensor, nn

from lightning_fedkg.evaluation.ranking import RankingMetric, filtered_ranks, metrics_to_floats
from lightning_fedkg.federated.party import device_trainer, fit_epochs
from lightning_fedkg.keys import pack_keys

__all__ = ["ScoreFusion", "fusion_loss", "sample_fusion_negatives", "ShuffledBatches", "FusionModule", "fit_fusion",
           "evaluate_fusion"]

FilterFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


class ScoreFusion(nn.Module):
    """The 2→1 linear fusion layer ``s = w_single·s_single + w_fed·s_fed + b``.

    ``forward(single_scores, fed_scores)`` accepts any two tensors of the same shape (``[B]``
    per-triple scores or ``[B, N]`` 1-vs-all scores) and returns fused scores of that shape.
    The parameters live in ``self.linear`` (``nn.Linear(2, 1)``; weight column 0 multiplies
    the Single score, column 1 the federated score). They are initialised as ``nn.Linear``
    does, from ``generator`` when one is given (the global RNG is then left untouched).
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.linear = nn.utils.skip_init(nn.Linear, 2, 1)
        self.reset_parameters(generator)

    @classmethod
    def from_weights(cls, w_single: float, w_fed: float, bias: float = 0.0) -> ScoreFusion:
        """A fusion layer with the given fixed weights and bias."""
        fusion = cls(generator=torch.Generator())  # values overwritten below
        with torch.no_grad():
            fusion.linear.weight.copy_(torch.tensor([[float(w_single), float(w_fed)]]))
            fusion.linear.bias.fill_(float(bias))
        return fusion

    @property
    def weight(self) -> Tensor:
        """``Tensor[2]``: (weight on the Single score, weight on the federated score)."""
        return self.linear.weight.reshape(2)

    @property
    def bias(self) -> Tensor:
        """0-dim tensor: the bias ``b``."""
        return self.linear.bias.reshape(())

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Re-draw weight and bias from ``U(-1/√2, 1/√2)`` (``nn.Linear``'s range for fan-in 2).

        With a ``generator`` the draw is reproducible without touching the global RNG.
        """
        bound = 1.0 / math.sqrt(2.0)
        with torch.no_grad():
            for p in (self.linear.weight, self.linear.bias):
                draw = torch.rand(p.shape, generator=generator, dtype=p.dtype, device="cpu")
                p.copy_((2.0 * draw - 1.0) * bound)

    def forward(self, single_scores: Tensor, fed_scores: Tensor) -> Tensor:
        """Fused scores ``w_single·single_scores + w_fed·fed_scores + b`` (same shape as inputs)."""
        if single_scores.shape != fed_scores.shape:
            raise ValueError(
                f"single and federated scores must have the same shape, got "
                f"{tuple(single_scores.shape)} and {tuple(fed_scores.shape)}"
            )
        w = self.linear.weight
        # Same value as self.linear(torch.stack([single, fed], -1)).squeeze(-1) without
        # materialising the [..., 2] feature tensor (which matters for [B, N] scores).
        return single_scores * w[0, 0] + fed_scores * w[0, 1] + self.linear.bias[0]


def fusion_loss(pos_scores: Tensor, neg_scores: Tensor, margin: float = 10.0) -> Tensor:
    """FedE fusion loss: mean over the batch of ``max(0, margin − s(pos) + mean_j s(neg_j))``.

    Args:
        pos_scores: ``[B]`` fused scores of the positives.
        neg_scores: ``[B, n]`` fused scores of each positive's negatives.
        margin: β (10 in FedE).
    """
    return torch.relu(margin - pos_scores + neg_scores.mean(dim=1)).mean()


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def sample_fusion_negatives(
    triples: Tensor,
    num_entities: int,
    num_negatives: int,
    generator: torch.Generator | None = None,
    max_rounds: int = 32,
) -> Tensor:
    """Uniform tail negatives for each triple, excluding true tails of the same ``(h, r)``.

    "True tails" are those among ``triples`` themselves (for fusion: the validation
    triples), as in FedE. Rejected draws are re-drawn in vectorized rounds; draws still
    rejected after ``max_rounds`` rounds (only possible when a query's true tails cover
    almost every entity) are drawn exactly from the query's allowed entities.

    Args:
        triples: ``LongTensor[V, 3]`` (head, relation, tail).
        num_entities: candidates are ``0 .. num_entities-1``.
        num_negatives: ``n`` negatives per triple.
        generator: CPU ``torch.Generator`` for reproducibility.
        max_rounds: rejection rounds before the exact fallback.

    Returns:
        ``LongTensor[V, n]`` on the CPU.

    Raises:
        ValueError: if some ``(h, r)`` has every entity as a true tail (no valid negative).
    """
    triples = triples.detach().to("cpu", torch.long)
    num_triples = triples.shape[0]
    if num_triples == 0 or num_negatives == 0:
        return torch.empty(num_triples, num_negatives, dtype=torch.long)
    h, r, t = triples.unbind(dim=1)
    if int(triples[:, [0, 2]].max()) >= num_entities or int(triples[:, [0, 2]].min()) < 0:
        raise ValueError("triples contain an entity id outside 0..num_entities-1")
    num_rel = int(r.max()) + 1
    query = pack_keys((h, r), (num_entities, num_rel))  # one integer per (h, r)
    key_sizes = (num_entities * num_rel, num_entities)
    # Sorted unique keys of the true (query, tail) pairs; membership via searchsorted.
    true_keys = torch.unique(pack_keys((query, t), key_sizes, "(head, relation, tail) triples"))
    _, tails_per_query = torch.unique(true_keys // num_entities, return_counts=True)
    if int(tails_per_query.max()) >= num_entities:
        raise ValueError("some (head, relation) has every entity as a true tail; no negatives exist")

    def is_true(q: Tensor, cand: Tensor) -> Tensor:
        keys = pack_keys((q, cand), key_sizes)
        pos = torch.searchsorted(true_keys, keys).clamp_max(true_keys.numel() - 1)
        return true_keys[pos] == keys

    q_rows = query.unsqueeze(1).expand(num_triples, num_negatives)
    negatives = torch.randint(num_entities, (num_triples, num_negatives), generator=generator)
    bad = is_true(q_rows, negatives)
    for _ in range(max_rounds):
        n_bad = int(bad.sum())
        if n_bad == 0:
            return negatives
        redraw = torch.randint(num_entities, (n_bad,), generator=generator)
        negatives[bad] = redraw
        still_bad = torch.zeros_like(bad)
        still_bad[bad] = is_true(q_rows[bad], redraw)
        bad = still_bad
    if not bool(bad.any()):
        return negatives
    # Exact fallback for the few draws still rejected: sample among the allowed entities.
    bad_idx = bad.nonzero(as_tuple=True)
    q_bad = q_rows[bad_idx]
    allowed = ~is_true(
        q_bad.unsqueeze(1).expand(-1, num_entities), torch.arange(num_entities).unsqueeze(0)
    )
    negatives[bad_idx] = torch.multinomial(allowed.float(), 1, generator=generator).squeeze(1)
    return negatives


@torch.no_grad()
def _frozen_scores(
    model: nn.Module, h: Tensor, r: Tensor, t: Tensor, negatives: Tensor, chunk_size: int
) -> tuple[Tensor, Tensor]:
    """fp32 scores of the positives ``[V]`` and of their tail negatives ``[V, n]``."""
    device = _model_device(model)
    was_training = model.training
    model.eval()
    pos_parts, neg_parts = [], []
    try:
        with torch.autocast(device_type=device.type, enabled=False):
            for start in range(0, h.shape[0], chunk_size):
                sl = slice(start, start + chunk_size)
                hb, rb, tb = h[sl].to(device), r[sl].to(device), t[sl].to(device)
                pos_parts.append(model(hb, rb, tb).float())
                neg_parts.append(model.score_tails(hb, rb, negatives[sl].to(device)).float())
    finally:
        model.train(was_training)
    return torch.cat(pos_parts), torch.cat(neg_parts)


class ShuffledBatches:
    """Index batches over ``0 .. n-1``: each pass draws a fresh permutation from
    ``generator`` (the global RNG if None) and cuts it into ``batch_size`` slices.

    A plain iterable rather than a ``DataLoader``: a DataLoader's iterator draws a seed from
    the global RNG at every pass, which fitting the fusion layer leaves alone. The
    permutation is drawn when the first batch is asked for, not by ``iter()`` itself
    (Lightning calls ``iter()`` once to check that a loader is iterable).
    """

    def __init__(self, n: int, batch_size: int, generator: torch.Generator | None = None) -> None:
        if n < 1 or batch_size < 1:
            raise ValueError(f"need n >= 1 and batch_size >= 1, got {n} and {batch_size}")
        self.n, self.batch_size, self.generator = n, batch_size, generator

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def __iter__(self) -> Iterator[Tensor]:
        yield from torch.randperm(self.n, generator=self.generator).split(self.batch_size)


class FusionModule(L.LightningModule):
    """FedE's fusion fit (§2.2.3, Eq. 6): a :class:`ScoreFusion` layer trained by a Trainer
    on cached scores of two frozen models.

    The scores are buffers (moved with the module to the Trainer's device, never saved);
    the models themselves are not part of the module, so no fit can touch them. A training
    batch is a ``LongTensor`` of positive indices (:meth:`train_dataloader`: a fresh order
    from ``generator`` every epoch) and its loss :func:`fusion_loss` over those positives.
    Automatic optimisation: one Adam over the layer, one step per batch. The loss is taken
    outside autocast, in fp32 like the scores, whatever the Trainer's precision.

    Args:
        single_pos, fed_pos: ``[V]`` scores of the positives by the Single and the federated model.
        single_neg, fed_neg: ``[V, n]`` scores of each positive's negatives.
        margin: β of :func:`fusion_loss`.
        lr, batch_size: Adam learning rate and positives per batch.
        generator: CPU ``torch.Generator`` for the layer's init and the epochs' orders (the
            global RNG is then untouched); None draws both from the global RNG.

    Attributes:
        fusion: the :class:`ScoreFusion` layer being fit.
        epoch_losses: ``[0-dim tensor]``, the mean loss over the positives of each epoch fit so far.
    """

    def __init__(self, single_pos: Tensor, single_neg: Tensor, fed_pos: Tensor, fed_neg: Tensor, *,
                 margin: float = 10.0, lr: float = 0.01, batch_size: int = 512,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if single_pos.dim() != 1 or single_pos.shape != fed_pos.shape or single_neg.shape != fed_neg.shape \
                or single_neg.dim() != 2 or single_neg.shape[0] != single_pos.shape[0] or single_pos.numel() == 0:
            raise ValueError(
                f"need positive scores [V] (V > 0) and negative scores [V, n] of both models, got "
                f"{tuple(single_pos.shape)}, {tuple(fed_pos.shape)}, {tuple(single_neg.shape)}, {tuple(fed_neg.shape)}"
            )
        self.margin, self.lr, self.batch_size, self.generator = margin, lr, batch_size, generator
        for name, scores in (("single_pos", single_pos), ("single_neg", single_neg), ("fed_pos", fed_pos),
                             ("fed_neg", fed_neg)):
            self.register_buffer(name, scores.detach().float(), persistent=False)
        self.fusion = ScoreFusion(generator=generator)
        self.epoch_losses: list[Tensor] = []
        self._epoch_total: Tensor | None = None

    @property
    def num_positives(self) -> int:
        """``V``, the number of positives (validation triples) the layer is fit on."""
        return self.single_pos.shape[0]

    def train_dataloader(self) -> ShuffledBatches:
        """The positives' indices, shuffled anew each epoch, in ``batch_size`` slices."""
        return ShuffledBatches(self.num_positives, self.batch_size, self.generator)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.fusion.parameters(), lr=self.lr)

    def on_train_epoch_start(self) -> None:
        self._epoch_total = torch.zeros((), device=self.device)

    def training_step(self, idx: Tensor, batch_idx: int) -> Tensor:
        with torch.autocast(device_type=self.device.type, enabled=False):
            loss = fusion_loss(
                self.fusion(self.single_pos[idx], self.fed_pos[idx]),
                self.fusion(self.single_neg[idx], self.fed_neg[idx]),
                self.margin,
            )
        # Summed on the device, read once per fit (loss_history), not per step.
        self._epoch_total += loss.detach() * idx.numel()
        return loss

    def on_train_epoch_end(self) -> None:
        self.epoch_losses.append(self._epoch_total / self.num_positives)

    def loss_history(self) -> Tensor:
        """``FloatTensor[epochs]`` on the CPU: :attr:`epoch_losses` so far."""
        if not self.epoch_losses:
            return torch.zeros(0, dtype=torch.float32)
        return torch.stack(self.epoch_losses).cpu()


def fit_fusion(
    single_model: nn.Module,
    fed_model: nn.Module,
    valid_triples: Tensor,
    num_entities: int,
    *,
    num_negatives: int = 256,
    margin: float = 10.0,
    lr: float = 0.01,
    epochs: int = 500,
    batch_size: int = 512,
    generator: torch.Generator | None = None,
    score_chunk_size: int = 1024,
    trainer: L.Trainer | None = None,
) -> ScoreFusion:
    """Fit FedE's fusion layer on a client's validation triples (FedE §2.2.3, Eq. 5–6).

    Both models are frozen (never updated, evaluated in ``eval()`` mode and fp32). Their
    scores on the positives and on the negatives are computed **once** up front; a
    :class:`FusionModule` over the cached ``[V]`` / ``[V, n]`` score tensors is then fit for
    ``epochs`` epochs by ``trainer``, so fitting takes seconds.

    Args:
        single_model, fed_model: KGE models with ``forward(h, r, t) -> [B]`` and
            ``score_tails(h, r, candidates[B, n]) -> [B, n]`` over the same client-local ids.
        valid_triples: ``LongTensor[V, 3]``, the client's validation triples (positives).
        num_entities: size of the client's entity range (negatives are drawn from it).
        num_negatives: uniform tail negatives per positive, filtered only against the
            validation triples' true tails of the same ``(h, r)`` (:func:`sample_fusion_negatives`).
        margin: β of :func:`fusion_loss`.
        lr, epochs, batch_size: Adam learning rate, passes over the positives, mini-batch size.
        generator: CPU ``torch.Generator`` driving negatives, layer init and shuffling; with
            it the result is reproducible and the global RNG is untouched.
        score_chunk_size: positives scored per model call when building the cache.
        trainer: the Trainer that fits the layer, on the models' device (:func:`fuse_client`
            passes the client's own); None: a fresh one there
            (:func:`~lightning_fedkg.federated.party.device_trainer`).

    Returns:
        The trained :class:`ScoreFusion` (in ``eval()`` mode, on the models' device). Its
        attribute ``loss_history`` (``FloatTensor[epochs]``) holds the mean loss of each epoch.
    """
    if valid_triples.dim() != 2 or valid_triples.shape[1] != 3 or valid_triples.shape[0] == 0:
        raise ValueError(f"valid_triples must be a non-empty [V, 3] tensor, got {tuple(valid_triples.shape)}")
    device = _model_device(single_model)
    triples = valid_triples.detach().to("cpu", torch.long)
    negatives = sample_fusion_negatives(triples, num_entities, num_negatives, generator=generator)
    h, r, t = triples.unbind(dim=1)
    single_pos, single_neg = _frozen_scores(single_model, h, r, t, negatives, score_chunk_size)
    fed_pos, fed_neg = _frozen_scores(fed_model, h, r, t, negatives, score_chunk_size)

    module = FusionModule(single_pos, single_neg, fed_pos.to(device), fed_neg.to(device),
                          margin=margin, lr=lr, batch_size=batch_size, generator=generator)
    if epochs > 0:
        fit_epochs(trainer if trainer is not None else device_trainer(device), module, epochs)
    fusion = module.fusion.to(device).eval()
    fusion.loss_history = module.loss_history()
    return fusion


@torch.no_grad()
def evaluate_fusion(
    fusion: ScoreFusion,
    single_model: nn.Module,
    fed_model: nn.Module,
    test_triples: Tensor,
    filter_fn: FilterFn,
    *,
    ties: str = "arbitrary",
    chunk_size: int = 256,
    candidate_mask: Tensor | None = None,
) -> dict[str, float | int]:
    """Filtered tail-only link prediction with fused scores (FedE evaluation protocol).

    For each chunk of test queries ``(h, r, ?)`` both models score every candidate with
    ``score_tails(h, r, None)`` in fp32, the scores are fused, the true tails returned by
    ``filter_fn`` are excluded and the target is ranked with
    :func:`~lightning_fedkg.evaluation.ranking.filtered_ranks`.

    Args:
        fusion: a (trained) :class:`ScoreFusion`.
        single_model, fed_model: the frozen models over the same local id space.
        test_triples: ``LongTensor[T, 3]``.
        filter_fn: ``filter_fn(h[b], r[b]) -> (filter_row[K], filter_col[K])``, the
            (row-in-chunk, entity) pairs of true tails to exclude (the target may be
            included; it is never filtered).
        ties: tie mode of ``filtered_ranks`` (FedE reference: ``"arbitrary"``).
        chunk_size: queries scored at a time.
        candidate_mask: optional ``BoolTensor[N]`` of the entities allowed to compete.

    Returns:
        ``{"mrr", "mr", "hits@1", "hits@3", "hits@5", "hits@10"}`` as floats and ``"count"``
        as an int (see :class:`~lightning_fedkg.evaluation.ranking.RankingMetric`).
    """
    device = _model_device(single_model)
    metric = RankingMetric().to(device)
    modes = [(m, m.training) for m in (fusion, single_model, fed_model)]
    for m, _ in modes:
        m.eval()
    triples = test_triples.detach().to(device=device, dtype=torch.long)
    try:
        with torch.autocast(device_type=device.type, enabled=False):
            for start in range(0, triples.shape[0], chunk_size):
                h, r, t = triples[start : start + chunk_size].unbind(dim=1)
                single = single_model.score_tails(h, r, None).float()
                fed = fed_model.score_tails(h, r, None).to(device).float()
                if single.shape != fed.shape:
                    raise ValueError(
                        f"the two models score different candidate sets: {tuple(single.shape)} "
                        f"vs {tuple(fed.shape)}"
                    )
                fused = fusion(single, fed).float()
                filter_row, filter_col = filter_fn(h, r)
                ranks = filtered_ranks(
                    fused, t, filter_row, filter_col, ties=ties, candidate_mask=candidate_mask
                )
                metric.update(ranks)
    finally:
        for m, was_training in modes:
            m.train(was_training)
    return metrics_to_floats(metric.compute())
