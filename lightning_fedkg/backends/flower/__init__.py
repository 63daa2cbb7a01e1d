"""Flower (``flwr``) as the backend of server-client methods: ``federated.backend=flower``.

The optional ``flower`` extra (``pip install "lightning-fedkg[flower]"``). The server half
runs in a Flower ``ServerApp`` (:mod:`.backend`, :mod:`.server`), each client half in a
``ClientApp`` that reads only its own organisation's data folder (:mod:`.client`,
:mod:`.data`); every stage crosses as Flower messages carrying our safetensors bytes
(:mod:`.wire`). Two modes: Flower's simulation engine on this machine (``fedkg fit ...
federated.backend=flower``) and a deployment with a SuperLink and one SuperNode per
organisation (``fedkg flower up``, :mod:`.deploy`).

This package imports Flower only where it uses it, so ``import lightning_fedkg.backends.flower``
works without the extra (and says how to install it when a run needs it). Importing it
imports nothing heavy either: a ClientApp process that hands its messages to a client
worker (:mod:`.worker`) needs neither torch nor Lightning.
"""

__all__ = ["FlowerBackend", "FlowerNotInstalledError", "require"]


def __getattr__(name: str):
    if name in __all__:
        from lightning_fedkg.backends.flower import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
