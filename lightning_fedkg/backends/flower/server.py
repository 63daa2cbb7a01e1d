"""The server side: our round loop inside a Flower ``ServerApp``, its clients on a Grid.

The ServerApp runs the same :class:`~lightning_fedkg.federated.round_loop.RoundLoop`
as in-process, with a :class:`FlowerClients` pool: nodes register with ``hello`` (a digest
differing from the registered one is rejected), each stage is one Flower message per
client, and a failed, departed or late node is a failure as in-process. The server's
checkpoints store ``{"remote": number}`` per client; the weights stay with the clients.
See docs/deployment.md.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.clients import ClientPool
from lightning_fedkg.federated.message import Message, decode, encode
from lightning_fedkg.federated.strategy import SERVER
from lightning_fedkg.backends.flower.wire import pack, serialized_size, unpack

__all__ = ["FlowerClients", "RegistrationError", "message_type"]

log = logging.getLogger("lightning_fedkg")

REGISTRATION = "registration.json"


class RegistrationError(ConfigError):
    """Not every client registered in time, or one registered twice."""


def message_type(stage: str) -> str:
    """The Flower message type of a stage: ``train``, ``evaluate`` or ``query``."""
    if stage == "train":
        return "train"
    return "evaluate" if stage.startswith("evaluate") or stage in ("retrieve",) else "query"


class FlowerClients(ClientPool):
    """The clients of a run as Flower nodes of ``grid`` (see the module doc)."""

    def __init__(self, run, grid, num_clients: int, run_id: str, config_text: str) -> None:
        fc = run.cfg.federated
        self.grid, self.settings = grid, fc.flower
        self.run_id, self.config_text = run_id, config_text
        self.deadline = fc.client_timeout if fc.client_timeout is not None else fc.flower.reply_timeout
        self.folder = Path(run.run_dir) / "flower" if run.run_dir is not None else None
        self.registered: dict[str, str] = self._read_registration()
        self.nodes: dict[str, int] = {}  # client name -> its live node
        self.known: set[int] = set()  # nodes said hello to (registered or rejected)
        self.states_of: dict[str, int] = {}  # client -> the state number of its last answer
        self.pins: dict[str, set[int]] = {}  # states to pin at each client with its next request
        self.rejections: list[dict] = []
        #: clients that could not go back to a state the run restored (gone, say): they fail
        #: every stage, with this reason, until a later restore succeeds
        self.unrestored: dict[str, str] = {}
        self._digests: dict[str, str] = {}
        self._join(num_clients)
        self.names = sorted(self.nodes, key=lambda n: int(n.rsplit("_", 1)[-1]) if n.rsplit("_", 1)[-1].isdigit() else n)

    # ------------------------------------------------------------------ registration
    def _read_registration(self) -> dict[str, str]:
        path = self.folder / REGISTRATION if self.folder is not None else None
        return json.loads(path.read_text()) if path is not None and path.is_file() else {}

    def _write_registration(self) -> None:
        if self.folder is not None:
            from lightning_fedkg.atomic import write_atomic

            self.folder.mkdir(parents=True, exist_ok=True)
            text = json.dumps(self.registered, indent=1, sort_keys=True).encode()
            write_atomic(self.folder / REGISTRATION, lambda f: f.write(text))

    def _join(self, num_clients: int) -> None:
        """Register nodes until ``num_clients`` clients are in, or ``join_timeout`` passes."""
        end = time.monotonic() + self.settings.join_timeout
        while True:
            self.refresh()
            if len(self.nodes) >= num_clients:
                break
            if time.monotonic() > end:
                raise RegistrationError(
                    f"{len(self.nodes)} of {num_clients} clients registered within federated.flower.join_timeout="
                    f"{self.settings.join_timeout} s ({', '.join(sorted(self.nodes)) or 'none'}); rejected: "
                    f"{[r['error'] for r in self.rejections] or 'none'}")
            time.sleep(max(self.settings.poll_interval, 0.2))
        new = {n: self._digests[n] for n in self.nodes if n not in self.registered}
        if new:
            self.registered.update(new)
            self._write_registration()

    def refresh(self) -> None:
        """Say hello to nodes not seen before; forget nodes that left the Grid."""
        live = set(self.grid.get_node_ids())
        self.nodes = {n: node for n, node in self.nodes.items() if node in live}
        new = sorted(live - self.known)
        if not new:
            return
        head = {"kind": "hello", "run": self.run_id, "config": self.config_text}
        replies, errors = self._send({node: (head, b"") for node in new}, "query", deadline=self.settings.join_timeout)
        for node in new:
            self.known.add(node)
            if node not in replies:
                log.warning("flower: node %d did not answer the registration: %s", node, errors.get(node, "no reply"))
                self.known.discard(node)
                continue
            answer = replies[node][0]
            name, digest = answer["name"], answer["digest"]
            expected = self.registered.get(name)
            if expected is not None and expected != digest or name in self.nodes:
                reason = (f"{name} (node {node}) joined with data whose digest {digest[:16]}... differs from its "
                          f"registration {expected[:16]}...; it is left out of the run" if name not in self.nodes
                          else f"{name} is already registered by node {self.nodes[name]}; node {node} is left out")
                log.error("flower: %s", reason)
                self.rejections.append({"party": name, "node": int(node), "error": reason})
                self._send({node: ({"kind": "reject", "run": self.run_id, "reason": reason}, b"")}, "query",
                           deadline=5.0)
                continue
            self.nodes[name] = node
            self._digests[name] = digest

    # ------------------------------------------------------------------ transport
    def _send(self, requests: dict[int, tuple[dict, bytes]], mtype: str, deadline: float | None):
        """Push one message per node, pull the replies. Returns ``({node: (head, payload,
        size)}, {node: reason})``."""
        from flwr.app import Message as FlowerMessage

        ids = {}
        messages = [FlowerMessage(content=pack(head, payload), dst_node_id=node, message_type=mtype,
                                  group_id=self.run_id) for node, (head, payload) in requests.items()]
        for node, mid in zip(requests, self.grid.push_messages(messages)):
            ids[mid] = node
        replies, errors = {}, {}
        end = None if deadline is None else time.monotonic() + deadline
        last_check = time.monotonic()
        while ids:
            for reply in self.grid.pull_messages(list(ids)):
                node = ids.pop(reply.metadata.reply_to_message_id, None)
                if node is None:
                    continue
                if reply.has_error():
                    errors[node] = f"Flower error {reply.error.code}: {reply.error.reason}"
                else:
                    head, payload = unpack(reply.content)
                    replies[node] = (head, payload, serialized_size(reply.content))
            if not ids:
                break
            now = time.monotonic()
            if end is not None and now > end:
                for node in ids.values():
                    errors[node] = f"no reply within {deadline} s"
                break
            if now - last_check > 1.0:  # a node that left the Grid will never answer
                last_check = now
                live = set(self.grid.get_node_ids())
                for mid, node in list(ids.items()):
                    if node not in live:
                        errors[node] = "the node left the federation (SuperNode stopped or unreachable)"
                        del ids[mid]
            time.sleep(self.settings.poll_interval)
        return replies, errors

    def _request(self, round: int, kind: str, messages: dict[str, Message], channel, wire=None, stage: str = "",
                 extra: dict | None = None) -> tuple[dict[str, tuple[dict, bytes]], dict[str, str]]:
        """Send each client its request (logging the download), collect answers (logging the uploads)."""
        self.refresh()
        failures, requests = {}, {}
        for name, message in messages.items():
            if name in self.unrestored and kind != "restore":
                failures[name] = self.unrestored[name]
                continue
            if name not in self.nodes:
                failures[name] = "not connected" if name in self.registered else "never registered"
                continue
            head = {"kind": kind, "run": self.run_id, "round": int(round), "stage": stage,
                    "digest": self.registered[name], "pin": sorted(self.pins.pop(name, set())), **(extra or {})}
            payload = b"" if message.is_empty() else encode(message)
            if payload and wire is not None:
                content = pack(head, payload)
                channel.relay(SERVER, name, wire[0], payload, round, wire_bytes=serialized_size(content))
            requests[self.nodes[name]] = (head, payload)
        node_names = {node: name for name, node in self.nodes.items()}
        answers, errors = self._send(requests, message_type(stage or kind), self.deadline)
        for node, reason in errors.items():
            failures[node_names[node]] = reason
        out = {}
        for node, (head, payload, size) in answers.items():
            name = node_names[node]
            if "state" in head:
                self.states_of[name] = int(head["state"])
            if payload and wire is not None:
                channel.relay(name, SERVER, wire[1], payload, round, wire_bytes=size)
            out[name] = (head, payload)
        for name, reason in failures.items():
            log.warning("round %d, %s: %s failed: %s", round, stage or kind, name, reason)
        return out, failures

    # ------------------------------------------------------------------ the pool
    def exchange(self, round, stage, messages, wire, channel, timeout):
        answers, failures = self._request(round, "stage", messages, channel, wire, stage=stage)
        return {name: decode(payload) if payload else Message() for name, (_, payload) in answers.items()}, failures

    def deliver(self, round, name, message, down, channel):
        _, failures = self._request(round, "deliver", {name: message}, channel, (down, ""))
        if failures:
            raise RuntimeError(f"{name} could not take the evaluation state: {failures[name]}")

    def states(self, weights_only=False):
        out = {}
        for name in self.names:
            number = self.states_of.get(name)
            out[name] = {"remote": number}
            if weights_only and number is not None:
                self.pins.setdefault(name, set()).add(number)
        return out

    def load_states(self, load, weights_only=False):
        requests, restore = {}, {}
        for name in self.names:
            number = load(name).get("remote")
            if number is None:
                log.warning("flower: the checkpoint holds no state of %s; it continues from its own latest", name)
                continue
            requests[name] = Message()
            restore[name] = number
        for name, number in restore.items():
            _, failures = self._request(0, "restore", {name: requests[name]}, None,
                                        extra={"state": int(number), "weights_only": bool(weights_only)})
            if failures:
                # Its numbers would be those of another state: it sits out (each stage
                # reports it failed, as a client gone mid-run) rather than stop the run.
                self.unrestored[name] = f"could not go back to its state {number}: {failures[name]}"
                log.warning("flower: %s %s; it takes no part until it does", name, self.unrestored[name])
            else:
                self.unrestored.pop(name, None)
