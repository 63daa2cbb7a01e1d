"""lightning_fedkg: federated knowledge-graph embedding on PyTorch Lightning and PyG."""

__version__ = "0.1.0"
