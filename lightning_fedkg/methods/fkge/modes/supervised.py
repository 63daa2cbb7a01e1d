"""``alignment: supervised``, the supervised DP alignment (:mod:`..supervised`): the client
sends its aligned rows' directions under its secret rotation ``W0``, whitened (``align_rows``);
the host answers with one noisy cross-covariance, charged to its ledger (``dp_crosscov``); the
client solves Procrustes on it and sends its translated rows."""

from __future__ import annotations

import time

from torch import Tensor

from lightning_fedkg.federated.message import Message, tensor_bytes
from lightning_fedkg.federated.peer import Outgoing

from ..handshake import DECLINE, TRANSLATED, SupervisedClientSide
from ..ppat import initial_generator
from ..supervised import (CROSSCOV, ROWS, AlignmentHost, decode, precondition, release_cost, unit_rows,
                          whitening_power)
from ..translation import translated_message
from .base import AlignmentMode


class SupervisedAlignment(AlignmentMode):
    """The supervised alignment's host (the noisy cross-covariance) and client (rotation, whitening, Procrustes)."""

    def release_exceeds(self, max_epsilon: float) -> bool:
        fk, ledger = self.fk, self.peer.ledger
        cost = release_cost(fk.dp_epsilon, fk.delta, ledger.max_order, fk.dp_neighbours)
        return ledger.epsilon_after_gaussian(cost.log_moments, cost.mu) > max_epsilon

    def _whitening(self, z: Tensor) -> float:
        """The client's whitening power: ``whiten_power``, or the one with the smallest
        predicted error; 0 (plain Procrustes) for the exact release, which has no noise."""
        if self.fk.whiten_power is not None:
            return float(self.fk.whiten_power)
        return 0.0 if self.fk.dp_epsilon is None else whitening_power(z)

    def start_client(self, host: str, ents: Tensor, rels: Tensor, number: int, w_seed: int,
                     tic: float) -> list[Outgoing]:
        """Client: its aligned rows' directions under its secret ``W0``, whitened (:mod:`..supervised`)."""
        peer = self.peer
        x = peer.rows(ents, rels)
        w0 = initial_generator(x.shape[1], "orthogonal", w_seed)
        z = unit_rows(x @ w0.T)
        power = self._whitening(z)
        sent, _ = precondition(z, power)
        peer.ledger.declare("rotated_rows", z.shape[0])
        peer.serving[host] = SupervisedClientSide(entities=ents, relations=rels, seconds=time.perf_counter() - tic,
                                                  w0=w0, rows=x, power=power)
        return [(host, ROWS, Message(arrays={ROWS: sent}))]

    def on_align_rows(self, message: Message, sender: str) -> list[Outgoing]:
        """Host: the noisy cross-covariance, charged to this party's ledger."""
        peer, fk = self.peer, self.fk
        host = peer.hosting(sender)
        host.bytes += tensor_bytes(message.arrays)
        host.ppat_bytes += tensor_bytes(message.arrays)
        tic = time.perf_counter()
        noise_seed = peer.handshake_seed(host.partner, host.number, "dp_noise") if fk.reproducible_noise else None
        # no budget check here: the peer hosted only if this release fits (spent()), and nothing
        # else charges a supervised host's ledger in between
        align = AlignmentHost(host.y, fk.dp_epsilon, fk.delta, peer.ledger.max_order, noise_seed=noise_seed,
                              neighbours=fk.dp_neighbours)
        reply = align.on_rows(message)
        if fk.dp_epsilon is None:
            peer.ledger.declare("exact_crosscov", 1)
        else:
            peer.ledger.charge_gaussian(align.log_moments, add_remove=align.log_moments_add_remove,
                                        mu=align.cost.mu, mu_add_remove=align.cost.mu_add_remove)
        host.batches, host.sigma = 1, align.sigma
        host.seconds += time.perf_counter() - tic
        host.bytes += tensor_bytes(reply.arrays)
        host.ppat_bytes += tensor_bytes(reply.arrays)
        return [(sender, CROSSCOV, reply)]

    def on_dp_crosscov(self, message: Message, sender: str) -> list[Outgoing]:
        """Client: ``W = V W0`` with ``V`` the Procrustes solution on the noisy cross-covariance."""
        peer = self.peer
        side = peer.serving.pop(sender)
        if peer.spent():  # spent while the host computed: the translated rows are not sent
            return [(sender, DECLINE, Message())]
        tic = time.perf_counter()
        _, b = precondition(unit_rows(side.rows @ side.w0.T), side.power)  # from the client's own rows
        side.w = decode(message.arrays[CROSSCOV].float(), b, side.power) @ side.w0
        side.seconds += time.perf_counter() - tic
        return [(sender, TRANSLATED, translated_message(peer, sender, side))]

    def client_side(self, state: dict) -> SupervisedClientSide:
        """W0, X and the whitening power are the whole client side."""
        if state["kind"] != "supervised":
            return super().client_side(state)
        return SupervisedClientSide(entities=state["entities"], relations=state["relations"],
                                    seconds=state["seconds"], w0=state["w0"], rows=state["x"],
                                    power=state.get("power", 0.0))
