"""FedR (Zhang et al., Findings of EMNLP 2022): holder-mean of relation rows."""

from .strategy import FedR

__all__ = ["FedR"]
