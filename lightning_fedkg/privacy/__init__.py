"""Privacy protections any federated method can switch on (``federated.dp``, ``federated.secure_aggregation``).

* :mod:`.dp` -- DP of uploads: clipping, the noise multiplier and the privacy spent (dp-accounting);
* :mod:`.noise` -- Gaussian noise from a cryptographic source, snapped to a grid;
* :mod:`.secagg` -- the cryptography of secure aggregation (key agreement, masks, secret sharing).

FKGE's own mechanisms (PATE voting, its moments accountant, its privacy ledger) live with
it in :mod:`lightning_fedkg.methods.fkge`.
"""
