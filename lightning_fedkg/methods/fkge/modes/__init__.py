"""FKGE's alignment modes, one object per ``federated.fkge.alignment``: how a handshake
aligns the client's space to the host's between ``fkge_start`` and ``fkge_translated``.

* :class:`PPATAlignment` (``ppat``, the paper's GAN: batches of ``G(X)`` and their gradients);
* :class:`SupervisedAlignment` (``supervised``: rotated unit rows and one noisy
  cross-covariance);
* :class:`RandomAlignment` (``random``: the control, a random rotation, nothing exchanged).

The peer (:class:`~lightning_fedkg.methods.fkge.federation.FKGEPeer`) runs the handshake's
states and hands its mode the events only the mode knows.
"""

from .base import AlignmentMode
from .ppat import PPATAlignment
from .random_rotation import RandomAlignment, random_rotation
from .supervised import SupervisedAlignment

#: ``federated.fkge.alignment`` → its mode.
MODES: dict[str, type[AlignmentMode]] = {"ppat": PPATAlignment, "supervised": SupervisedAlignment,
                                         "random": RandomAlignment}

__all__ = ["AlignmentMode", "MODES", "PPATAlignment", "RandomAlignment", "SupervisedAlignment", "random_rotation"]
