"""FedLU (Zhu et al., WWW 2023): mutual distillation and federated unlearning.

* :mod:`.distillation` -- :class:`DistillationModule`, the client's learner (local entity
  table + avatar of the global one), a plain LightningModule;
* :mod:`.strategy` -- :class:`FedLU` (``federated.strategy: fedlu``) and its gate;
* :mod:`.client_unlearning` -- the client's steps (retroactive interference, passive decay) as
  :class:`UnlearningModule`, a LightningModule, and :class:`ClientUnlearner`, which fits it;
* :mod:`.phase` -- :class:`UnlearnPhase` and :func:`run_unlearn` (``fedkg unlearn``);
* :mod:`.config` -- :class:`FedLUConfig` (``federated.fedlu``), :class:`UnlearnConfig` (``unlearn``);
* :mod:`.commands` -- ``fedkg unlearn``; :mod:`.report` -- its table.
"""

import importlib

#: Each export and the module that defines it, imported on first use: ``fedkg`` imports
#: :mod:`.commands` for every call, ``--help`` included, which must not load torch.
_EXPORTS = {"FedLU": "strategy", "FedLUClient": "strategy", "FedLUServer": "strategy", "DistillationGate": "strategy",
            "DistillationModule": "distillation", "FedLUConfig": "config", "UnlearnConfig": "config"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
