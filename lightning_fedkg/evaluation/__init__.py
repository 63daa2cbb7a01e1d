"""Evaluation: filtered link-prediction ranks and metrics."""

from lightning_fedkg.evaluation.ranking import (TIE_MODES, RankingMetric, filtered_ranks, metrics_to_floats,
                                                sampled_ranks)

__all__ = ["TIE_MODES", "RankingMetric", "filtered_ranks", "metrics_to_floats", "sampled_ranks"]
