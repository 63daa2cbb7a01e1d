"""Secure aggregation against a server that deviates from the protocol.

Each test plays one attack of an independent security review against the real client
halves (and, for the rollback, the real Flower :class:`~lightning_fedkg.flower.client.ClientRuntime`).
The attacker is the server: it sends whatever messages it likes, restores clients to their
saved states, and reads what comes back. Each test's docstring says what the attack did
on the code before its fix (it recovered the victim's exact quantised upload, or the
exact difference of two aggregates); the test asserts that it is now refused or harmless.
"""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated import secure as sa
from lightning_fedkg.federated.message import Message, decode, encode
from lightning_fedkg.federated.orchestrator import FederatedRun
from lightning_fedkg.federated.secure import SecureClient
from lightning_fedkg.privacy import secagg

from test_protocol import umls_config

pytestmark = pytest.mark.usefixtures("one_thread")

BITS, T, VICTIM = 16, "entity_emb", "client_1"


def secure(**overrides):
    return umls_config(**{"federated__secure_aggregation__enabled": True, **overrides})


def spy_plaintext(monkeypatch) -> dict:
    """``{client: quantised plaintext words of entity_emb}`` as each client masks it."""
    seen = {}
    original = SecureClient._mask

    def spy(self, stage, arrays, extra, info):
        x = arrays[T]
        seen[self.party.name] = secagg.quantise(x.reshape(x.shape[0], -1), BITS, secagg.MODULUS)
        return original(self, stage, arrays, extra, info)

    monkeypatch.setattr(SecureClient, "_mask", spy)
    return seen


def until_unmask(run, round=1):
    """Run the round's exchanges honestly up to (not including) the unmasking; returns the
    server's round record (the keys, the shares it forwarded, the masked uploads)."""
    server = run.server
    selected = server.select_clients(round)
    for stage in server.stages:
        if stage in (sa.SA_UNMASK, getattr(sa, "SA_CHECK", None)):
            break
        replies, failures = run.exchange(round, stage, getattr(server, f"configure_{stage}")(round, selected))
        getattr(server, f"aggregate_{stage}")(round, replies, failures)
    return server._round


def unmask_request(survivors, dropped, round=1) -> Message:
    return Message(config={"sa": {"round": round, "survivors": sorted(survivors), "dropped": sorted(dropped)}})


def rebuild(st, replies: dict, kind: str, owner: str) -> bytes:
    """``owner``'s secret from the ``kind`` (``b`` or ``s``) shares among ``replies``."""
    order = {n: i + 1 for i, n in enumerate(st.parties)}
    shares = {order[h]: sa._bytes(r.arrays[f"{kind}.{owner}"]) for h, r in replies.items()
              if f"{kind}.{owner}" in r.arrays}
    return secagg.combine_secret(shares, 2)


def read_upload(server, st, victim: str, seed: bytes, s_sk: bytes) -> torch.Tensor:
    """The victim's upload, as the server reads it once it holds both of its secrets."""
    y = st.uploads[victim][T].clone()
    y -= sa._words(secagg.derive_key(seed, f"fedkg-sa-self|{st.round}|{st.stage}|{T}"), y.shape)
    for peer in st.shared:
        if peer != victim:
            key = secagg.derive_key(secagg.agree(s_sk, st.s_pk[peer]), sa._pair_info(st.round, st.stage, T, victim, peer))
            pos = server.positions(T, victim, peer)
            y[pos] -= sa._sign(victim, peer) * sa._words(key, (pos.numel(), y.shape[1]))
    return secagg.signed(y)


# ---------------------------------------------------------------- 1. rollback
def test_rollback_through_state_dict_cannot_unmask_a_round_twice(monkeypatch):
    """Attack: honest unmask (the victim's b shares), then load every other client's state
    saved after ``train`` and unmask again claiming the victim dropped (its s shares).
    Before the fix the state held the round's secrets and received shares: the second
    unmask answered, and the server read the victim's exact upload (``torch.equal``)."""
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(), run_dir=None)
    run.align()
    st = until_unmask(run)
    saved = {n: copy.deepcopy(h.state_dict()) for n, h in run.pool.halves.items()}
    everyone = sorted(st.uploads)
    first, failures = run.exchange(1, sa.SA_UNMASK, {n: unmask_request(everyone, []) for n in everyone})
    assert not failures
    others = [n for n in everyone if n != VICTIM]
    for n in others:
        run.pool.halves[n].load_state_dict(saved[n])
    second, failures = run.exchange(1, sa.SA_UNMASK, {n: unmask_request(others, [VICTIM]) for n in others})
    assert not second, "a rolled-back client revealed shares a second time"
    assert all("already" in failures[n] and "AttributeError" not in failures[n] for n in others), failures
    assert VICTIM in seen  # the victim did upload: the attack had its target


def _proxy(runtime, digest):
    class Proxy:  # the server's side of the Flower wire, one ClientRuntime per client
        def handle(self, stage, message, round):
            head = {"kind": "stage", "stage": stage, "round": round, "digest": digest}
            answer, payload = runtime.handle(head, b"" if message.is_empty() else encode(message))
            Proxy.last_state = answer["state"]
            return decode(payload) if payload else Message()

    return Proxy()


def test_rollback_through_the_flower_restore_request_cannot_unmask_a_round_twice(tmp_path, monkeypatch):
    """The same replay through the Flower client (``{"kind": "restore"}`` to the state saved
    after ``train``, even with ``weights_only``). Before the fix the restored state brought
    the round's secrets back and the second unmask revealed the victim's s shares."""
    from lightning_fedkg.flower.client import ClientRuntime
    from lightning_fedkg.flower.data import write_client_folders
    from lightning_fedkg.flower.engine import client_config_text, write_key_file

    seen = spy_plaintext(monkeypatch)
    cfg = secure()
    run = FederatedRun(cfg, run_dir=None)
    key = write_key_file("secret", tmp_path / "key")
    runtimes, digests, after_train = {}, {}, {}
    for folder in write_client_folders(cfg, tmp_path / "data"):
        client = ClientRuntime(folder, key, tmp_path / "work", "run1")
        answer, _ = client.handle({"kind": "hello", "config": client_config_text(cfg)}, b"")
        runtimes[client.name], digests[client.name] = client, answer["digest"]
        run.pool.halves[client.name] = _proxy(client, answer["digest"])
    run.align()
    st = until_unmask(run)
    for n, client in runtimes.items():
        after_train[n] = client.latest()
    everyone = sorted(st.uploads)
    first, failures = run.exchange(1, sa.SA_UNMASK, {n: unmask_request(everyone, []) for n in everyone})
    assert not failures and VICTIM in seen
    others = [n for n in everyone if n != VICTIM]
    for n in others:
        runtimes[n].handle({"kind": "restore", "state": after_train[n], "weights_only": True, "digest": digests[n]}, b"")
    second, failures = run.exchange(1, sa.SA_UNMASK, {n: unmask_request(others, [VICTIM]) for n in others})
    assert not second, "a restored Flower client revealed shares a second time"
    assert all("already" in failures[n] for n in others), failures
    # no saved state, numbered or pinned, holds a private key of the round
    for client in runtimes.values():
        for path in client.state_dir.glob("*.pt"):
            state = torch.load(path, weights_only=False)
            assert (state["half"].get("secure_client") or {}).get("round") is None


# ---------------------------------------------------------------- 2. the threshold
def test_a_client_refuses_a_threshold_the_server_lowered(monkeypatch):
    """Attack: the server sends t = 1 in ``sa_keys``; each 1-of-n share is the secret, so one
    split-view unmask per client (one told the victim survived, one that it dropped) gives
    both secrets. Before the fix the clients used the server's t and the attack read the
    victim's exact upload."""
    run = FederatedRun(secure(), run_dir=None)
    run.align()
    original = run.server.configure_sa_keys

    def lowered(round, selected):
        messages = original(round, selected)
        for m in messages.values():
            m.config["sa"]["threshold"] = 1
        return messages

    run.server.configure_sa_keys = lowered
    replies, failures = run.exchange(1, sa.SA_KEYS, run.server.configure_sa_keys(1, run.server.select_clients(1)))
    assert not replies and set(failures) == {"client_0", "client_1", "client_2"}
    assert all("threshold" in f for f in failures.values()), failures


def test_threshold_at_most_half_is_refused_and_a_split_view_at_the_default_fails(monkeypatch):
    """Attack (n = 4): the server tells two clients that the victim survived (their b shares
    of it) and the other two that it dropped (their s shares). With t = 2 ≤ n/2, which the
    config check accepted, that recovered the victim's exact upload with no rollback. Now
    t ≤ n/2 is refused, and at the default t = 3 the split view gathers too few shares."""
    with pytest.raises(ConfigError, match=r"threshold=2 must be in \[3, 4\]"):
        FederatedRun(secure(data__num_clients=4, federated__secure_aggregation__threshold=2), run_dir=None)
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(data__num_clients=4), run_dir=None)
    run.align()
    st = until_unmask(run)
    assert st.threshold == 3 and len(st.uploads) == 4 and VICTIM in seen
    told_alive, told_dropped = ["client_0", "client_2"], ["client_3"]
    alive = {n: unmask_request(["client_0", "client_1", "client_2"], ["client_3"]) for n in told_alive}
    gone = {n: unmask_request(["client_0", "client_2", "client_3"], [VICTIM]) for n in told_dropped}
    replies, failures = run.exchange(1, sa.SA_UNMASK, {**alive, **gone})
    s_shares = [n for n, r in replies.items() if f"s.{VICTIM}" in r.arrays]
    assert len(s_shares) < st.threshold  # the victim's mask key stays out of reach
    # the clients check the threshold against their own config, not the server's word
    with pytest.raises(ConfigError, match="threshold"):
        sa.check_secure_config(secure(data__num_clients=4, federated__secure_aggregation__threshold=2),
                               run.strategy)
