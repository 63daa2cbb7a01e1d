"""FedLU (Zhu et al., WWW 2023): mutual distillation and federated unlearning.

* :mod:`.distillation` -- :class:`DistillationModule`, the client's learner (local entity
  table + avatar of the global one), a plain LightningModule;
* :mod:`.strategy` -- :class:`FedLU` (``federated.strategy: fedlu``) and its gate;
* :mod:`.client_unlearning` -- the client's steps: retroactive interference, passive decay;
* :mod:`.phase` -- :class:`UnlearnPhase` and :func:`run_unlearn` (``fedkg unlearn``);
* :mod:`.config` -- :class:`FedLUConfig` (``federated.fedlu``), :class:`UnlearnConfig` (``unlearn``).
"""

from .config import FedLUConfig, UnlearnConfig
from .distillation import DistillationModule
from .strategy import DistillationGate, FedLU, FedLUClient, FedLUServer

__all__ = ["FedLU", "FedLUClient", "FedLUServer", "DistillationGate", "DistillationModule", "FedLUConfig",
           "UnlearnConfig"]
