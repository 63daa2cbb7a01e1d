"""Privacy, in one place: the mechanisms and the protocols built on them.

Mechanisms and vocabulary (below the federated core, which uses them):

* :mod:`.mechanisms` -- accounting (dp-accounting for DP of uploads), cryptographic Gaussian
  noise on a grid, the cryptography of secure aggregation, PATE voting and its moments
  accountant, the Gaussian mechanism's exact and RDP accounting;
* :mod:`.stances` -- the stance a client takes on each field a server sends it.

Protocols (above the core: they wrap its holder-mean halves, found through
:data:`~lightning_fedkg.registry.PROTECTIONS` by the hook in
:mod:`lightning_fedkg.federated.protections`):

* :mod:`.secure` -- secure aggregation (``federated.secure_aggregation``), one module per step;
* :mod:`.dp_uploads` -- clipped, noised uploads (``federated.dp``);
* :mod:`.identities`, :mod:`.policy` -- the keys and the client policy provisioned out of band;
* :mod:`.audit` -- ``fedkg audit``: a curious server's attack on recorded payloads.

A new protection is one module here (a :class:`~lightning_fedkg.federated.protections.Protection`
with its two mixins) and one entry in ``PROTECTIONS``. FKGE's per-party ledger, which
composes PATE and Gaussian releases in FKGE's unit (one aligned entity's row), stays with
FKGE (:mod:`lightning_fedkg.methods.fkge.ledger`).
"""
