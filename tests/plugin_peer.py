"""A peer-to-peer method used by the tests: pairwise gossip averaging of shared entities.

Each peer first trains E local epochs, then, in a ring, greets its next peer with the keyed
hashes of its entity names; the greeted peer intersects them with its own
(``pairwise_alignment``), trains, and answers with its rows of the shared entities; the
greeter averages them into its own rows and sends the average back, so both end equal on
what they share, and greets its next peer. Nothing but digests and shared rows crosses.
"""

import torch

from lightning_fedkg.federated.alignment import pairwise_alignment
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.peer import PeerHalf, PeerStrategy


class GossipPeer(PeerHalf):
    def __init__(self, party, strategy, peers):
        super().__init__(party, strategy, peers)
        self.handshakes = 0

    def entity_rows(self):
        return self.party.module.shareable_groups()["entity"]

    def next_peer(self):
        ring = sorted([self.name, *self.peers])
        return ring[(ring.index(self.name) + 1) % len(ring)]

    def start(self):
        self.party.fit(self.cfg.federated.local_epochs)
        return [(self.next_peer(), "hello", Message(arrays={"digests": self.digests()}))]

    def on_hello(self, message, sender):
        mine, theirs = pairwise_alignment(self.digests(), message.arrays["digests"])
        self.party.fit(self.cfg.federated.local_epochs)
        rows = {n: t[mine] for n, t in self.entity_rows().read().items()}
        return [(sender, "rows", Message(arrays={"positions": theirs, "mine": mine, **rows}))]

    def on_rows(self, message, sender):
        group = self.entity_rows()
        at = message.arrays["positions"]
        averaged = {}
        with torch.no_grad():
            for name, table in group.tensors.items():
                table[at] = 0.5 * (table[at] + message.arrays[name].to(table.dtype))
                averaged[name] = table[at].detach()
        self.handshakes += 1
        reply = Message(arrays={"positions": message.arrays["mine"], **averaged})
        return [(sender, "average", reply), (self.next_peer(), "hello", Message(arrays={"digests": self.digests()}))]

    def on_average(self, message, sender):
        with torch.no_grad():
            for name, table in self.entity_rows().tensors.items():
                table[message.arrays["positions"]] = message.arrays[name].to(table.dtype)
        self.handshakes += 1
        return []

    def report(self):
        return {"handshakes": self.handshakes}

    def state_dict(self):
        return {"handshakes": self.handshakes}

    def load_state_dict(self, state):
        self.handshakes = state["handshakes"]


class Gossip(PeerStrategy):
    name = "gossip"
    Peer = GossipPeer
    groups = ("entity",)


class RingPeer(GossipPeer):
    """Gossip that greets its next peer ``greetings`` times, then only answers: a run ends by
    itself (no message pending) after a known set of messages, whatever the scheduling."""

    greetings = 2

    def __init__(self, party, strategy, peers):
        super().__init__(party, strategy, peers)
        self.greeted = 1  # start() greets once

    def on_rows(self, message, sender):
        average, hello = super().on_rows(message, sender)
        if self.greeted >= self.greetings:
            return [average]
        self.greeted += 1
        return [average, hello]

    def state_dict(self):
        return {**super().state_dict(), "greeted": self.greeted}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.greeted = state["greeted"]


class FailingRingPeer(RingPeer):
    """client_1's hello handler raises: its greeter's handshakes never complete."""

    def on_hello(self, message, sender):
        if self.name == "client_1":
            raise RuntimeError("injected")
        return super().on_hello(message, sender)


class Ring(Gossip):
    name = "ring"
    Peer = RingPeer


class FailingRing(Gossip):
    name = "failing_ring"
    Peer = FailingRingPeer
