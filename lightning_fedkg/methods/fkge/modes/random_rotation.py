"""``alignment: random``, the control that removes the alignment: the client's rows under a
fresh Haar-random rotation per handshake, sent at once; nothing is released under a
mechanism, so nothing is charged."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from lightning_fedkg.federated.peer import Outgoing

from ..handshake import TRANSLATED, SupervisedClientSide
from ..translation import translated_message
from .base import AlignmentMode


def random_rotation(d: int, seed: int) -> Tensor:
    """A Haar-random orthogonal ``[d, d]`` matrix drawn from ``seed``: QR of a Gaussian matrix
    with the signs of R's diagonal fixed (without the fix, Q is not Haar-distributed)."""
    g = torch.Generator().manual_seed(int(seed))
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


class RandomAlignment(AlignmentMode):
    """The random-translation control's client (a host only receives the translated rows)."""

    def release_exceeds(self, max_epsilon: float) -> bool:
        return False  # the control releases nothing under a mechanism

    def start_client(self, host: str, ents: Tensor, rels: Tensor, number: int, w_seed: int,
                     tic: float) -> list[Outgoing]:
        """Its rows under a fresh Haar-random rotation, drawn from the run's seed (a control,
        not a protocol: the host could recompute it)."""
        peer = self.peer
        x = peer.rows(ents, rels)
        w = random_rotation(x.shape[1], peer.handshake_seed(host, number, "random_translation"))
        side = SupervisedClientSide(entities=ents, relations=rels, seconds=0.0, w0=w, rows=x, w=w)
        message = translated_message(peer, host, side)
        side.seconds = time.perf_counter() - tic
        message.metrics["seconds_client"] = float(side.seconds)
        return [(host, TRANSLATED, message)]
