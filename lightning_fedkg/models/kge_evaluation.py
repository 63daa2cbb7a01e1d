"""Filtered link-prediction evaluation of a KGE LightningModule: ranking the batches of
validation and test (all entities, or ``eval_candidates`` sampled ones), the metrics of each
stage and their record (:class:`LinkPredictionEvaluation`, a mixin of
:class:`~lightning_fedkg.models.kge_module.KGEModule`)."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from lightning_fedkg.evaluation.ranking import (
    RankingMetric,
    draw_candidates,
    empty_metrics,
    filtered_ranks,
    metrics_to_floats,
    sampled_ranks,
)
from lightning_fedkg.models.kge import KGEModel

__all__ = ["LinkPredictionEvaluation"]

log = logging.getLogger("lightning_fedkg")

#: ``trainer.validate`` / ``trainer.test`` stage names → keys of ``KGEModule.last_metrics``
_EVAL_STAGES = {"validate": "val", "test": "test"}


class LinkPredictionEvaluation:
    """Validation and test steps of a LightningModule whose ``model`` is a :class:`KGEModel`.

    The module sets, in its ``__init__``: ``model``; ``hparams`` ``eval_chunk_size``,
    ``ties``, ``eval_candidates``, ``eval_seed``; the ``eval_candidate_mask`` buffer;
    ``val_metric``/``test_metric`` (:class:`RankingMetric`); ``last_metrics`` ({}),
    ``_last_stage`` (None) and ``_stage_recorded`` (False). The arguments' meaning is
    :class:`~lightning_fedkg.models.kge_module.KGEModule`'s.
    """

    def evaluation_model(self) -> KGEModel:
        """The score function validation and test rank with (``self.model``)."""
        return self.model

    @torch.no_grad()
    def rank_batch(self, batch: dict) -> Tensor:
        """Filtered ranks ``[B]`` of an evaluation batch, scored in fp32 against all entities."""
        triples, mode = batch["triples"], batch["mode"]
        if mode == "tail":
            targets = triples[:, 2]
        elif mode == "head":
            targets = triples[:, 0]
        else:
            raise ValueError(f"evaluation mode must be 'tail' or 'head', got {mode!r}")
        filter_row, filter_col = batch["filter_row"], batch["filter_col"]
        if len(triples) == 0:
            return torch.zeros(0, device=self.device)
        chunk = self.hparams.eval_chunk_size or len(triples)
        sample = self.draw_eval_candidates()
        if sample is not None:
            return self._sampled_rank_batch(triples, mode, targets, filter_row, filter_col, sample, chunk)
        model = self.evaluation_model()
        ranks = []
        # bf16 autocast collapses distinct scores into ties (8 mantissa bits): rank in fp32.
        with torch.autocast(device_type=self.device.type, enabled=False):
            for start in range(0, len(triples), chunk):
                part = triples[start : start + chunk]
                if mode == "tail":
                    scores = model.score_tails(part[:, 0], part[:, 1])
                else:
                    scores = model.score_heads(part[:, 1], part[:, 2])
                in_part = (filter_row >= start) & (filter_row < start + len(part))
                ranks.append(
                    filtered_ranks(
                        scores.float(),
                        targets[start : start + len(part)],
                        filter_row[in_part] - start,
                        filter_col[in_part],
                        ties=self.hparams.ties,
                        candidate_mask=self.eval_candidate_mask,
                    )
                )
        return torch.cat(ranks)

    # ------------------------------------------------------------------ sampled evaluation
    def _eval_pool(self) -> Tensor | None:
        """The entity ids evaluation ranks among: ``eval_candidate_mask``'s, or None for all."""
        mask = self.eval_candidate_mask
        if mask is None:
            return None
        cached = self.__dict__.get("_eval_pool_cache")  # not saved; rebuilt when the mask changes
        if cached is None or cached[0] is not mask or cached[1] != mask._version:
            cached = (mask, mask._version, mask.nonzero().flatten())
            self.__dict__["_eval_pool_cache"] = cached
        return cached[2]

    def draw_eval_candidates(self) -> Tensor | None:
        """The next evaluation batch's ``eval_candidates`` sampled entity ids (``[K]``,
        distinct, from the evaluation pool), or None when evaluation ranks the whole pool
        (``eval_candidates`` unset or at least the pool's size)."""
        k = self.hparams.get("eval_candidates")
        if k is None:
            return None
        pool = self._eval_pool()
        size = self.model.num_entities if pool is None else pool.numel()
        if k >= size:
            return None
        generator = self.__dict__.get("_eval_generator")
        if generator is None or generator.device != self.device:
            generator = self.reset_eval_candidates()
        positions = draw_candidates(size, k, generator)
        return positions if pool is None else pool[positions]

    def reset_eval_candidates(self) -> torch.Generator:
        """Restart the candidate draws from ``eval_seed`` (at the start of every validation and
        test: the same batches then get the same candidates at every evaluation)."""
        generator = torch.Generator(device=self.device).manual_seed(self.hparams.get("eval_seed", 0))
        self.__dict__["_eval_generator"] = generator  # not a submodule, not saved
        return generator

    def _sampled_rank_batch(self, triples: Tensor, mode: str, targets: Tensor, filter_row: Tensor,
                            filter_col: Tensor, sample: Tensor, chunk: int) -> Tensor:
        k = sample.numel()
        model = self.evaluation_model()
        ranks = []
        with torch.autocast(device_type=self.device.type, enabled=False):
            for start in range(0, len(triples), chunk):
                part = triples[start : start + chunk]
                part_targets = targets[start : start + len(part)]
                # The targets are scored as shared candidates next to the sample, by the same
                # kernel, so a target and a candidate of equal embedding tie exactly as they
                # would in the full ranking.
                candidates = torch.cat([sample, part_targets])
                if mode == "tail":
                    scores = model.score_tails(part[:, 0], part[:, 1], candidates)
                else:
                    scores = model.score_heads(part[:, 1], part[:, 2], candidates)
                scores = scores.float()
                rows = torch.arange(len(part), device=scores.device)
                in_part = (filter_row >= start) & (filter_row < start + len(part))
                ranks.append(sampled_ranks(
                    scores[:, :k], scores[rows, k + rows], sample, part_targets,
                    filter_row[in_part] - start, filter_col[in_part], ties=self.hparams.ties,
                ))
        return torch.cat(ranks)

    def on_validation_epoch_start(self) -> None:
        self.reset_eval_candidates()

    def on_test_epoch_start(self) -> None:
        self.reset_eval_candidates()

    def update_ranking(self, batch: dict, metric: RankingMetric) -> Tensor:
        """Rank an evaluation batch and add the ranks to ``metric``; returns the ranks."""
        ranks = self.rank_batch(batch)
        metric.update(ranks)
        return ranks

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.update_ranking(batch, self.val_metric)

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.update_ranking(batch, self.test_metric)

    def _finish_evaluation(self, stage: str, metric: RankingMetric) -> None:
        if not metric.update_called:
            return  # no queries: teardown() records the empty result
        computed = metric.compute()
        metric.reset()
        self.log_dict({f"{stage}/{k}": v.float() for k, v in computed.items() if k != "count"})
        if self._trainer is not None and self._trainer.sanity_checking:
            return
        self._record(stage, metrics_to_floats(computed))

    def _record(self, stage: str, metrics: dict[str, float | int]) -> None:
        self.last_metrics[stage] = metrics
        self._last_stage = stage
        self._stage_recorded = True

    def setup(self, stage: str) -> None:
        self._stage_recorded = False

    def teardown(self, stage: str) -> None:
        # Lightning skips the whole evaluation loop, epoch-end hooks included, when the
        # dataloader has no batches; setup/teardown still run, so an empty split is noticed
        # here. Without a record, callers reading last_metrics["val"] would hit a KeyError.
        key = _EVAL_STAGES.get(getattr(stage, "value", stage))
        if key is not None and not self._stage_recorded:
            log.warning("%s: no evaluation queries (empty split); recording count=0 and NaN metrics", key)
            self._record(key, empty_metrics(self.val_metric.hits_at))

    def on_validation_epoch_end(self) -> None:
        self._finish_evaluation("val", self.val_metric)

    def on_test_epoch_end(self) -> None:
        self._finish_evaluation("test", self.test_metric)

    def evaluation_results(self, stage: str | None = None) -> dict:
        """Last computed metrics of ``stage`` (``"val"``/``"test"``; default the latest stage
        evaluated): ``{"mrr", "mr", "hits@1", "hits@3", "hits@5", "hits@10", "count"}``."""
        stage = stage or self._last_stage
        if stage is None or stage not in self.last_metrics:
            raise RuntimeError("no evaluation has finished yet")
        return dict(self.last_metrics[stage])
