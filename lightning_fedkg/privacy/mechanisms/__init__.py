"""Privacy mechanisms and their accounting, free of any protocol (no import of the core).

* :mod:`.accounting` -- the privacy spent by DP of uploads (dp-accounting: PLD, RDP);
* :mod:`.noise` -- Gaussian noise from a cryptographic source, snapped to a grid;
* :mod:`.secagg` -- the cryptography of secure aggregation (key agreement, masks, secret sharing);
* :mod:`.pate` -- PATE voting: disjoint teachers, the Laplace noisy argmax;
* :mod:`.pate_moments` -- PATE's moments accountant;
* :mod:`.gaussian` -- the Gaussian mechanism: exact (epsilon, delta), RDP moments, calibration.
"""
