"""FedEC (embedding-contrastive learning) on FedE's entity rows: FedLU's baseline."""

from .config import FedECConfig
from .strategy import FedEC, FedECClient

__all__ = ["FedEC", "FedECClient", "FedECConfig"]
