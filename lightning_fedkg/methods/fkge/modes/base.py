"""The interface of an FKGE alignment mode (:mod:`lightning_fedkg.methods.fkge.modes`)."""

from __future__ import annotations

from torch import Tensor

from lightning_fedkg.federated.peer import Outgoing

from ..handshake import ClientSide
from ..ppat import PPATHost


class AlignmentMode:
    """How one peer aligns in its handshakes, as host and as client.

    Holds the peer (``peer``: its rows, ledger, seeds, open handshakes) and its
    ``federated.fkge`` section (``fk``); its ``on_<event>`` methods handle the events of
    the mode's own exchange (the peer hands them over, :meth:`FKGEPeer.handle`).
    """

    def __init__(self, peer) -> None:
        self.peer = peer
        self.fk = peer.fk

    def release_exceeds(self, max_epsilon: float) -> bool:
        """Whether the peer's next accounted release would take it past ``max_epsilon``."""
        raise NotImplementedError

    def ppat_host(self, y: Tensor, partner: str, number: int) -> PPATHost | None:
        """The host's PPAT half of a new handshake with rows ``y`` (None: the mode has none)."""
        return None

    def start_client(self, host: str, ents: Tensor, rels: Tensor, number: int, w_seed: int,
                     tic: float) -> list[Outgoing]:
        """The client's first messages of handshake ``number`` hosted by ``host``, on the
        aligned ``ents``/``rels``, with ``w_seed`` the seed of its secret start."""
        raise NotImplementedError

    def client_side(self, state: dict) -> ClientSide:
        """A :class:`ClientSide` of this mode from its ``state_dict``."""
        raise ValueError(f"{type(self).__name__} keeps no client side; got one of kind {state.get('kind')!r}")
