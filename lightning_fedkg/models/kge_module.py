"""LightningModule that trains a KGE score function and evaluates filtered link prediction.

Training batches and evaluation batches are the dicts produced by
:class:`lightning_fedkg.data.datamodule.KGDataModule`. The same module is
used for single-KG runs and as each client's model in a federated run, whose round loop calls
``fit()`` many times on it; see ``reset_optimizer``. Its evaluation steps are
:mod:`.kge_evaluation`'s, its recorded training step :mod:`.captured`'s, its optimizers
:mod:`.optimizers`'.
"""

from __future__ import annotations


import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.config import LOSSES
from lightning_fedkg.evaluation.ranking import TIE_MODES, RankingMetric
from lightning_fedkg.models.captured import RecordedSteps
from lightning_fedkg.models.epoch_log import EpochMeanLogging
from lightning_fedkg.models.kge import KGEModel, build_model
from lightning_fedkg.models.kge_evaluation import LinkPredictionEvaluation
from lightning_fedkg.models.optimizers import build_optimizer, is_row_sparse


def kge_loss(
    positive_scores: Tensor,
    negative_scores: Tensor,
    loss: str = "self_adversarial",
    adversarial_temperature: float = 1.0,
    margin: float = 1.0,
    negative_mask: Tensor | None = None,
    weight: Tensor | None = None,
) -> Tensor:
    """Negative-sampling loss from scores (higher = more plausible).

    Args:
        positive_scores: ``[B]``.
        negative_scores: ``[B, n]``, the negatives of each positive.
        loss:
            * ``"self_adversarial"`` (Sun et al. 2019, RotatE §3.3; FedE, Chen et al. 2021,
              Eq. 3-4 in the code's sign convention): ``p = softmax(α·s_neg)`` treated as a
              constant, ``ℓ_pos = −log σ(s_pos)``, ``ℓ_neg = −Σ_j p_j log σ(−s_neg_j)``,
              ``L = ½ (mean_B ℓ_pos + mean_B ℓ_neg)``.
            * ``"uniform"``: as above with ``p_j = 1/n``.
            * ``"margin"``: ``mean over (i, j) of max(0, margin − s_pos_i + s_neg_ij)``
              (the OpenKE / TransE-paper margin ranking loss).
        adversarial_temperature: ``α``.
        margin: margin of ``"margin"``.
        negative_mask: optional ``BoolTensor[B, n]``, False where a negative is a known true
            triple (filtered shared negatives): such entries get no weight, and every
            average over negatives runs over the valid entries only. A row with no valid
            negative contributes no negative term.
        weight: optional ``[B]`` per-positive weights (subsampling weights): every mean over
            the batch becomes ``Σ w_i x_i / Σ w_i`` (FedLU's and RotatE's code).
    """
    if loss == "margin":
        hinge = F.relu(margin - positive_scores.unsqueeze(1) + negative_scores)
        valid = torch.ones_like(hinge) if negative_mask is None else negative_mask.to(hinge.dtype)
        if weight is not None:
            valid = valid * weight.to(hinge.dtype).unsqueeze(1)
        return (hinge * valid).sum() / valid.sum().clamp(min=1e-12)
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    positive_term = -F.logsigmoid(positive_scores)
    negative_term = negative_loss_term(negative_scores, loss, adversarial_temperature, negative_mask)
    return 0.5 * (batch_mean(positive_term, weight) + batch_mean(negative_term, weight))


def batch_mean(values: Tensor, weight: Tensor | None = None) -> Tensor:
    """``values.mean()``, or the ``weight``-weighted mean ``Σ w v / Σ w``."""
    if weight is None:
        return values.mean()
    weight = weight.to(values.dtype)
    return (weight * values).sum() / weight.sum()


def negative_loss_term(
    negative_scores: Tensor,
    loss: str = "self_adversarial",
    adversarial_temperature: float = 1.0,
    negative_mask: Tensor | None = None,
) -> Tensor:
    """``[B]`` negative part of :func:`kge_loss`: ``−Σ_j p_j log σ(−s_neg_j)`` with
    self-adversarial (``p = softmax(α·s)``, constant) or uniform weights over the valid
    negatives. FedLU's unlearning reuses it next to its own positive term."""
    log_not_negative = F.logsigmoid(-negative_scores)
    if loss == "self_adversarial":
        logits = adversarial_temperature * negative_scores.detach()
        if negative_mask is not None:
            logits = logits.masked_fill(~negative_mask, float("-inf"))
        weights = torch.softmax(logits, dim=1)
        if negative_mask is not None:
            weights = torch.nan_to_num(weights)  # rows without any valid negative
        negative_term = -(weights * log_not_negative).sum(dim=1)
    elif loss == "uniform":
        if negative_mask is None:
            negative_term = -log_not_negative.mean(dim=1)
        else:
            valid = negative_mask.to(negative_scores.dtype)
            negative_term = -(valid * log_not_negative).sum(dim=1) / valid.sum(dim=1).clamp(min=1)
    else:
        raise ValueError(f"negative_loss_term needs 'self_adversarial' or 'uniform', got {loss!r}")
    return negative_term


def mixed_scores_on_device(model: KGEModel, batch: dict) -> Tensor:
    """``[B, n]`` scores of a Bernoulli (``"mixed"``) batch without reading the head mask
    back: every row scored on both sides, each keeping its own side's. Twice the scoring
    of the CPU's row split, which needs the number of head rows on the host."""
    positive, negatives = batch["positive"], batch["negatives"]
    h, r, t = positive[:, 0], positive[:, 1], positive[:, 2]
    tails = model.score_tails(h, r, negatives)
    heads = model.score_heads(r, t, negatives)
    return torch.where(batch["head_mask"].unsqueeze(1), heads, tails.to(heads.dtype))


class KGEModule(LinkPredictionEvaluation, RecordedSteps, EpochMeanLogging, L.LightningModule):
    """Trains ``build_model(model, ...)`` with negative sampling; ranks entities for val/test.

    Args:
        model: a key of :data:`lightning_fedkg.models.kge.MODELS` (``"transe"``, ``"rotate"``, ...).
        num_entities, num_relations, dim, gamma, epsilon: passed to :func:`build_model`.
        lr: the optimizer's learning rate.
        loss: ``"self_adversarial"``, ``"uniform"`` or ``"margin"`` (see :func:`kge_loss`).
        adversarial_temperature: ``α`` of the self-adversarial weights.
        margin: margin of the ``"margin"`` loss.
        regularization: weight of ``model.regularization_loss()`` (0 disables it); with
            ``optimizer="sparse_adam"`` of ``model.regularization_loss(triples)`` over the
            batch's positive triples (a whole-table term would touch every row each step).
        ties: tie handling of the filtered ranks (see :func:`filtered_ranks`).
        reset_optimizer: True builds a fresh Adam at every ``fit()`` (FedE re-creates the
            optimizer each round); False builds it once and returns the same instance on every
            ``fit()``, so its state (moments, step counts) persists. Outside Lightning
            checkpoints, move that state with :meth:`optimizer_state_dict` /
            :meth:`load_optimizer_state_dict`.
        eval_chunk_size: score at most this many evaluation queries at once (bounds the
            ``[B, N]`` score matrix); None scores a whole batch at once.
        optimizer: ``"adam"`` (dense ``torch.optim.Adam``, the official codes') or
            ``"sparse_adam"`` (row-sparse gradients and ``torch.optim.SparseAdam``: a step
            touches only the batch's rows); see :mod:`lightning_fedkg.models.optimizers`. A
            row-sparse step is never recorded (``trainer.capture``): its shapes follow the
            batch's distinct rows.
        eval_candidates: None (default) ranks each query's target against every entity (or
            every entity of ``eval_candidate_mask``); ``K`` ranks it against ``K`` entities
            drawn without replacement from that pool, one draw shared by each evaluation
            batch, filtered like the full ranking (:func:`sampled_ranks`, which states the
            estimator). The draws come from a generator seeded with ``eval_seed`` at the
            start of every validation and test, so every evaluation of the same batches sees
            the same candidates. ``K`` at least the pool's size is the full ranking.
        eval_seed: the seed of those draws.
        model_kwargs: extra keyword arguments of the model (``p_norm``, ``relation_dim``, ...).

    Attributes:
        model: the :class:`KGEModel`.
        val_metric, test_metric: :class:`RankingMetric` accumulators.
        last_metrics: ``{"val": {...}, "test": {...}}``, the last computed metrics of each stage
            as plain numbers (``mrr``, ``mr``, ``hits@1/3/5/10`` floats, ``count`` int).
            ``trainer.validate``/``trainer.test`` over an empty split (e.g. every valid triple
            mentioned an entity unseen in train and was dropped) records ``count`` 0 and NaN
            values, so a count- or triple-weighted average over clients gives it weight 0.
        eval_candidate_mask: optional ``BoolTensor[N]`` buffer (not saved); when set, only
            these entities (plus the target) compete in evaluation, e.g. FedE ranks among the
            client's training entities.
    """

    def __init__(
        self,
        model: str = "transe",
        *,
        num_entities: int,
        num_relations: int,
        dim: int = 128,
        gamma: float = 10.0,
        epsilon: float = 2.0,
        lr: float = 1e-3,
        loss: str = "self_adversarial",
        adversarial_temperature: float = 1.0,
        margin: float = 1.0,
        regularization: float = 0.0,
        ties: str = "mean",
        reset_optimizer: bool = True,
        eval_chunk_size: int | None = None,
        optimizer: str = "adam",
        eval_candidates: int | None = None,
        eval_seed: int = 0,
        model_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if ties not in TIE_MODES:
            raise ValueError(f"ties must be one of {TIE_MODES}, got {ties!r}")
        if eval_chunk_size is not None and eval_chunk_size < 1:
            raise ValueError(f"eval_chunk_size must be positive or None, got {eval_chunk_size}")
        if eval_candidates is not None and eval_candidates < 1:
            raise ValueError(f"eval_candidates must be positive or None, got {eval_candidates}")
        sparse = is_row_sparse(optimizer)  # raises on an unknown name
        self.save_hyperparameters()
        self.automatic_optimization = False  # several optimizer steps per step: training_step
        self.model: KGEModel = build_model(
            model, num_entities, num_relations, dim, gamma=gamma, epsilon=epsilon, **(model_kwargs or {})
        )
        self.model.sparse_gradients = sparse
        self.val_metric = RankingMetric()
        self.test_metric = RankingMetric()
        self.register_buffer("eval_candidate_mask", None, persistent=False)
        self.last_metrics: dict[str, dict[str, float | int]] = {}
        self._last_stage: str | None = None
        self._stage_recorded = False
        self._optimizer: torch.optim.Optimizer | None = None
        #: Extra loss terms added to every training batch, as zero-argument callables (not
        #: saved). A federated client half installs one for the length of a local fit, e.g.
        #: FedProx's proximal term; outside federation the list stays empty.
        self.regularizers: list = []

    def shareable_groups(self) -> dict:
        """The model's declared groups (``"entity"``, ``"relation"``); see :mod:`.shareable`."""
        return self.model.shareable_groups()

    # ------------------------------------------------------------------ training
    def negative_scores(self, batch: dict, model: KGEModel | None = None) -> Tensor:
        """``[B, n]`` scores of the batch's negatives according to ``batch["mode"]``, under
        ``model`` (default ``self.model``; FedLU also scores its avatar)."""
        model = self.model if model is None else model
        positive, negatives, mode = batch["positive"], batch["negatives"], batch["mode"]
        h, r, t = positive[:, 0], positive[:, 1], positive[:, 2]
        if mode == "tail":
            return model.score_tails(h, r, negatives)
        if mode == "head":
            return model.score_heads(r, t, negatives)
        if mode != "mixed":
            raise ValueError(f"batch mode must be 'tail', 'head' or 'mixed', got {mode!r}")
        if positive.device.type != "cpu":
            return mixed_scores_on_device(model, batch)
        # Score each row only on its own corruption side; shared negatives serve both sides.
        head_rows = batch["head_mask"].nonzero().squeeze(1)
        tail_rows = (~batch["head_mask"]).nonzero().squeeze(1)

        def rows_of(index: Tensor) -> Tensor:
            return negatives[index] if negatives.dim() == 2 else negatives

        parts = []
        if len(tail_rows):
            parts.append((tail_rows, model.score_tails(h[tail_rows], r[tail_rows], rows_of(tail_rows))))
        if len(head_rows):
            parts.append((head_rows, model.score_heads(r[head_rows], t[head_rows], rows_of(head_rows))))
        scores = parts[0][1].new_empty(positive.shape[0], negatives.shape[-1])
        for rows, part in parts:
            scores[rows] = part.to(scores.dtype)
        return scores

    def training_loss(self, batch: dict) -> Tensor:
        """Loss of one training batch (the objective of :meth:`training_step`)."""
        positive = batch["positive"]
        positive_scores = self.model(positive[:, 0], positive[:, 1], positive[:, 2])
        hp = self.hparams
        loss = kge_loss(
            positive_scores, self.negative_scores(batch), hp.loss, hp.adversarial_temperature, hp.margin,
            negative_mask=batch.get("negative_mask"), weight=batch.get("weight"),
        )
        if hp.regularization > 0:
            # A row-sparse step regularises the batch's rows only: the whole tables' term
            # would give every row a gradient (see lightning_fedkg.models.optimizers).
            rows = positive if self.row_sparse else None
            loss = loss + hp.regularization * self.model.regularization_loss(rows)
        for term in self.regularizers:
            loss = loss + term()
        return loss

    #: Run the training losses through :func:`torch.compile` (``trainer.compile``).
    compile_training: bool = False

    def compiled(self, name: str):
        """The loss method ``name`` (``training_loss``, or a subclass's other loss of one
        batch), through :func:`torch.compile` when :attr:`compile_training` is set, compiled
        once per module; else the method itself. The score-and-loss path is where a step's
        many small element-wise kernels are that compilation fuses."""
        method = getattr(self, name)
        if not self.compile_training:
            return method
        cache = self.__dict__.setdefault("_compiled_losses", {})  # not a submodule, not saved
        if name not in cache:
            cache[name] = torch.compile(method)
        return cache[name]

    @staticmethod
    def step_batches(batch: dict | list[dict]) -> list[dict]:
        """The batches of one Lightning step: a batch, or a list of them (``batches_per_step``)."""
        return batch if isinstance(batch, list) else [batch]

    def optimise_batch(self, batch: dict, optimizers: list, backward) -> dict[str, Tensor]:
        """The whole step of one batch: losses, ``backward(loss, **kwargs)`` and the
        optimizers' updates; returns ``{name: loss}`` for the epoch log. The eager step passes
        Lightning's optimizer wrappers and ``manual_backward`` (so precision plugins still
        scale and unscale); a recorded step passes the bare optimizers and
        ``Tensor.backward`` (see :mod:`lightning_fedkg.models.captured`)."""
        (optimizer,) = optimizers
        loss = self.compiled("training_loss")(batch)
        optimizer.zero_grad()
        backward(loss)
        optimizer.step()
        return {"train/loss": loss}

    def training_step(self, batch: dict | list[dict], batch_idx: int) -> None:
        # Manual optimisation: one optimizer step per batch of the group.
        graphs = self.step_graphs()
        optimizers = None if graphs is not None else self._optimizer_list(wrapped=True)
        for one in self.step_batches(batch):
            if graphs is not None:
                losses = graphs.run(one)
            else:
                losses = self.optimise_batch(one, optimizers, self.manual_backward)
            for name, value in losses.items():
                self.log_epoch_mean(name, value, one["positive"].shape[0])

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        # The data module makes batches on the module's device already; Lightning's default
        # walks every batch to move it anyway, a visible share of a recorded step's host time.
        batches = self.step_batches(batch)
        if all(isinstance(one, dict) for one in batches) and all(
                value.device == device for one in batches for value in one.values() if isinstance(value, Tensor)):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # ------------------------------------------------------------------ optimizer
    @property
    def row_sparse(self) -> bool:
        """Whether training takes row-sparse steps (``optimizer="sparse_adam"``)."""
        return is_row_sparse(self.hparams.get("optimizer", "adam"))

    def build_optimizer(self) -> torch.optim.Optimizer:
        """A fresh optimizer of ``optimizer`` (Adam or the row-sparse SparseAdam) over every
        parameter (:func:`~lightning_fedkg.models.optimizers.build_optimizer`)."""
        return build_optimizer(self.hparams.get("optimizer", "adam"), self, self.hparams.lr)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.hparams.reset_optimizer or self._optimizer is None:
            self._optimizer = self.build_optimizer()
        return self._ready_to_record(self._optimizer)

    def optimizer_state_dict(self) -> dict | None:
        """State of the optimizer that outlives a ``fit()``; None when each ``fit()`` builds a
        fresh one (``reset_optimizer``: nothing worth saving) or before one exists."""
        if self.hparams.reset_optimizer or self._optimizer is None:
            return None
        return self._optimizer.state_dict()

    def load_optimizer_state_dict(self, state: dict | None) -> None:
        """Restore the optimizer's state; builds the optimizer if needed so the next ``fit()`` reuses it
        (with ``reset_optimizer=True`` the next ``fit()`` replaces it anyway). None clears it."""
        if state is None:
            self._optimizer = None
            return
        if self._optimizer is None:
            self._optimizer = self.build_optimizer()
        self._optimizer.load_state_dict(state)
