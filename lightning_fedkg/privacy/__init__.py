"""Privacy, in one place: the mechanisms and the protocols built on them.

Below the federated core, which uses them: :mod:`.mechanisms` (DP accounting and noise,
secure-aggregation cryptography, PATE and its moments accountant, the Gaussian mechanism)
and :mod:`.stances` (what a client checks in each field a server sends).

Above the core, wrapping its holder-mean halves through the hook in
:mod:`lightning_fedkg.federated.protections` and the registry
:data:`~lightning_fedkg.registry.PROTECTIONS`: :mod:`.secure` (secure aggregation, one
module per step), :mod:`.dp_uploads` (``federated.dp``), :mod:`.identities` and
:mod:`.policy` (provisioned out of band), :mod:`.audit` (``fedkg audit``). A new protection
is one module here and one registry entry. FKGE's ledger, which composes PATE and Gaussian
releases in FKGE's unit (an aligned entity's row), stays in :mod:`lightning_fedkg.methods.fkge`.
"""
