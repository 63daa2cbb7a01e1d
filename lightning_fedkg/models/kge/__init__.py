"""The KGE score functions: one module per model over :mod:`.base` (a PyG ``KGEModel``).

:mod:`.families` holds what the distance and the bilinear models share; :func:`build_model`
instantiates a model by its registered name (:data:`lightning_fedkg.registry.MODELS`).
"""

from lightning_fedkg.models.kge.base import KGEModel, model_options
from lightning_fedkg.models.kge.build import build_model
from lightning_fedkg.models.kge.complex import ComplEx
from lightning_fedkg.models.kge.distmult import DistMult
from lightning_fedkg.models.kge.rotate import RotatE
from lightning_fedkg.models.kge.transd import TransD
from lightning_fedkg.models.kge.transe import TransE
from lightning_fedkg.models.kge.transh import TransH
from lightning_fedkg.models.kge.transr import TransR
from lightning_fedkg.registry import MODELS

__all__ = [
    "KGEModel",
    "TransE",
    "TransH",
    "TransR",
    "TransD",
    "DistMult",
    "ComplEx",
    "RotatE",
    "MODELS",
    "build_model",
    "model_options",
]
