"""FedE (Chen et al., IJCKG 2021): holder-mean of entity rows, and its model fusion.

* :mod:`.strategy` -- :class:`FedE` (``federated.strategy: fede``);
* :mod:`.config` -- :class:`FedEConfig`, the ``federated.fede`` section;
* :mod:`.fusion` -- :class:`ScoreFusion`, the 2→1 layer over two models' scores (§2.2.3), and
  :class:`FusionModule`, the LightningModule that fits it;
* :mod:`.phase` -- :class:`FusionPhase`, the ``fusion`` phase that trains and tests it.
"""

from .config import FedEConfig
from .strategy import FedE

__all__ = ["FedE", "FedEConfig"]
