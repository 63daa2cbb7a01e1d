"""FKGE (Peng et al., "Differentially Private Federated Knowledge Graphs Embedding",
CIKM 2021): decentralised KG embedding by pairwise, differentially private adversarial
translation.

* :mod:`.ppat` -- PPAT, the privacy-preserving adversarial translation between one pair of
  KGs, as two halves (:class:`PPATClient` holds the generator, :class:`PPATHost` the PATE
  teachers and the student) that only exchange :class:`~lightning_fedkg.federated.message.Message`
  objects, and :func:`run_ppat`, which moves them through a
  :class:`~lightning_fedkg.federated.channel.Channel`.
"""

from .ppat import PPATClient, PPATHost, discriminator, run_ppat

__all__ = ["PPATClient", "PPATHost", "discriminator", "run_ppat"]
