"""Building a model by its registered name, with a check of the options it takes."""

from __future__ import annotations

from lightning_fedkg.models.kge.base import KGEModel, model_options
from lightning_fedkg.registry import MODELS

__all__ = ["build_model"]


# MODELS (lightning_fedkg.registry) finds the built-in models through the package's entry
# points; a user model is added with ``MODELS.add("mymodel", MyModel)`` or named by import
# path ``"my_pkg.models:MyModel"``.


def build_model(name: str, num_entities: int, num_relations: int, dim: int,
                gamma: float = 10.0, epsilon: float = 2.0, **kwargs) -> KGEModel:
    """Instantiate ``MODELS[name]`` (case-insensitive, or an import path); extra ``kwargs``
    go to the model (``p_norm``, ``relation_dim``, ``orthogonality_margin``).

    Raises:
        ValueError: an unknown model (the message lists the valid names), or an option the
            model does not take (the message lists the ones it does).
    """
    cls = MODELS.get(name)
    accepted = model_options(cls)
    unknown = [k for k in kwargs if accepted is not None and k not in accepted]
    if unknown:
        raise ValueError(
            f"KGE model {name!r} does not take {', '.join(unknown)}; "
            f"its options: {', '.join(accepted) or 'none'}"
        )
    return cls(num_entities, num_relations, dim, gamma=gamma, epsilon=epsilon, **kwargs)
