"""KGE score functions (``kge``); the Lightning training module lives in ``kge_module``."""

from .kge import (
    MODELS,
    ComplEx,
    DistMult,
    KGEModel,
    RotatE,
    TransD,
    TransE,
    TransH,
    TransR,
    build_model,
)
from .kge_module import KGEModule
from .distillation import DistillationModule
from .fusion import ScoreFusion, evaluate_fusion, fit_fusion

__all__ = [
    "KGEModule",
    "DistillationModule",
    "ScoreFusion",
    "fit_fusion",
    "evaluate_fusion",
    "KGEModel",
    "MODELS",
    "build_model",
    "TransE",
    "TransH",
    "TransR",
    "TransD",
    "DistMult",
    "ComplEx",
    "RotatE",
]
