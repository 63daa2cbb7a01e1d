"""Evaluation: filtered link-prediction ranks/metrics and triple classification."""

from lightning_fedkg.evaluation.classification import (
    best_thresholds,
    classification_accuracy,
    corrupt_triples,
    triple_classification,
)
from lightning_fedkg.evaluation.ranking import TIE_MODES, RankingMetric, filtered_ranks, metrics_to_floats

__all__ = [
    "TIE_MODES",
    "RankingMetric",
    "best_thresholds",
    "classification_accuracy",
    "corrupt_triples",
    "filtered_ranks",
    "metrics_to_floats",
    "triple_classification",
]
