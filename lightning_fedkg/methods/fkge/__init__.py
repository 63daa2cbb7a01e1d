"""FKGE (Peng et al., "Differentially Private Federated Knowledge Graphs Embedding",
CIKM 2021): decentralised KG embedding by pairwise, differentially private translation.

* :mod:`.federation` -- :class:`FKGE`, one :class:`FKGEPeer` (the handshake's state machine)
  per KG; :mod:`.modes` one object per alignment, :mod:`.translation` a handshake's end,
  :mod:`.handshake`, :mod:`.pretraining`, :mod:`.report`, :mod:`.config` (``federated.fkge``);
* :mod:`.ppat` (PPAT, the adversarial translation; :mod:`.ppat_module`, the same game as a
  LightningModule), :mod:`.supervised` (the supervised DP alignment), :mod:`.update`
  (KGEmb-Update with virtual rows and backtracking);
* :mod:`.pate`, :mod:`.accountant`, :mod:`.gaussian`, :mod:`.ledger` -- PATE voting, its
  moments accountant, the Gaussian's log moments, one privacy ledger per party;
* :mod:`.multisource` (KGs aligned by names), :mod:`.classification` (triple classification).

See docs/methods/fkge.md.
"""

from .config import FKGEConfig
from .ppat import PPATClient, PPATHost, discriminator, run_ppat
from .update import VirtualRows, add_virtual_rows, kgemb_update, remove_virtual_rows
from .federation import FKGE, FKGEPeer  # noqa: E402  (after .ppat/.update: it imports them)

__all__ = ["FKGE", "FKGEConfig", "FKGEPeer", "PPATClient", "PPATHost", "discriminator", "run_ppat",
           "VirtualRows", "add_virtual_rows", "kgemb_update", "remove_virtual_rows"]
