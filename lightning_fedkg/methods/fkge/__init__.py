"""FKGE (Peng et al., "Differentially Private Federated Knowledge Graphs Embedding",
CIKM 2021): decentralised KG embedding by pairwise, differentially private adversarial
translation.

* :mod:`.ppat` -- PPAT, the privacy-preserving adversarial translation between one pair of
  KGs, as two halves (:class:`PPATClient` holds the generator, :class:`PPATHost` the PATE
  teachers and the student) that only exchange :class:`~lightning_fedkg.federated.message.Message`
  objects, and :func:`run_ppat`, which moves them through a
  :class:`~lightning_fedkg.federated.channel.Channel`.
* :mod:`.update` -- the host's KGEmb-Update (§3.3): translated aligned rows replaced or
  averaged, virtual entities/relations added for one training run and removed again
  (:func:`add_virtual_rows`, :func:`remove_virtual_rows`), and :func:`kgemb_update`, which
  keeps the result only if the evaluation score improved (backtracking, bit for bit).
* :mod:`.federation` -- the federation: :class:`FKGE` (``federated.strategy: fkge``), one
  :class:`FKGEPeer` per KG on the core's peer-to-peer runner (handshake queue, Ready / Busy /
  Sleep, broadcast after an improvement, per-host privacy accountant).
"""

from .config import FKGEConfig
from .ppat import PPATClient, PPATHost, discriminator, run_ppat
from .update import VirtualRows, add_virtual_rows, kgemb_update, remove_virtual_rows
from .federation import FKGE, FKGEPeer  # noqa: E402  (after .ppat/.update: it imports them)

__all__ = ["FKGE", "FKGEConfig", "FKGEPeer", "PPATClient", "PPATHost", "discriminator", "run_ppat",
           "VirtualRows", "add_virtual_rows", "kgemb_update", "remove_virtual_rows"]
