"""Ray (the ``ray`` extra) as a backend: :mod:`.peer` runs a peer-to-peer strategy with one
actor per party (``federated.backend=ray``); :mod:`.clients` keeps an in-process server's
clients in long-lived actors (``federated.clients=ray``). See docs/federation.md."""
