"""Secure aggregation (federated.secure_aggregation): masks cancel exactly, the server gets
the holder-mean within the fixed-point error and nothing else, dropouts are recovered.

Each federation check spies on the plaintext a client half produces just before it masks
it (``SecureClient._mask``), so the oracle is the plain holder-mean of exactly what was
masked, computed independently with :func:`~lightning_fedkg.federated.aggregation.holder_mean`.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.aggregation import holder_counts, holder_mean
from lightning_fedkg.federated.message import decode
from lightning_fedkg.federated.federation import FederatedRun, RoundFailed
from lightning_fedkg.run import fit
from lightning_fedkg.privacy.secure import SecureClient, default_threshold
from lightning_fedkg.privacy.mechanisms import secagg

from test_protocol import umls_config

pytestmark = pytest.mark.usefixtures("one_thread")

BITS = 16
#: The fixed-point error of a mean, plus float32 rounding of the stored table.
TOLERANCE = secagg.quantisation_error(BITS) + 1e-6
KEY = "federated.federation_key"


def secure(**overrides):
    settings = {"federated__secure_aggregation__enabled": True, **overrides}
    return umls_config(**settings)


# ---------------------------------------------------------------- primitives
def test_shamir_any_t_shares_rebuild_the_secret_and_fewer_cannot():
    secret = bytes(range(48))
    shares = secagg.split_secret(secret, 3, 5)
    assert len(shares) == 5 and all(len(s) == 48 for s in shares)
    for chosen in ([0, 1, 2], [4, 2, 0], [1, 3, 4]):
        assert secagg.combine_secret({i + 1: shares[i] for i in chosen}, 3) == secret
    # two shares interpolate a wrong polynomial: the result is not the secret
    wrong = secagg.combine_secret({1: shares[0], 2: shares[1], 3: shares[2][:16] + shares[3][16:]}, 3)
    assert wrong != secret
    with pytest.raises(ValueError, match="cannot rebuild"):
        secagg.combine_secret({1: shares[0], 2: shares[1]}, 3)


def test_keystream_is_deterministic_per_key_and_uniform():
    a = secagg.keystream_words(b"k" * 32, 100_000)
    assert torch.equal(a, secagg.keystream_words(b"k" * 32, 100_000))
    b = secagg.keystream_words(b"j" * 32, 100_000)
    assert not torch.equal(a, b)
    assert int(a.min()) >= 0 and int(a.max()) < secagg.MODULUS
    assert abs(float(a.double().mean()) / secagg.MODULUS - 0.5) < 0.01
    # the prefix of a longer stream is the shorter stream (positions do not shift)
    assert torch.equal(secagg.keystream_words(b"k" * 32, 10), a[:10])


def test_x25519_agreement_is_symmetric_and_shares_decrypt_only_for_their_pair():
    a_sk, a_pk = secagg.new_keypair()
    b_sk, b_pk = secagg.new_keypair()
    assert secagg.agree(a_sk, b_pk) == secagg.agree(b_sk, a_pk)
    key = secagg.derive_key(secagg.agree(a_sk, b_pk), "share")
    ct = secagg.encrypt(key, b"secret share", "1|a->b")
    assert secagg.decrypt(key, ct, "1|a->b") == b"secret share"
    from cryptography.exceptions import InvalidTag

    with pytest.raises(InvalidTag):
        secagg.decrypt(key, ct, "1|c->b")  # the server cannot redirect it to another receiver


def test_fixed_point_round_trip_and_overflow():
    x = torch.tensor([[0.1, -2.5, 3.14159], [1e-6, -1e-6, 0.0]])
    q = secagg.quantise(x, BITS, secagg.MODULUS // 2)
    back = secagg.signed(secagg.from_wire(secagg.to_wire(q))).double() / (1 << BITS)
    assert float((back - x.double()).abs().max()) <= secagg.quantisation_error(BITS)
    # a sum of many values wraps in Z_2^32 and still reads back exactly
    words = sum(torch.remainder(q + k * 977_000_000, secagg.MODULUS) for k in range(5))
    assert torch.equal(secagg.signed(words - 5 * 977_000_000 * 2), secagg.signed(5 * q))
    with pytest.raises(ValueError, match="fractional_bits"):
        secagg.quantise(torch.tensor([20_000.0]), BITS, secagg.MODULUS // 2 // 3)


# ---------------------------------------------------------------- the aggregate
def spy_plaintext(monkeypatch):
    """Record, per round, each client's plaintext upload just before it is masked."""
    seen: dict[tuple[int, str], dict] = {}
    original = SecureClient._mask

    def spy(self, stage, arrays, extra, sa):
        seen[(int(sa["round"]), self.party.name)] = {k: v.clone() for k, v in arrays.items()}
        return original(self, stage, arrays, extra, sa)

    monkeypatch.setattr(SecureClient, "_mask", spy)
    return seen


def holder_mean_of(run, seen, round, before, tensor, clients):
    """The plain holder-mean over ``clients``; in ``shared_rows`` a row fewer than
    ``min_holders`` of them hold is kept by its holder (not uploaded), so it stays ``before``."""
    index = run.server.alignments[run.server.group_of[tensor]].index
    expected = holder_mean(before, [index[n] for n in clients], [seen[(round, n)][tensor] for n in clients])
    sa = run.cfg.federated.secure_aggregation
    if sa.mode == "shared_rows" and expected.dim() > 1:
        alone = holder_counts(before.shape[0], [index[n] for n in clients]) < sa.min_holders
        expected[alone] = before[alone]
    return expected


@pytest.mark.parametrize("strategy,tensor,extra", [
    ("fede", "entity_emb", {}),
    ("fede", "entity_emb", {"federated__secure_aggregation__mode": "dense"}),
    ("fedr", "relation_emb", {"data__partition": "random"}),  # clients share relations
    ("fedlu", "avatar_entity_emb", {}),
    ("fedec", "entity_emb", {}),  # a client half with state of its own
    ("fede", "entity_emb", {"federated__secure_aggregation__active": True}),
    ("fedlu", "avatar_entity_emb", {"federated__secure_aggregation__active": True,
                                     "federated__secure_aggregation__mode": "shared_rows"}),
], ids=["fede", "fede_dense", "fedr", "fedlu", "fedec", "fede_active", "fedlu_active"])
@pytest.mark.slow
def test_the_masked_aggregate_is_the_plain_holder_mean(monkeypatch, strategy, tensor, extra):
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(federated__strategy=strategy, **extra), run_dir=None)
    run.align()
    clients = list(run.server.clients)
    for r in (1, 2):
        before = run.server.table[tensor].clone()
        run.train_round(r)
        expected = holder_mean_of(run, seen, r, before, tensor, clients)
        error = float((run.server.table[tensor] - expected).abs().max())
        assert error <= TOLERANCE
        assert not torch.equal(run.server.table[tensor], before)
    # what crossed upwards in the masked stage is 32-bit integers, never floats
    uploads = run.channel.records(sender="client_0", name="upload")
    assert uploads and all(set(r.dtypes.values()) == {"int32"} for r in uploads)


def test_a_masked_upload_is_statistically_unrelated_to_its_plaintext(tmp_path, monkeypatch):
    seen = spy_plaintext(monkeypatch)
    run_dir = tmp_path / "run"
    fit(secure(federated__record_payloads=True, federated__rounds=1, federated__eval_every=1), run_dir)
    (path,) = sorted((run_dir / "payloads").glob("r0001_*_client_1_to_server_upload.safetensors"))
    masked = secagg.from_wire(decode(path.read_bytes()).arrays["entity_emb"])[:, :-1].double().flatten()
    plain = secagg.quantise(seen[(1, "client_1")]["entity_emb"], BITS, secagg.MODULUS).double().flatten()
    n = masked.numel()
    assert n > 1000
    # uniform over Z_2^32: mean 1/2, variance 1/12 (of the word / 2^32), each top bit fair
    u = masked / secagg.MODULUS
    assert abs(float(u.mean()) - 0.5) < 4 * (1 / 12) ** 0.5 / n ** 0.5
    assert abs(float(u.var()) - 1 / 12) < 0.01
    top = (masked >= secagg.MODULUS / 2).double()
    assert abs(float(top.mean()) - 0.5) < 4 * 0.5 / n ** 0.5
    # and uncorrelated with the plaintext, which is far from uniform
    corr = float(torch.corrcoef(torch.stack([u, plain]))[0, 1])
    assert abs(corr) < 4 / n ** 0.5
    assert float((plain.abs() / secagg.MODULUS).max()) < 1e-3


def test_no_plaintext_float_reaches_the_server(tmp_path):
    run_dir = tmp_path / "run"
    fit(secure(federated__record_payloads=True), run_dir)
    upward = [p for p in (run_dir / "payloads").glob("r*_client_*_to_server_*.safetensors")]
    assert upward
    dtypes = {}
    for path in upward:
        name = path.stem.split("_to_server_")[1]
        for tensor in decode(path.read_bytes()).arrays.values():
            dtypes.setdefault(name, set()).add(str(tensor.dtype))
    # keys and shares are bytes, masked uploads 32-bit words; evaluation replies carry metrics only
    assert dtypes["upload"] == {"torch.int32"}
    assert all(d <= {"torch.uint8"} for n, d in dtypes.items() if n.startswith("sa_")), dtypes
    assert set(dtypes) <= {"upload", "sa_keys", "sa_shares", "sa_unmask", "align"}, dtypes


# ---------------------------------------------------------------- dropouts
def drop(run, name, stage, times=None):
    """Make client ``name`` fail its first ``times`` calls of ``stage`` (every call if None)."""
    half = run.client_halves[name]
    original = half.handle
    calls = {"n": 0}

    def failing(s, message, round):
        if s == stage:
            calls["n"] += 1
            if times is None or calls["n"] <= times:
                raise RuntimeError(f"injected dropout in {s}")
        return original(s, message, round)

    half.handle = failing


@pytest.mark.parametrize("stage", ["train", "sa_keys", "sa_shares"])
@pytest.mark.slow
def test_a_client_that_drops_is_left_out_and_the_round_completes(monkeypatch, stage):
    """client_0 drops (every row it holds, client_1 and client_2 hold too); a row whose other
    holders all dropped is the next test's."""
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(), run_dir=None)
    run.align()
    drop(run, "client_0", stage, times=1)
    before = run.server.table["entity_emb"].clone()
    run.train_round(1)
    survivors = ["client_1", "client_2"]
    if stage == "train":  # it had shared its keys: its masks are rebuilt from the others' shares
        masked_by_0 = run.channel.records(round=1, sender="client_0", name="sa_shares")
        assert masked_by_0 and (1, "client_0") not in seen  # it shared, then never uploaded
        unmask = run.channel.records(round=1, sender="client_1", name="sa_unmask")
        assert unmask and "s.client_0" in unmask[0].shapes and "b.client_0" not in unmask[0].shapes
    expected = holder_mean_of(run, seen, 1, before, "entity_emb", survivors)
    assert float((run.server.table["entity_emb"] - expected).abs().max()) <= TOLERANCE
    assert [f["party"] for f in run.failures] == ["client_0"]
    run.train_round(2)  # back in the next round
    assert (2, "client_0") in seen


@pytest.mark.slow
def test_a_row_left_to_one_holder_by_a_dropout_is_not_unmasked(monkeypatch):
    """client_1 drops after its upload was masked with client_2 on the 20 rows only the two
    of them hold: unmasking would show the server client_2's rows there (an aggregate of one;
    before min_holders the round completed so). client_2 refuses to unmask, the round is
    retried, and with client_1 back it completes over everyone."""
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(), run_dir=None)
    run.align()
    drop(run, "client_1", "train", times=1)
    before = run.server.table["entity_emb"].clone()
    run.train_round(1)
    refused = [f for f in run.failures if f["party"] == "client_2"]
    assert refused and "20 uploaded rows" in refused[0]["error"] and "refusing to unmask" in refused[0]["error"]
    expected = holder_mean_of(run, seen, 1, before, "entity_emb", ["client_0", "client_1", "client_2"])
    assert float((run.server.table["entity_emb"] - expected).abs().max()) <= TOLERANCE


def test_more_than_n_minus_t_dropouts_fail_the_round_cleanly_and_it_is_retried(monkeypatch):
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(federated__max_retries=1), run_dir=None)
    run.align()
    assert run.server.threshold == default_threshold(3) == 2
    for name in ("client_1", "client_2"):
        drop(run, name, "train")
    start = run.server.table["entity_emb"].clone()
    with pytest.raises(RoundFailed):
        run.train_round(1)
    assert torch.equal(run.server.table["entity_emb"], start)  # nothing half-aggregated
    server_failures = [f for f in run.failures if f["party"] == "server"]
    assert len(server_failures) == 2 and all("threshold t=2" in f["error"] for f in server_failures)
    # two dropouts on the first attempt only: the retry completes the round with everybody
    run = FederatedRun(secure(), run_dir=None)
    run.align()
    for name in ("client_1", "client_2"):
        drop(run, name, "train", times=1)
    before = run.server.table["entity_emb"].clone()
    run.train_round(1)
    expected = holder_mean_of(run, seen, 1, before, "entity_emb", ["client_0", "client_1", "client_2"])
    assert float((run.server.table["entity_emb"] - expected).abs().max()) <= TOLERANCE
    assert [f["party"] for f in run.failures] == ["client_1", "client_2", "server"]


def test_a_client_never_reveals_both_secrets_of_one_peer():
    run = FederatedRun(secure(), run_dir=None)
    run.align()
    server = run.server
    original = server.configure_sa_unmask

    def lying(round, selected):
        messages = original(round, selected)
        for m in messages.values():
            m.config["sa"]["dropped"] = ["client_1"]  # client_1 uploaded: asking for its key too
        return messages

    server.configure_sa_unmask = lying
    with pytest.raises(RoundFailed):
        run.train_round(1)
    refusals = [f for f in run.failures if f["stage"] == "sa_unmask" and f["party"] != "server"]
    assert refusals and all("refusing to reveal both" in f["error"] for f in refusals)
    assert not run.channel.records(name="sa_unmask")  # no share left any client


def test_a_colluding_client_reveals_only_the_rows_it_alone_shares_with_the_victim(monkeypatch):
    """docs/privacy.md "Collusion", checked: the server, which rebuilds every survivor's self mask
    when it unmasks, colluding with client_2 (its pair key) reads client_1's upload exactly
    on the rows only client_1 and client_2 hold (UMLS by relation: the 20 entities client_0
    lacks), and on the rows client_0 holds too learns nothing: what is left is masked by
    the client_0-client_1 pair mask, uniform and uncorrelated with the plaintext. That last
    mask, from client_0's key, uncovers the rest."""
    from lightning_fedkg.privacy.secure import protocol as sa_module

    calls = {}
    original = SecureClient._mask

    def spy(self, stage, arrays, extra, sa):
        out = original(self, stage, arrays, extra, sa)
        calls[self.party.name] = {"stage": stage, "plain": arrays["entity_emb"].clone(), "extra": dict(extra),
                                  "round": int(sa["round"]), "seed": self._round.seed, "s_sk": self._round.s_sk,
                                  "masked": out["entity_emb"]}
        return out

    monkeypatch.setattr(SecureClient, "_mask", spy)
    run = FederatedRun(secure(), run_dir=None)
    run.align()
    run.train_round(1)
    t, victim = "entity_emb", calls["client_1"]
    stage, rnd = victim["stage"], victim["round"]
    words = secagg.from_wire(victim["masked"])
    plain = secagg.quantise(victim["plain"].reshape(words.shape[0], -1), BITS, secagg.MODULUS)
    plain = torch.cat([plain, torch.ones(plain.shape[0], 1, dtype=plain.dtype)], 1)  # every row uploaded

    def pair_mask(peer: str) -> tuple[Tensor, Tensor]:
        """The client_1-peer mask as ``peer`` computes it: its private key, client_1's public one."""
        mine = calls[peer]
        key = secagg.derive_key(secagg.agree(mine["s_sk"], sa_module._bytes(mine["extra"]["sa.s_pk.client_1"])),
                                sa_module._pair_info(rnd, stage, t, "client_1", peer))
        pos = victim["extra"][f"sa.pos.{peer}.{t}"].long()
        mask = torch.zeros_like(words)
        mask[pos] = sa_module._sign("client_1", peer) * sa_module._words(key, (pos.numel(), words.shape[1]))
        return mask, pos

    self_mask = sa_module._words(secagg.derive_key(victim["seed"], f"fedkg-sa-self|{rnd}|{stage}|{t}"), words.shape)
    with_2, rows_2 = pair_mask("client_2")  # the colluder's
    with_0, rows_0 = pair_mask("client_0")  # the honest client's
    coalition = torch.remainder(words - self_mask - with_2, secagg.MODULUS)
    only_2 = torch.zeros(words.shape[0], dtype=torch.bool)
    only_2[rows_2] = True
    only_2[rows_0] = False
    assert int(only_2.sum()) == 20 and rows_0.numel() * words.shape[1] > 500
    assert torch.equal(secagg.signed(coalition[only_2]), plain[only_2])  # the leak docs/privacy.md states
    hidden = coalition[rows_0].double().flatten()
    u, n = hidden / secagg.MODULUS, hidden.numel()
    assert abs(float(u.mean()) - 0.5) < 4 * (1 / 12) ** 0.5 / n ** 0.5
    assert abs(float(u.var()) - 1 / 12) < 0.01
    corr = float(torch.corrcoef(torch.stack([u, plain[rows_0].double().flatten()]))[0, 1])
    assert abs(corr) < 4 / n ** 0.5
    assert torch.equal(secagg.signed(coalition - with_0), plain)  # every key: everything


def test_rows_too_few_parties_hold_stay_with_their_holder(monkeypatch):
    """``min_holders`` (default 2): under FedR with relations split by relation every relation
    row has one holder, whose aggregate would be that client's row. No such row crosses (its
    upload indicator is 0 and the server's table keeps its initial rows) and each client keeps
    its own trained row through a download; ``min_holders=1`` uploads them as before."""
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(federated__strategy="fedr"), run_dir=None)
    run.align()
    initial = run.server.table["relation_emb"].clone()
    run.train_round(1)
    assert torch.equal(run.server.table["relation_emb"], initial)
    uploads = run.channel.records(round=1, sender="client_0", name="upload")
    assert uploads and uploads[0].shapes["relation_emb"][1] == 8 + 1  # the indicator column
    trained = {n: h.shared()["relation"].read()["relation_emb"].clone() for n, h in run.client_halves.items()}
    run.load_evaluation_state(1, "val")  # the server's download: its initial rows for these
    for name, half in run.client_halves.items():
        assert torch.equal(half.shared()["relation"].read()["relation_emb"], trained[name])
    loose = FederatedRun(secure(federated__strategy="fedr", federated__secure_aggregation__min_holders=1),
                         run_dir=None)
    loose.align()
    before = loose.server.table["relation_emb"].clone()
    loose.train_round(1)
    expected = holder_mean_of(loose, seen, 1, before, "relation_emb", list(loose.server.clients))
    assert float((loose.server.table["relation_emb"] - expected).abs().max()) <= TOLERANCE
    assert not torch.equal(loose.server.table["relation_emb"], before)


# ---------------------------------------------------------------- hidden aggregate
@pytest.mark.parametrize("mode", ["shared_rows", "dense"])
def test_the_hidden_aggregate_is_never_in_the_server_and_the_clients_read_it(monkeypatch, mode):
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(federated__secure_aggregation__hide_aggregate=True, federated__secure_aggregation__mode=mode,
                              federated__federation_key="a-key-the-server-lacks"), run_dir=None)
    run.align()
    initial = run.server.table["entity_emb"].clone()
    run.train_round(1)
    assert torch.equal(run.server.table["entity_emb"], initial)  # the server's floats never move
    expected = holder_mean_of(run, seen, 1, initial, "entity_emb", list(run.server.clients))
    hidden = run.server.hidden["entity_emb"]
    assert int(hidden["count"].min()) >= 1
    server_view = secagg.signed(hidden["sum"]).double() / (1 << BITS) / hidden["count"][:, None]
    assert float((server_view - expected.double()).abs().mean()) > 100  # offset sums are noise to it
    # each client decodes its rows from the evaluation download
    run.load_evaluation_state(1, "val")
    index = run.server.alignment.index
    for name, half in run.client_halves.items():
        rows = half.shared()["entity"].read()["entity_emb"]
        assert float((rows - expected[index[name]]).abs().max()) <= TOLERANCE
    # the downloads carry integers: no float row of the aggregate crosses
    downloads = run.channel.records(round=1, receiver="client_0", name="eval_download")
    assert downloads and downloads[-1].dtypes["entity_emb@sum"] == "int32"


# ---------------------------------------------------------------- settings
def test_secure_aggregation_settings_are_checked():
    with pytest.raises(ConfigError, match="holder-mean strategy"):
        FederatedRun(secure(federated__strategy="single"), run_dir=None)
    with pytest.raises(ConfigError, match=r"threshold=1 must be in \[2, 3\]"):
        FederatedRun(secure(federated__secure_aggregation__threshold=1), run_dir=None)
    with pytest.raises(ConfigError, match="federation_key"):
        FederatedRun(secure(federated__secure_aggregation__hide_aggregate=True), run_dir=None)
    from lightning_fedkg.federated.peer import peer_strategy

    with pytest.raises(ConfigError, match="peer-to-peer"):
        peer_strategy(secure(federated__strategy="fkge"))


@pytest.mark.slow
def test_an_end_to_end_secure_run_learns_like_the_plain_one(tmp_path):
    plain = fit(umls_config(federated__eval_every=2), tmp_path / "plain")
    masked = fit(secure(federated__eval_every=2), tmp_path / "secure")
    assert abs(masked["test"]["mrr"] - plain["test"]["mrr"]) < 0.01
    log = [json.loads(line) for line in (tmp_path / "secure" / "channel_log.jsonl").read_text().splitlines()]
    names = [r["name"] for r in log if r["round"] == 1]
    assert names.index("sa_keys") < names.index("sa_shares") < names.index("upload") < names.index("sa_unmask")
    assert "sa_check" not in names


@pytest.mark.slow
def test_an_active_run_adds_the_signed_survivor_check_and_learns_the_same(tmp_path):
    """``active``: the same aggregate (same mrr as the default mode, a fixed-point mean
    either way), one more exchange (``sa_check``) between the upload and the unmasking."""
    plain = fit(secure(federated__rounds=2, federated__eval_every=2), tmp_path / "secure")
    active = fit(secure(federated__rounds=2, federated__eval_every=2,
                                  federated__secure_aggregation__active=True), tmp_path / "active")
    assert abs(active["test"]["mrr"] - plain["test"]["mrr"]) < 1e-3
    log = [json.loads(line) for line in (tmp_path / "active" / "channel_log.jsonl").read_text().splitlines()]
    names = [r["name"] for r in log if r["round"] == 1 and r["sender"] == "client_0"]
    assert names == ["sa_keys", "sa_shares", "upload", "sa_check", "sa_unmask"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_secure_aggregation_and_dp_run_on_cuda(tmp_path):
    """The masks and DP's noise are made on the host; FedCQA's first CUDA run failed every
    upload where they met the rows on the device. The KGE methods share that upload path:
    on CUDA, a secure round gives the plain round's model (a fixed-point mean) and DP's runs."""
    on = {"trainer__accelerator": "gpu", "federated__eval_every": 2}
    runs = {"plain": fit(umls_config(**on), tmp_path / "plain"),
            "secure": fit(secure(**on), tmp_path / "secure"),
            "dp": fit(umls_config(federated__dp__enabled=True, federated__dp__noise_multiplier=0.5, **on),
                      tmp_path / "dp")}
    assert not any(m["failures"] for m in runs.values()), {k: m["failures"] for k, m in runs.items()}
    assert abs(runs["secure"]["test"]["mrr"] - runs["plain"]["test"]["mrr"]) < 0.01
    assert runs["dp"]["privacy"]["epsilon"] > 0 and runs["dp"]["rounds"] == 2


def test_a_phase_upload_runs_the_whole_secure_protocol(monkeypatch):
    """FedLU's unlearning propagates with the ``upload`` stage outside the round schedule:
    ServerHalf.protocol wraps it in the same four exchanges."""
    seen = spy_plaintext(monkeypatch)
    run = FederatedRun(secure(federated__strategy="fedlu"), run_dir=None)
    run.align()
    run.train_round(1)
    before = run.server.table["avatar_entity_emb"].clone()
    run.stage(2, "upload")
    names = [r.name for r in run.channel.records(round=2) if r.sender == "client_0"]
    assert names == ["sa_keys", "sa_shares", "upload", "sa_unmask"]
    expected = holder_mean_of(run, seen, 2, before, "avatar_entity_emb", list(run.server.clients))
    assert float((run.server.table["avatar_entity_emb"] - expected).abs().max()) <= TOLERANCE
