"""Secure aggregation against a server that deviates from the protocol.

Each test plays one attack of an independent security review against the real client
halves (and, for the rollback, the real Flower :class:`~lightning_fedkg.backends.flower.client.ClientRuntime`).
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
from lightning_fedkg.privacy.secure import protocol as sa
from lightning_fedkg.federated.message import Message, decode, encode
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.privacy.secure import SecureClient
from lightning_fedkg.privacy.mechanisms import secagg

from test_protocol import umls_config

pytestmark = pytest.mark.usefixtures("one_thread")

BITS, T, VICTIM = 16, "entity_emb", "client_1"


def secure(**overrides):
    return umls_config(**{"federated__secure_aggregation__enabled": True, **overrides})


#: ``active`` at t = 2 of 3, the smallest t allowed: the mechanisms below are shown at the
#: threshold where an attack has the most room (``active`` defaults to t = ⌊2n/3⌋ + 1 = 3).
ACTIVE_T2 = {"federated__secure_aggregation__active": True, "federated__secure_aggregation__threshold": 2}


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


def unmask_request(st, survivors, dropped) -> Message:
    """The unmasking of the server round ``st`` (its round and attempt) for these lists."""
    return Message(config={"sa": {"round": st.round, "attempt": st.attempt, "survivors": sorted(survivors),
                                  "dropped": sorted(dropped)}})


def check_request(st, survivors) -> Message:
    """``active``'s consistency check of the server round ``st``: sign ``survivors``."""
    return Message(config={"sa": {"round": st.round, "attempt": st.attempt, "survivors": survivors}})


def rebuild(st, replies: dict, kind: str, owner: str) -> bytes:
    """``owner``'s secret from the ``kind`` (``b`` or ``s``) shares among ``replies``."""
    order = {n: i + 1 for i, n in enumerate(st.parties)}
    shares = {order[h]: sa._bytes(r.arrays[f"{kind}.{owner}"]) for h, r in replies.items()
              if f"{kind}.{owner}" in r.arrays}
    return secagg.combine_secret(shares, 2)


def read_upload(server, st, victim: str, seed: bytes, s_sk: bytes) -> torch.Tensor:
    """The victim's upload, as the server reads it once it holds both of its secrets (its
    rows, without the upload-indicator column)."""
    y = st.uploads[victim][T].clone()
    y -= sa._words(secagg.derive_key(seed, f"fedkg-sa-self|{st.round}|{st.stage}|{T}"), y.shape)
    for peer in st.shared:
        if peer != victim:
            key = secagg.derive_key(secagg.agree(s_sk, st.s_pk[peer]), sa._pair_info(st.round, st.stage, T, victim, peer))
            pos = server.positions(T, victim, peer)
            y[pos] -= sa._sign(victim, peer) * sa._words(key, (pos.numel(), y.shape[1]))
    return secagg.signed(y)[:, :-1]


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
    first, failures = run.exchange(1, sa.SA_UNMASK, {n: unmask_request(st, everyone, []) for n in everyone})
    assert not failures
    others = [n for n in everyone if n != VICTIM]
    for n in others:
        run.pool.halves[n].load_state_dict(saved[n])
    second, failures = run.exchange(1, sa.SA_UNMASK, {n: unmask_request(st, others, [VICTIM]) for n in others})
    assert not second, "a rolled-back client revealed shares a second time"
    assert all("already" in failures[n] and "AttributeError" not in failures[n] for n in others), failures
    assert VICTIM in seen  # the victim did upload: the attack had its target


def _proxy(runtime_of, digest):
    class Proxy:  # the server's side of the Flower wire: runtime_of() is the process answering
        def handle(self, stage, message, round):
            head = {"kind": "stage", "stage": stage, "round": round, "digest": digest}
            answer, payload = runtime_of().handle(head, b"" if message.is_empty() else encode(message))
            return decode(payload) if payload else Message()

    return Proxy()


@pytest.mark.parametrize("fresh", [False, True], ids=["one_process", "process_per_message"])
@pytest.mark.slow
def test_rollback_through_the_flower_restore_request_cannot_unmask_a_round_twice(tmp_path, monkeypatch, fresh):
    """The same replay through the Flower client (``{"kind": "restore"}`` to the state saved
    after ``train``, even with ``weights_only``), with the party kept in memory (a client
    worker) or rebuilt from disk for every message (a ClientApp without one). Before the
    fix the restored state brought the round's secrets back and the second unmask revealed
    the victim's s shares."""
    from lightning_fedkg.backends.flower.client import ClientRuntime
    from lightning_fedkg.backends.flower.data import write_client_folders
    from lightning_fedkg.backends.flower.backend import client_config_text, provision_beside_key, write_key_file

    seen = spy_plaintext(monkeypatch)
    cfg = secure()
    run = FederatedRun(cfg, run_dir=None)
    key = write_key_file("secret", tmp_path / "key")
    provision_beside_key(cfg, key, write_client_folders(cfg, tmp_path / "data"))
    runtimes, digests, after_train = {}, {}, {}
    for folder in write_client_folders(cfg, tmp_path / "data"):
        client = ClientRuntime(folder, key, tmp_path / "work", "run1")
        answer, _ = client.handle({"kind": "hello", "config": client_config_text(cfg)}, b"")
        runtimes[client.name], digests[client.name] = client, answer["digest"]

        def runtime_of(name=client.name, folder=folder):
            if fresh:  # a new process: nothing in memory, everything from the client's disk
                runtimes[name] = ClientRuntime(folder, key, tmp_path / "work", "run1")
            return runtimes[name]

        run.pool.halves[client.name] = _proxy(runtime_of, answer["digest"])
    run.align()
    st = until_unmask(run)
    for n, client in runtimes.items():
        after_train[n] = client.latest()
    everyone = sorted(st.uploads)
    first, failures = run.exchange(1, sa.SA_UNMASK, {n: unmask_request(st, everyone, []) for n in everyone})
    assert not failures and VICTIM in seen
    others = [n for n in everyone if n != VICTIM]
    for n in others:
        assert not runtimes[n].secrets_path.exists()  # spent by the unmasking
        restorer = ClientRuntime(runtimes[n].data_path, key, tmp_path / "work", "run1") if fresh else runtimes[n]
        restorer.handle({"kind": "restore", "state": after_train[n], "weights_only": True, "digest": digests[n]}, b"")
    second, failures = run.exchange(1, sa.SA_UNMASK, {n: unmask_request(st, others, [VICTIM]) for n in others})
    assert not second, "a restored Flower client revealed shares a second time"
    assert all("already" in failures[n] for n in others), failures
    # no saved state, numbered or pinned, holds a private key of the round
    for client in runtimes.values():
        for path in client.state_dir.glob("*.pt"):
            state = torch.load(path, weights_only=False)
            assert (state["half"].get("secure_client") or {}).get("round") is None


@pytest.mark.slow
def test_a_flower_restore_does_not_roll_back_what_a_client_spent(tmp_path):
    """Issue 57: what a client released and must never take back (the DP ledger, the attempt
    ids it keyed, a querier's revealed batches) lives in ``spent.json`` beside its states,
    which only grows, and is merged in after every state load. A ``restore`` to the state
    before round 2, then a fresh process: the ledger still holds both uploads and both
    attempt ids stay spent (without the file, the fresh process knew no attempt id: 0)."""
    from lightning_fedkg.backends.flower.backend import client_config_text, provision_beside_key, write_key_file
    from lightning_fedkg.backends.flower.client import ClientRuntime
    from lightning_fedkg.backends.flower.data import write_client_folders

    cfg = secure(federated__dp__enabled=True, federated__dp__noise_multiplier=2.0)
    run = FederatedRun(cfg, run_dir=None)
    key = write_key_file("secret", tmp_path / "key")
    folders = write_client_folders(cfg, tmp_path / "data")
    provision_beside_key(cfg, key, folders)
    runtimes, digests = {}, {}
    for folder in folders:
        client = ClientRuntime(folder, key, tmp_path / "work", "run1")
        answer, _ = client.handle({"kind": "hello", "config": client_config_text(cfg)}, b"")
        digests[client.name] = answer["digest"]

        def runtime_of(name=client.name, folder=folder):  # a fresh process for every message
            runtimes[name] = ClientRuntime(folder, key, tmp_path / "work", "run1")
            return runtimes[name]

        run.pool.halves[client.name] = _proxy(runtime_of, answer["digest"])
    run.align()
    run.train_round(1)
    after_first = {n: runtimes[n].latest() for n in digests}
    run.train_round(2)
    for n, number in after_first.items():
        ClientRuntime(runtimes[n].data_path, key, tmp_path / "work", "run1").handle(
            {"kind": "restore", "state": number, "weights_only": False, "digest": digests[n]}, b"")
    for n in digests:
        fresh = ClientRuntime(runtimes[n].data_path, key, tmp_path / "work", "run1")
        fresh.ready()
        assert [e[0] for e in fresh.half.events] == [1, 2], n
        assert len(fresh.half._attempts) == 2, n  # both rounds' attempt ids, kept as keyed


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
    alive = {n: unmask_request(st, ["client_0", "client_1", "client_2"], ["client_3"]) for n in told_alive}
    gone = {n: unmask_request(st, ["client_0", "client_2", "client_3"], [VICTIM]) for n in told_dropped}
    replies, failures = run.exchange(1, sa.SA_UNMASK, {**alive, **gone})
    s_shares = [n for n, r in replies.items() if f"s.{VICTIM}" in r.arrays]
    assert len(s_shares) < st.threshold  # the victim's mask key stays out of reach
    # the clients check the threshold against their own config, not the server's word
    with pytest.raises(ConfigError, match="threshold"):
        sa.check_secure_config(secure(data__num_clients=4, federated__secure_aggregation__threshold=2),
                               run.strategy)


def _registered_runtime(tmp_path, registered_cfg, roster_cfg=None):
    """A Flower client registered with ``registered_cfg`` (the config the server sends in
    ``hello``), with the policy and identities of ``roster_cfg`` beside its key file (none:
    a policy that agrees with the registration, and no roster)."""
    from lightning_fedkg.privacy.policy import POLICY_FILE, write_policy
    from lightning_fedkg.backends.flower.client import ClientRuntime
    from lightning_fedkg.backends.flower.data import write_client_folders
    from lightning_fedkg.backends.flower.backend import client_config_text, write_key_file

    folders = write_client_folders(registered_cfg, tmp_path / "data")
    key = write_key_file("secret", tmp_path / "org" / "federation.key")
    if roster_cfg is not None:
        from lightning_fedkg.backends.flower.backend import provision_beside_key

        provision_beside_key(roster_cfg, key, folders)
    else:
        write_policy(registered_cfg, key.parent / POLICY_FILE)
    client = ClientRuntime(folders[0], key, tmp_path / "work", "run1")
    answer, _ = client.handle({"kind": "hello", "config": client_config_text(registered_cfg)}, b"")
    return client, answer["digest"]


def _ask_keys(client, digest, threshold):
    message = Message(config={"sa": {"round": 1, "threshold": threshold, "attempt": sa.new_attempt()}})
    return client.handle({"kind": "stage", "stage": sa.SA_KEYS, "round": 1, "digest": digest}, encode(message))


def test_a_flower_client_checks_the_threshold_against_its_own_policy_not_the_registration(tmp_path):
    """Attack (Flower): the server registers the client with a config whose t is 2 (still
    valid for n = 3) where the clients agreed on t = 3, then asks for t = 2. The client's
    whole config comes from that registration, so before the fix the client "checked" t
    against the server's own word and answered; now the registration is refused by the
    policy beside its key file, and t is the roster's (checked in sa_keys, whatever the
    config says: test_a_client_refuses_a_threshold_the_server_lowered)."""
    agreed = secure(federated__secure_aggregation__threshold=3)
    client, digest = _registered_runtime(tmp_path, secure(federated__secure_aggregation__threshold=2), agreed)
    with pytest.raises(ConfigError, match=r"secure_aggregation\.threshold: the run's config has 2, this client's "
                                          r"policy 3"):
        _ask_keys(client, digest, 2)
    client, digest = _registered_runtime(tmp_path / "agreed", agreed, agreed)
    answer, reply = _ask_keys(client, digest, 3)  # the agreed t is answered
    assert set(decode(reply).arrays) == {"c_pk", "s_pk"}


def test_a_flower_client_refuses_a_config_that_turns_secure_aggregation_off(tmp_path):
    """Attack (Flower): the clients were provisioned for secure aggregation, and the server
    registers them with a config that has it off, so that they upload in clear. Before the
    fix the client took the server's config as it came; its policy now pins it on."""
    client, digest = _registered_runtime(tmp_path, umls_config(), secure())
    with pytest.raises(ConfigError, match=r"secure_aggregation\.enabled: the run's config has False"):
        _ask_keys(client, digest, 2)


def test_a_flower_client_without_a_roster_refuses_secure_aggregation(tmp_path):
    """Without a roster the only t a Flower client has is the server's; it refuses to run
    secure aggregation on it (before the fix it answered the server's t = 2)."""
    client, digest = _registered_runtime(tmp_path, secure(federated__secure_aggregation__threshold=2))
    with pytest.raises(ConfigError, match="roster"):
        _ask_keys(client, digest, 2)


# ---------------------------------------------------------------- 3. key substitution
@pytest.mark.parametrize("active", [False, True], ids=["honest_but_curious", "active"])
def test_a_substituted_share_key_reads_the_victim_only_without_active(monkeypatch, active):
    """Attack: in ``sa_shares`` the server gives the victim its own key in place of every
    peer's share-encryption key, decrypts the victim's shares of b and s meant for those
    peers, and unmasks the victim's upload. Without ``active`` (the honest-but-curious
    mode) this works, as the threat model says; with ``active`` the keys carry their
    owners' signatures and the victim refuses to share."""
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(federated__secure_aggregation__active=active), run_dir=None)
    run.align()
    server, selected = run.server, run.server.select_clients(1)
    replies, _ = run.exchange(1, sa.SA_KEYS, server.configure_sa_keys(1, selected))
    server.aggregate_sa_keys(1, replies, {})
    attacker_sk, attacker_pk = secagg.new_keypair()
    messages = server.configure_sa_shares(1, selected)
    for key in [k for k in messages[VICTIM].arrays if k.startswith("c_pk.") and k != f"c_pk.{VICTIM}"]:
        messages[VICTIM].arrays[key] = sa._tensor(attacker_pk)
    replies, failures = run.exchange(1, sa.SA_SHARES, messages)
    if active:
        assert VICTIM not in replies and "signature" in failures[VICTIM]
        return
    server.aggregate_sa_shares(1, replies, failures)
    st = server._round
    shares = {}
    for i, peer in enumerate(st.parties):
        if peer != VICTIM:
            lo, hi = sorted((VICTIM, peer))
            key = secagg.derive_key(secagg.agree(attacker_sk, st.c_pk[VICTIM]), f"fedkg-sa-share|1|{lo}|{hi}")
            shares[i + 1] = secagg.decrypt(key, sa._bytes(st.ciphertexts[peer][VICTIM]), f"1|{VICTIM}->{peer}")
    seed = secagg.combine_secret({i: s[:secagg.CHUNK] for i, s in shares.items()}, 2)
    s_sk = secagg.combine_secret({i: s[secagg.CHUNK:] for i, s in shares.items()}, 2)
    # the peers' shares to the victim, made up under the substituted keys so that it uploads
    messages = server.configure_train(1, selected)
    for peer in st.parties:
        if peer != VICTIM:
            lo, hi = sorted((VICTIM, peer))
            key = secagg.derive_key(secagg.agree(attacker_sk, st.c_pk[VICTIM]), f"fedkg-sa-share|1|{lo}|{hi}")
            made_up = secagg.encrypt(key, bytes(3 * secagg.CHUNK), f"1|{peer}->{VICTIM}")
            messages[VICTIM].arrays[f"sa.ct.{peer}"] = sa._tensor(made_up)
    replies, _ = run.exchange(1, "train", messages)
    st.uploads = {n: {t: secagg.from_wire(v) for t, v in r.arrays.items()} for n, r in replies.items()}
    assert torch.equal(read_upload(server, st, VICTIM, seed, s_sk), seen[VICTIM])


def test_with_active_a_split_view_of_the_survivors_reveals_nothing():
    """Attack (``active``): after the uploads the server asks the clients to sign two
    different survivor lists, to unmask each half against the other's list. Each client
    signs one list per round, and reveals shares only with t signatures on the list it
    signed itself."""
    run = FederatedRun(secure(**ACTIVE_T2), run_dir=None)
    run.align()
    st = until_unmask(run)
    everyone = sorted(st.uploads)
    signed, failures = run.exchange(1, sa.SA_CHECK, {n: check_request(st, everyone)
                                                     for n in everyone})
    assert set(signed) == set(everyone)
    others = [n for n in everyone if n != VICTIM]
    again, failures = run.exchange(1, sa.SA_CHECK, {n: check_request(st, others)
                                                    for n in others})
    assert not again and all("signed the survivors" in failures[n] for n in others)
    # unmasking "without the victim" with the signatures the server has: not the signed list
    sigs = {f"check.{n}": signed[n].arrays["sig"] for n in others}
    asked = {n: Message(arrays=dict(sigs), config=unmask_request(st, others, [VICTIM]).config) for n in others}
    replies, failures = run.exchange(1, sa.SA_UNMASK, asked)
    assert not replies and all("signed" in failures[n] for n in others), failures
    # the honest unmask, with t signatures on the signed list, still completes the round
    run.server.aggregate_sa_check(1, signed, {})
    replies, failures = run.exchange(1, sa.SA_UNMASK, run.server.configure_sa_unmask(1, everyone))
    assert set(replies) == set(everyone) and not failures


# ---------------------------------------------------------------- 3a. signatures name their attempt
def _keyed(run):
    """One honest ``sa_keys`` exchange: the server's round record of the new attempt."""
    server = run.server
    replies, _ = run.exchange(1, sa.SA_KEYS, server.configure_sa_keys(1, server.select_clients(1)))
    server.aggregate_sa_keys(1, replies, {})
    return server._round


def test_a_key_advert_signed_in_one_attempt_is_refused_in_the_next(tmp_path):
    """Finding 5 (issue 57): ``active`` signatures covered the round only, so a key advert
    signed in attempt 1 of a round verified in attempt 2 (on the old code the victim shared
    under client_0's attempt-1 keys: answered, no failure). A peer whose attempt-1 mask key
    the server learnt (it dropped, and its key was rebuilt) could so be replayed. Adverts now
    name the attempt and the federation's roster, and a client keys each attempt once."""
    run = FederatedRun(secure(**ACTIVE_T2), run_dir=tmp_path / "run")
    run.align()
    first = _keyed(run)
    old = {k: first.__dict__[k][IMPERSONATED] for k in ("c_pk", "s_pk", "signatures")}
    second = _keyed(run)  # the retry: a new attempt
    assert second.attempt != first.attempt
    message = run.server.configure_sa_shares(1, second.parties)[VICTIM]
    message.arrays[f"c_pk.{IMPERSONATED}"], message.arrays[f"s_pk.{IMPERSONATED}"] = (
        sa._tensor(old["c_pk"]), sa._tensor(old["s_pk"]))
    message.arrays[f"sig.{IMPERSONATED}"] = sa._tensor(old["signatures"])
    replies, failures = run.exchange(1, sa.SA_SHARES, {VICTIM: message})
    assert VICTIM not in replies and "replayed" in failures[VICTIM], failures
    # an attempt id is keyed once: asking again under the first one is refused
    again = Message(config={"sa": {"round": 1, "threshold": 2, "attempt": first.attempt}})
    replies, failures = run.exchange(1, sa.SA_KEYS, {VICTIM: again})
    assert VICTIM not in replies and "fresh attempt" in failures[VICTIM], failures


def test_survivor_signatures_of_one_attempt_do_not_count_in_the_next(tmp_path):
    """Finding 5 (issue 57): the consistency check signed (round, stage, survivors), so the
    signatures of attempt 1 on a survivor list still counted towards t in attempt 2 (on the
    old code the victim revealed its shares with two attempt-1 signatures beside its own).
    The statement now names the attempt and the round keys the signer shared under."""
    run = FederatedRun(secure(**ACTIVE_T2), run_dir=tmp_path / "run")
    run.align()
    st = until_unmask(run)
    everyone = sorted(st.uploads)
    earlier, _ = run.exchange(1, sa.SA_CHECK, {n: check_request(st, everyone) for n in everyone})
    st = until_unmask(run)  # the retry, to the same survivors
    mine, _ = run.exchange(1, sa.SA_CHECK, {VICTIM: check_request(st, everyone)})
    sigs = {f"check.{n}": earlier[n].arrays["sig"] for n in everyone if n != VICTIM}
    sigs[f"check.{VICTIM}"] = mine[VICTIM].arrays["sig"]
    asked = Message(arrays=sigs, config=unmask_request(st, everyone, []).config)
    replies, failures = run.exchange(1, sa.SA_UNMASK, {VICTIM: asked})
    assert VICTIM not in replies and "1 valid signatures" in failures[VICTIM], failures


# ---------------------------------------------------------------- 3c. the holder sets
def _named_alone(run, mode):
    """One round of ``mode`` in which the server tells the victim that no peer holds any of its
    rows (its masked stage names it alone, no masking positions), then unmasks honestly.
    Returns the server's round record and the unmask replies it got."""
    server, selected = run.server, run.server.select_clients(1)
    replies = {}
    for stage in server.stages:
        messages = getattr(server, f"configure_{stage}")(1, selected)
        if stage == "train":
            m = messages[VICTIM]
            m.config["sa"]["holders"] = {t: [VICTIM] for t in m.config["sa"]["holders"]}
            for k in [k for k in m.arrays if k.startswith("sa.pos.")]:
                del m.arrays[k]
        replies, failures = run.exchange(1, stage, messages)
        if stage == sa.SA_UNMASK or VICTIM in failures:
            return server._round, replies, failures
        getattr(server, f"aggregate_{stage}")(1, replies, failures)
    raise AssertionError("the round never reached its unmasking")


@pytest.mark.parametrize("mode", ["shared_rows", "dense"])
def test_a_server_that_names_no_co_holder_reads_nothing(monkeypatch, mode):
    """Found while declaring every field's stance (issue 57): which peers a client masks a row
    with came from the server's ``holders`` and masking positions, unchecked. A server naming
    no co-holder made the victim mask with its self-mask alone, which the honest unmasking
    then hands over: on the old code the server read the victim's exact upload in both modes,
    with ``active`` (``torch.equal``, every row). Now ``dense`` refuses a holder set other than
    the sharers (it masks every row with every sharer), and ``shared_rows`` uploads only rows
    that at least ``min_holders`` (default 2) parties hold by its own masking: the rows the
    server named it alone for cross as zeros."""
    seen = spy_plaintext(monkeypatch)
    hidden = {"federated__secure_aggregation__hide_aggregate": True, "federated__federation_key": "k" * 20} \
        if mode == "dense" else {}  # active refuses dense without it (next test)
    run = FederatedRun(secure(federated__secure_aggregation__active=True, federated__secure_aggregation__mode=mode,
                              **hidden), run_dir=None)
    run.align()
    st, replies, failures = _named_alone(run, mode)
    if mode == "dense":
        assert VICTIM in failures and "every sharer" in failures[VICTIM], failures
        return
    order = {n: i + 1 for i, n in enumerate(st.parties)}
    shares = {order[h]: sa._bytes(r.arrays[f"b.{VICTIM}"]) for h, r in replies.items() if f"b.{VICTIM}" in r.arrays}
    seed = secagg.combine_secret(shares, st.threshold)
    y = st.uploads[VICTIM][T].clone()
    y -= sa._words(secagg.derive_key(seed, f"fedkg-sa-self|{st.round}|{st.stage}|{T}"), y.shape)
    read = secagg.signed(y)
    assert bool((read == 0).all()) and bool((seen[VICTIM] != 0).any())


def test_active_refuses_dense_mode_without_the_hidden_aggregate():
    """A dense client lays its rows over the union at the indices the server gives it and
    cannot count who else holds them: a server lying about the alignment (a place no other
    client fills, a union it made larger) reads such a row as an aggregate of one. ``active``
    claims to hold against a deviating server, so with dense mode it needs hide_aggregate,
    whose offsets the server cannot take off wherever a row is placed."""
    with pytest.raises(ConfigError, match="mode=dense needs hide_aggregate"):
        FederatedRun(secure(federated__secure_aggregation__active=True, federated__secure_aggregation__mode="dense"),
                     run_dir=None)


# ---------------------------------------------------------------- 3b. a server colluding with a client
INSIDER, IMPERSONATED = "client_2", "client_0"


def _forged_shares_request(run, victim: str, party: str, private: bytes, names=None):
    """``sa_shares`` for ``victim`` in which the server's own keys stand for ``party``'s,
    signed as ``party`` with ``private``; ``names``: the party list the server claims."""
    server = run.server
    c_sk, c_pk = secagg.new_keypair()
    _, s_pk = secagg.new_keypair()
    message = server.configure_sa_shares(1, server._round.parties)[victim]
    if names is not None:
        message.config["sa"]["parties"] = sorted(names)
    message.arrays[f"c_pk.{party}"], message.arrays[f"s_pk.{party}"] = sa._tensor(c_pk), sa._tensor(s_pk)
    statement = sa._keys_statement(run.pool.halves[victim]._federation, 1, server._round.attempt, party, c_pk, s_pk)
    message.arrays[f"sig.{party}"] = sa._tensor(secagg.sign(private, statement))
    return message, c_sk


def _keyed_round(tmp_path):
    run = FederatedRun(secure(**ACTIVE_T2), run_dir=tmp_path / "run")
    run.align()
    server = run.server
    replies, _ = run.exchange(1, sa.SA_KEYS, server.configure_sa_keys(1, server.select_clients(1)))
    server.aggregate_sa_keys(1, replies, {})
    return run


def _coalition_keys(run) -> list[bytes]:
    """Every signing key a server colluding with the insider can make: the insider's own, and
    the identity of the impersonated client as the federation secret derived it before the fix."""
    insider = run.pool.halves[INSIDER]
    return [insider._identity, secagg.derive_key(insider._key, f"fedkg-sa-identity|{IMPERSONATED}")]


def test_a_server_colluding_with_a_client_cannot_sign_for_another(tmp_path):
    """Attack (``active``): the server colludes with client_2, so it holds client_2's
    private identity key and the federation secret. In ``sa_shares`` it gives the victim
    its own keys in place of client_0's, signed as client_0 with every key the coalition
    can make. Before the fix identity keys were derived from the federation secret: the
    forgery verified, the victim encrypted its shares "for client_0" under the server's key
    (which the server then decrypts: the share key substitution of test 3, now signed).
    Each client's key is now its own random one: the victim refuses every forgery, and
    only client_0's real key (which the coalition lacks) would be accepted."""
    run = _keyed_round(tmp_path)
    server = run.server
    for private in _coalition_keys(run):
        message, _ = _forged_shares_request(run, VICTIM, IMPERSONATED, private)
        replies, failures = run.exchange(1, sa.SA_SHARES, {VICTIM: message})
        assert VICTIM not in replies and "signature" in failures[VICTIM], failures
    # the control: the same request signed with client_0's own key is answered, and the
    # server reads the share the victim meant for client_0 (what the forgery would have got)
    message, c_sk = _forged_shares_request(run, VICTIM, IMPERSONATED, run.pool.halves[IMPERSONATED]._identity)
    replies, failures = run.exchange(1, sa.SA_SHARES, {VICTIM: message})
    assert VICTIM in replies and not failures
    key = secagg.derive_key(secagg.agree(c_sk, server._round.c_pk[VICTIM]), f"fedkg-sa-share|1|{IMPERSONATED}|{VICTIM}")
    assert len(secagg.decrypt(key, sa._bytes(replies[VICTIM].arrays[f"ct.{IMPERSONATED}"]),
                              f"1|{VICTIM}->{IMPERSONATED}")) == 3 * secagg.CHUNK


def test_a_server_colluding_with_a_client_cannot_add_peers_outside_the_roster(tmp_path):
    """Attack (``active``): the server seats a made-up peer, client_9, in place of client_0
    (its keys signed with whatever the coalition holds), or adds made-up peers until t is no
    longer a strict majority of the parties. Before the fix client_9's identity was derived
    from the federation secret, so its signature verified and the victim shared with it;
    now a peer outside the roster is refused, and so is t ≤ |parties| / 2."""
    run = _keyed_round(tmp_path)
    server, sybil = run.server, "client_9"
    derived = secagg.derive_key(run.pool.halves[INSIDER]._key, f"fedkg-sa-identity|{sybil}")
    for private in (derived, *_coalition_keys(run)):
        message, _ = _forged_shares_request(run, VICTIM, sybil, private, names=[sybil, VICTIM, INSIDER])
        replies, failures = run.exchange(1, sa.SA_SHARES, {VICTIM: message})
        assert VICTIM not in replies and "roster" in failures[VICTIM], failures
    crowd = [*server._round.parties, "client_8", sybil]
    message, _ = _forged_shares_request(run, VICTIM, sybil, _coalition_keys(run)[1], names=crowd)
    replies, failures = run.exchange(1, sa.SA_SHARES, {VICTIM: message})
    assert VICTIM not in replies and "strict majority" in failures[VICTIM], failures


def _split_view_with_an_insider(run, told_alive, told_dropped):
    """Attack (``active``, the server colluding with client_2): the honest ``told_alive``
    sign the full survivor list, the honest ``told_dropped`` the list without the victim;
    client_2's key signs both. Returns ``(b shares, s shares)`` of the victim the coalition
    then holds (its own, plus what the honest clients revealed), by Shamir index."""
    st = until_unmask(run)
    everyone = sorted(st.uploads)
    without = [n for n in everyone if n != VICTIM]
    insider = run.pool.halves[INSIDER]
    requests = {}
    for signers, survivors, dropped in ((told_alive, everyone, []), (told_dropped, without, [VICTIM])):
        signed, _ = run.exchange(1, sa.SA_CHECK, {n: check_request(st, survivors)
                                                  for n in signers})
        sigs = {f"check.{n}": r.arrays["sig"] for n, r in signed.items()}
        sigs[f"check.{INSIDER}"] = sa._tensor(secagg.sign(insider._identity, insider._check(insider._round, survivors)))
        requests.update({n: Message(arrays=dict(sigs), config=unmask_request(st, survivors, dropped).config)
                         for n in signers})
    replies, _ = run.exchange(1, sa.SA_UNMASK, requests)
    order = {n: i + 1 for i, n in enumerate(st.parties)}
    own_b, own_s = insider._round.received[VICTIM]
    b = {order[INSIDER]: own_b, **{order[h]: sa._bytes(r.arrays[f"b.{VICTIM}"]) for h, r in replies.items()
                                    if f"b.{VICTIM}" in r.arrays}}
    s = {order[INSIDER]: own_s, **{order[h]: sa._bytes(r.arrays[f"s.{VICTIM}"]) for h, r in replies.items()
                                    if f"s.{VICTIM}" in r.arrays}}
    return st, b, s


@pytest.mark.slow
def test_with_active_a_colluding_client_needs_2t_above_n_plus_the_coalition(tmp_path, monkeypatch):
    """The bound of the signed survivor list, shown both ways. A coalition C signs any list,
    so two lists each signed by t clients exist when 2t <= n + |C|: at n = 3, t = 2 (allowed,
    not ``active``'s default) one insider and a split view read the victim's exact upload (the documented
    limit); at n = 4, t = 3 (6 > 4 + 1) every split leaves the coalition short of t shares
    of one of the victim's two secrets."""
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(**ACTIVE_T2), run_dir=tmp_path / "three")
    run.align()
    st, b, s = _split_view_with_an_insider(run, [VICTIM], ["client_0"])
    seed, s_sk = secagg.combine_secret(b, 2), secagg.combine_secret(s, 2)
    assert torch.equal(read_upload(run.server, st, VICTIM, seed, s_sk), seen[VICTIM])
    for told_alive, told_dropped in (([VICTIM], ["client_0", "client_3"]), ([VICTIM, "client_0"], ["client_3"])):
        run = FederatedRun(secure(data__num_clients=4, federated__secure_aggregation__active=True),
                           run_dir=tmp_path / f"four{len(told_alive)}")
        run.align()
        st, b, s = _split_view_with_an_insider(run, told_alive, told_dropped)
        assert st.threshold == 3 and min(len(b), len(s)) < 3, (len(b), len(s))


# ---------------------------------------------------------------- 4. hide_aggregate
def hidden_run(monkeypatch, mode="shared_rows", clients=4):
    rounds = {}
    original = SecureClient._mask

    def spy(self, stage, arrays, extra, info):
        x = arrays[T]
        rounds.setdefault(int(info["round"]), {})[self.party.name] = secagg.quantise(
            x.reshape(x.shape[0], -1), BITS, secagg.MODULUS)
        return original(self, stage, arrays, extra, info)

    monkeypatch.setattr(SecureClient, "_mask", spy)
    run = FederatedRun(secure(data__num_clients=clients, federated__secure_aggregation__hide_aggregate=True,
                              federated__secure_aggregation__mode=mode, federated__federation_key="k"),
                       run_dir=None)
    run.align()
    return run, rounds


def plain_sum(run, quantised: dict) -> torch.Tensor:
    index = run.server.alignment.index
    rows, width = run.server.table[T].shape[0], next(iter(quantised.values())).shape[1]
    total = torch.zeros(rows, width, dtype=torch.int64)
    for n, q in quantised.items():
        total.index_add_(0, index[n], q)
    return torch.remainder(total, secagg.MODULUS)


@pytest.mark.parametrize("mode", ["shared_rows", "dense"])
def test_the_stored_sums_low_bits_are_independent_of_the_plaintext(monkeypatch, mode):
    """Leak: the server stored Σq + c·O with one offset O per aggregation; for an even
    holder count c the low bit of the sum was the plaintext sum's (100% of the coordinates
    for c = 2 and c = 4, and the low 2 bits for c = 4). Each holder now adds its own offset."""
    run, rounds = hidden_run(monkeypatch, mode)
    run.train_round(1)
    stored, count = run.server.hidden[T]["sum"], run.server.hidden[T]["count"]
    plain = plain_sum(run, rounds[1])
    for c, bits in ((2, 1), (4, 3)):
        rows = count == c
        same = ((stored[rows] & bits) == (plain[rows] & bits)).double().flatten()
        n, p = same.numel(), 1 / (bits + 1)
        assert n >= 64, (c, n)
        assert abs(float(same.mean()) - p) < 5 * (p * (1 - p) / n) ** 0.5, (c, float(same.mean()))


def test_a_server_that_reuses_a_serial_learns_no_difference_of_aggregates(monkeypatch):
    """Attack: the offset's serial came from the server; setting its counter back made
    round 2's sums carry round 1's offset, and S2 − S1 was exactly the difference of the
    two plaintext aggregates on every row with the same holders. The offsets now come from
    each holder's own fresh key of that attempt, whatever the server sends."""
    run, rounds = hidden_run(monkeypatch, clients=3)
    run.train_round(1)
    first = run.server.hidden[T]["sum"].clone()
    run.server.serial = 0
    run.train_round(2)
    second = run.server.hidden[T]["sum"]
    assert int(run.server.hidden[T]["serial"].max()) == 1  # the server did reuse serial 1
    leak = torch.remainder(second - first, secagg.MODULUS)
    truth = torch.remainder(plain_sum(run, rounds[2]) - plain_sum(run, rounds[1]), secagg.MODULUS)
    assert float((leak == truth).double().mean()) < 0.01
    # and the clients still read the true aggregate back
    run.load_evaluation_state(2, "val")
    index = run.server.alignment.index
    count = run.server.hidden[T]["count"]
    expected = secagg.signed(plain_sum(run, rounds[2])).double() / (1 << BITS) / count[:, None]
    rows = run.pool.halves["client_0"].shared()["entity"].read()[T]
    assert float((rows.double() - expected[index["client_0"]]).abs().max()) <= 2e-5


# ---------------------------------------------------------------- 5. provisioning
def test_identities_are_private_files_with_a_public_roster_and_survive_a_resume(tmp_path):
    """The run writes ``<run_dir>/identities/`` once: each client's private key readable by
    its owner only, the roster by everyone, and a resumed run signs with the same keys."""
    import json
    import stat

    from lightning_fedkg.privacy import identities

    cfg = secure(**ACTIVE_T2)
    first = FederatedRun(cfg, run_dir=tmp_path / "run")
    folder = tmp_path / "run" / "identities"
    names = sorted(first.pool.halves)
    for name in names:
        assert stat.S_IMODE((folder / f"{name}.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((folder / "roster.json").stat().st_mode) & 0o044 == 0o044
    roster = json.loads((folder / "roster.json").read_text())
    assert sorted(roster["members"]) == names and roster["threshold"] == 2 and roster["num_clients"] == 3
    for name in names:  # each client signs with its own key, the one the roster lists
        assert secagg.identity_public(first.pool.halves[name]._identity).hex() == roster["members"][name]
    assert len({first.pool.halves[n]._identity for n in names}) == len(names)
    resumed = FederatedRun(cfg, run_dir=tmp_path / "run")
    assert all(resumed.pool.halves[n]._identity == first.pool.halves[n]._identity for n in names)
    # a folder written for another policy is refused, not silently replaced
    with pytest.raises(ConfigError, match="Remove"):
        identities.provision(folder, names, 3)


def test_identity_files_errors_name_the_file(tmp_path):
    from lightning_fedkg.privacy import identities

    identities.write_identities(tmp_path, ["a", "b", "c"], threshold=2)
    with pytest.raises(ConfigError, match=r"no identity key for d at .*d\.key"):
        identities.read_private_key(tmp_path, "d")
    with pytest.raises(KeyError, match="not in the roster"):
        identities.read_roster(tmp_path).public_key("d")
    (tmp_path / "roster.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"roster\.json is not an identity roster"):
        identities.read_roster(tmp_path)
    with pytest.raises(ConfigError, match="no identity roster"):
        identities.read_roster(tmp_path / "elsewhere")


def test_an_active_client_without_a_roster_refuses_to_start(monkeypatch):
    """With ``active`` and no identities where the client reads them, building the client
    half is a ConfigError (it has no key of its own and no peer keys to check)."""
    import contextlib

    from lightning_fedkg.federated import federation

    monkeypatch.setattr(federation, "local_identities", lambda *a: contextlib.nullcontext())
    with pytest.raises(ConfigError, match="no identity roster"):
        FederatedRun(secure(**ACTIVE_T2), run_dir=None)


def test_active_defaults_to_a_two_thirds_threshold():
    """``active`` defaults to t = ⌊2n/3⌋ + 1 (the signed survivor list then holds against a
    coalition of fewer than n/3 clients); without it the default stays a strict majority."""
    from lightning_fedkg.methods.fede import FedE

    for n, plain, active in ((3, 2, 3), (4, 3, 3), (6, 4, 5), (10, 6, 7)):
        assert sa.check_secure_config(secure(data__num_clients=n), FedE) == plain
        assert sa.check_secure_config(secure(data__num_clients=n, federated__secure_aggregation__active=True),
                                      FedE) == active


def test_hide_aggregate_refuses_more_clients_than_its_holder_mask_holds():
    """Each row's holders travel as a bit mask in one int64: 64 clients would overflow it."""
    from lightning_fedkg.methods.fede import FedE

    hidden = {"federated__secure_aggregation__hide_aggregate": True, "federated__federation_key": "k"}
    assert sa.check_secure_config(secure(data__num_clients=63, **hidden), FedE) == 32
    with pytest.raises(ConfigError, match="at most 63 clients"):
        sa.check_secure_config(secure(data__num_clients=64, **hidden), FedE)
