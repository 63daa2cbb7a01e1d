"""FedProx (Li et al., MLSys 2020) on FedE's entity rows: FedLU's baseline."""

from .config import FedProxConfig
from .strategy import FedProx, FedProxClient

__all__ = ["FedProx", "FedProxClient", "FedProxConfig"]
