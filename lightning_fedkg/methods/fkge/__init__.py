"""FKGE (Peng et al., "Differentially Private Federated Knowledge Graphs Embedding",
CIKM 2021): decentralised KG embedding by pairwise, differentially private translation.

* :mod:`.ppat` -- PPAT, the adversarial translation between two KGs (:class:`PPATClient`,
  :class:`PPATHost`, :func:`run_ppat`);
* :mod:`.supervised` -- the supervised DP alignment (beyond the paper);
* :mod:`.update` -- the host's KGEmb-Update with virtual rows and backtracking;
* :mod:`.federation` -- :class:`FKGE` (``federated.strategy: fkge``), one
  :class:`FKGEPeer` per KG on the core's peer-to-peer runner.

See docs/methods/fkge.md.
"""

from .config import FKGEConfig
from .ppat import PPATClient, PPATHost, discriminator, run_ppat
from .update import VirtualRows, add_virtual_rows, kgemb_update, remove_virtual_rows
from .federation import FKGE, FKGEPeer  # noqa: E402  (after .ppat/.update: it imports them)

__all__ = ["FKGE", "FKGEConfig", "FKGEPeer", "PPATClient", "PPATHost", "discriminator", "run_ppat",
           "VirtualRows", "add_virtual_rows", "kgemb_update", "remove_virtual_rows"]
