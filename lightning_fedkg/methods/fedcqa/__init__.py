"""FedCQA (Hu et al.): complex query answering over several KGs, the query-answering task,
its distributed retrieval of cross-graph queries, and the baselines FedE/FedR-style."""

from .config import FedCQAConfig, QueryTaskConfig
from .strategy import CQAFedE, CQAFedR, FedCQA
from .task import QueryAnswering

__all__ = ["FedCQA", "CQAFedE", "CQAFedR", "FedCQAConfig", "QueryAnswering", "QueryTaskConfig"]
