"""KGE score functions (the :mod:`.kge` package) and the Lightning module that trains them (:mod:`.kge_module`).

The score functions need only torch and PyG; :class:`KGEModule` is loaded on first use, so that
``lightning_fedkg.models.kge`` (model names, for config checks) does not import Lightning.
"""

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

__all__ = [
    "KGEModule",
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


def __getattr__(name: str):
    if name == "KGEModule":
        from .kge_module import KGEModule

        return KGEModule
    raise AttributeError(f"module 'lightning_fedkg.models' has no attribute {name!r}")
