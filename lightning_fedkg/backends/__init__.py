"""Where a federated run's parties live when not all in this process: one package per backend.

* :mod:`.ray` -- ``federated.backend=ray`` (a peer-to-peer run with one Ray actor per party,
  :class:`~.ray.peer.RayBackend`) and ``federated.clients=ray`` (an in-process server whose
  clients live in Ray actors, :class:`~.ray.clients.RayClients`);
* :mod:`.flower` -- ``federated.backend=flower`` (Flower's ServerApp and ClientApps) and its
  ``fedkg flower`` command.

Each is found by name through the registries (:data:`~lightning_fedkg.registry.BACKENDS`,
:data:`~lightning_fedkg.registry.CLIENT_POOLS`, :data:`~lightning_fedkg.registry.COMMANDS`),
so the core names none of them. A new backend is a package here plus its registry entries.
Nothing here is imported by the package itself: each backend imports its extra (``ray``,
``flwr``) only where it uses it.
"""
