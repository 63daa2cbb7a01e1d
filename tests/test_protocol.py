"""The federation protocol end to end on the bundled UMLS KG (3 clients, tiny settings).

What these tests pin down is what crosses between parties and what does not: only the
groups a strategy declares (never a module's undeclared table), decoded copies (never
shared storage), keyed hashes in round 0 (never a name), and a failing client that the
federation survives.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_fedkg.cli import main
from lightning_fedkg.data import load_kg
from lightning_fedkg.federated.aggregation import holder_mean
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.checkpoint import load_checkpoint
from lightning_fedkg.federated.message import Message, decode
from lightning_fedkg.federated.federation import FederatedRun, RoundFailed
from lightning_fedkg.run import fit
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.strategy import ClientHalf, Strategy

from conftest import make_small_config

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 2
DIM = 8

pytestmark = pytest.mark.usefixtures("one_thread")

#: On top of the small federation (conftest).
SETTINGS = {
    "model.dim": DIM,
    "train.num_negatives": 8,
    "train.negative_mode": "shared",
    "federated.rounds": ROUNDS,
    "federated.local_epochs": 1,
}


def umls_config(**overrides):
    """The small federation under FedE, dim 8, 2 rounds; ``overrides`` as conftest's
    :func:`make_small_config` takes them (``federated__min_clients=1``)."""
    return make_small_config("fede", **{**SETTINGS, **overrides})


def read_log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "channel_log.jsonl").read_text().splitlines()]


def storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


# ---------------------------------------------------------------- a, e: a plugin through `fedkg fit`
@pytest.mark.slow
def test_plugin_strategy_from_tests_shares_only_the_declared_entity_table(tmp_path, monkeypatch):
    # tests/ has no __init__.py: it is a namespace package, importable from the repository
    # root. Put the root on sys.path explicitly (plain `pytest` does not, `python -m` does).
    monkeypatch.syspath_prepend(str(REPO))
    plugin = importlib.import_module("tests.plugin_strategy")
    run_dir = tmp_path / "run"
    config = tmp_path / "plugin.yaml"
    config.write_text(
        "seed: 0\n"
        "data: {name: umls, num_clients: 3}\n"
        f"model: {{name: transe, dim: {DIM}}}\n"
        "train: {num_negatives: 8, negative_mode: shared}\n"
        "trainer: {accelerator: cpu, progress_bar: false}\n"
        "federated:\n"
        "  strategy: tests.plugin_strategy:PluginFedE\n"
        "  task: tests.plugin_strategy:PrivateTableTask\n"
        f"  rounds: {ROUNDS}\n"
        "  local_epochs: 1\n"
        "  record_payloads: true\n"
    )
    assert main(["fit", "-c", str(config), "--out", str(run_dir)]) == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["strategy"] == "tests.plugin_strategy:PluginFedE" and metrics["rounds"] == ROUNDS

    # The clients' modules were the plugin's: both tables exist, the private one trained locally.
    ckpt = run_dir / "checkpoints" / "client_0"
    states = [load_checkpoint(ckpt / f"round_{r:04d}.pt")["module"] for r in range(1, ROUNDS + 1)]
    assert {plugin.PRIVATE, "model.entity_emb"} <= set(states[0])
    assert states[0][plugin.PRIVATE].shape == states[0]["model.entity_emb"].shape
    assert not torch.equal(states[0][plugin.PRIVATE], states[1][plugin.PRIVATE])

    records = read_log(run_dir)
    # never on the wire: not by name...
    assert not any(plugin.PRIVATE in k or "private" in k for r in records for k in r["shapes"])
    # ...nor by value (a private row of client 0, 8 float32 = 32 bytes, in no payload)
    payloads = [p.read_bytes() for p in sorted((run_dir / "payloads").iterdir())]
    assert len(payloads) == len(records)
    for state in states:
        for row in state[plugin.PRIVATE][:20]:
            needle = row.contiguous().numpy().tobytes()
            assert not any(needle in data for data in payloads)
    # while FedE's entity rows did cross, both ways, every round
    for r in range(1, ROUNDS + 1):
        for name in ("download", "upload"):
            rows = [x for x in records if x["round"] == r and x["name"] == name]
            assert len(rows) == 3 and all(set(x["shapes"]) == {"entity_emb"} for x in rows), (r, name)
            assert all(x["shapes"]["entity_emb"][1] == DIM and x["bytes"] > 0 for x in rows)
    assert not any(k.startswith("relation") for r in records for k in r["shapes"])


# ---------------------------------------------------------------- b: decoded copies
def test_client_halves_run_on_decoded_copies():
    run = FederatedRun(umls_config(), run_dir=None)
    downloads, uploads = {}, {}
    for name, half in run.client_halves.items():
        original = half.on_train

        def on_train(message, round, _name=name, _original=original):
            downloads[_name] = dict(message.arrays)
            return _original(message, round)

        half.on_train = on_train
    aggregate = run.server.aggregate_train

    def spy(round, replies, failures):
        uploads.update({n: dict(m.arrays) for n, m in replies.items()})
        return aggregate(round, replies, failures)

    run.server.aggregate_train = spy
    assert run.train_round(1) == ["client_0", "client_1", "client_2"]

    server = storages(run.server.table.values()) | storages(
        [run.server.alignment.digests, run.server.alignment.holders, *run.server.alignment.index.values()])
    parties = {p.name: storages([*p.module.parameters(), *p.module.buffers()]) for p in run.clients}
    assert all(parties.values()) and server
    for name, mine in parties.items():
        assert not mine & server, name
        for other, theirs in parties.items():
            assert other == name or not mine & theirs, (name, other)
    # what each side received is a copy: a download is no view of the server's table, an
    # upload none of the client's parameters (nor of what that client received)
    for name in parties:
        assert set(downloads[name]) == set(uploads[name]) == {"entity_emb"}
        assert not storages(downloads[name].values()) & (server | parties[name])
        assert not storages(uploads[name].values()) & (server | set().union(*parties.values()))
        assert not storages(uploads[name].values()) & storages(downloads[name].values())

    # Channel.send itself, on a Parameter, a non-contiguous view and an integer tensor
    channel = Channel()
    weight = nn.Parameter(torch.arange(12.0).reshape(3, 4))
    ids = torch.tensor([3, 1, 2])
    sent = Message(arrays={"w": weight, "wt": weight.detach().t(), "ids": ids}, metrics={"loss": 0.5},
                   config={"split": "val"})
    got = channel.send("server", "client_0", "test", sent, 1)
    assert isinstance(got, Message) and got is not sent
    assert got.metrics == {"loss": 0.5} and got.config == {"split": "val"}
    for k, value in sent.arrays.items():
        assert torch.equal(got.arrays[k], value.detach()) and not got.arrays[k].requires_grad
        assert got.arrays[k].untyped_storage().data_ptr() != value.untyped_storage().data_ptr()
    assert len({t.untyped_storage().data_ptr() for t in got.arrays.values()}) == 3
    before = weight.detach().clone()
    got.arrays["w"].add_(100.0)
    got.arrays["wt"].mul_(-1.0)
    got.arrays["ids"].zero_()
    assert torch.equal(weight.detach(), before) and ids.tolist() == [3, 1, 2]
    plain = channel.send("client_0", "server", "plain", {"w": weight}, 1)
    assert plain["w"].untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()
    plain["w"].zero_()
    assert torch.equal(weight.detach(), before)


# ---------------------------------------------------------------- c: no name in round 0
#: Strings of the protocol itself (JSON keys, group and tensor names) that happen to
#: contain UMLS names ("entity", "group"): removed before searching for names.
PROTOCOL_TOKENS = (b"entity_digests", b"relation_digests", b"entity_emb", b'\\"entity\\"', b'\\"groups\\"')


@pytest.mark.slow
def test_alignment_records_carry_digests_and_no_name(tmp_path):
    run_dir = tmp_path / "run"
    metrics = fit(umls_config(federated__record_payloads=True), run_dir)
    umls = load_kg("umls")
    names = [n for n in umls.entity_names + umls.relation_names if len(n) >= 4]
    assert len(names) > 100
    files = sorted((run_dir / "payloads").iterdir())
    records = read_log(run_dir)
    assert len(files) == len(records) > 6
    round0 = [f for f in files if f.name.startswith("r0000_")]
    assert len(round0) == 6
    for f in files:
        data = f.read_bytes()
        for token in PROTOCOL_TOKENS:
            data = data.replace(token, b"")
        leaked = [n for n in names if n.encode("utf-8") in data]
        assert not leaked, (f.name, leaked[:5])
    # round 0: requests carry no array, replies only uint8 [n, 32] digests
    run = FederatedRun(umls_config(), run_dir=None)
    sizes = {p.name: p.kg.num_entities for p in run.clients}
    for f in round0:
        message = decode(f.read_bytes())
        if f.name.endswith("_align_request.safetensors"):
            assert message.arrays == {} and message.metrics == {}
            continue
        sender = f.name.split("_")[2] + "_" + f.name.split("_")[3]
        assert set(message.arrays) == {"entity_digests"}
        digests = message.arrays["entity_digests"]
        assert digests.dtype == torch.uint8 and list(digests.shape) == [sizes[sender], 32]
    for r in (r for r in records if r["round"] == 0):
        assert set(r["dtypes"].values()) <= {"uint8"} and all(s[1:] == [32] for s in r["shapes"].values()), r
    assert metrics["alignment_bytes"] == 32 * sum(sizes.values())


# ---------------------------------------------------------------- d: failing clients
def test_a_client_failing_in_one_round_is_recorded_and_the_run_finishes(tmp_path, monkeypatch):
    on_train = ClientHalf.on_train

    def flaky(self, message, round):
        if self.party.name == "client_1" and round == 1:
            self.receive(message.arrays)  # it got its rows, then crashed while training
            raise RuntimeError("injected crash")
        return on_train(self, message, round)

    aggregate = HolderMeanServer.aggregate_train
    seen = []

    def spy(self, round, replies, failures):
        before = self.table["entity_emb"].clone()
        aggregate(self, round, replies, failures)
        seen.append((round, sorted(replies), dict(failures), before, self.table["entity_emb"].clone(), self.alignment,
                     {n: m.arrays["entity_emb"] for n, m in replies.items()}))

    monkeypatch.setattr(ClientHalf, "on_train", flaky)
    monkeypatch.setattr(HolderMeanServer, "aggregate_train", spy)
    run_dir = tmp_path / "run"
    metrics = fit(umls_config(federated__min_clients=1), run_dir)
    assert metrics["rounds"] == ROUNDS
    expected = [{"round": 1, "stage": "train", "party": "client_1", "error": "RuntimeError: injected crash"}]
    assert metrics["failures"] == expected
    assert json.loads((run_dir / "metrics.json").read_text())["failures"] == expected
    assert all("failed" not in c for c in metrics["clients"])  # it is evaluated again later

    (r1, replied1, failed1, before1, after1, al, up1), (r2, replied2, _, before2, after2, _, _) = seen
    assert (r1, replied1, list(failed1)) == (1, ["client_0", "client_2"], ["client_1"])
    assert (r2, replied2) == (2, ["client_0", "client_1", "client_2"])
    # Round 1 is the holder-mean of the clients that answered: client_1's rows count for
    # nothing, and a row none of them holds keeps its value. (UMLS is dense: no entity is
    # held by client_1 alone, so that last set is empty here; tests/test_strategies.py
    # checks it on a federation where it is not.)
    answered = ["client_0", "client_2"]
    assert torch.equal(after1, holder_mean(before1, [al.index[n] for n in answered], [up1[n] for n in answered]))
    held_by_others = torch.zeros(al.size, dtype=torch.bool)
    for n in answered:
        held_by_others[al.index[n]] = True
    assert torch.equal(after1[~held_by_others], before1[~held_by_others])
    assert not torch.equal(after1, before1)
    assert not torch.equal(after2[al.index["client_1"]], before2[al.index["client_1"]])  # back in round 2
    uploads = [(r["round"], r["sender"]) for r in read_log(run_dir) if r["name"] == "upload"]
    assert (1, "client_1") not in uploads and (2, "client_1") in uploads


def test_too_few_clients_fail_the_round_after_the_retries(caplog):
    run = FederatedRun(umls_config(federated__min_clients=3, federated__max_retries=2), run_dir=None)
    run.align()
    start = {t: v.clone() for t, v in run.server.table.items()}

    def broken(message, round):
        raise RuntimeError("always down")

    run.client_halves["client_1"].on_train = broken
    with pytest.raises(RoundFailed, match="min_clients=3"):
        run.train_round(1)
    attempts = 2 + 1  # the first try and max_retries retries
    assert run.failures == [{"round": 1, "stage": "train", "party": "client_1",
                             "error": "RuntimeError: always down"}] * attempts
    # the log line says where in the package the failure surfaced (the call into on_train)
    assert re.search(r"client_1 failed: RuntimeError: always down \(at federated/\w+\.py:\d+\)", caplog.text)
    assert len(run.channel.records(round=1, receiver="client_0", name="download")) == attempts
    assert all(torch.equal(run.server.table[t], v) for t, v in start.items())  # nothing aggregated
    assert run.last_round == 0


@pytest.mark.slow
def test_parties_with_different_models_share_the_tensors_they_have_in_common(tmp_path, one_thread):
    from lightning_fedkg.config import load_config as _load
    from lightning_fedkg.run import fit as _run

    base = ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
            "trainer.accelerator=cpu", "trainer.progress_bar=false", "federated.strategy=fede",
            "federated.rounds=1", "federated.local_epochs=1", "federated.eval_every=1"]
    _run(_load(None, base + ["federated.parties.client_1.model.name=transd"]), tmp_path / "mixed")
    records = [json.loads(line) for line in (tmp_path / "mixed" / "channel_log.jsonl").read_text().splitlines()]
    rounds = [r for r in records if r["round"] >= 1 and r["bytes"]]
    for r in rounds:
        client = r["receiver"] if r["sender"] == "server" else r["sender"]
        expected = {"entity_emb", "entity_proj"} if client == "client_1" else {"entity_emb"}
        assert set(r["shapes"]) == expected, r
    # the same tensor name with another width (RotatE's entity rows are 2·dim wide) is refused
    with pytest.raises(ValueError, match="entity_emb"):
        _run(_load(None, base + ["federated.parties.client_1.model.name=rotate"]), tmp_path / "bad")


def test_a_party_override_for_a_client_that_does_not_exist_is_refused():
    from lightning_fedkg.config import ConfigError, load_config as _load
    from lightning_fedkg.federated.federation import FederatedRun

    cfg = _load(None, ["data.name=umls", "model.dim=8", "trainer.accelerator=cpu", "federated.strategy=fede",
                       "federated.parties.client_9.model.name=transh"])
    with pytest.raises(ConfigError, match=r"client_9.*not clients of this federation \(client_0, client_1, client_2\)"):
        FederatedRun(cfg, run_dir=None)


class _ConfirmServer(HolderMeanServer):
    """FedE plus a second stage: after aggregating, each client confirms the row checksum
    it received (a stand-in for secure aggregation's key/masked/recover stages)."""

    stages = ("train", "confirm")

    def configure_confirm(self, round, selected):
        from lightning_fedkg.federated.message import Message

        return {n: Message(arrays=self.rows(n), config={"round": round}) for n in selected}

    def aggregate_confirm(self, round, replies, failures):
        self.confirmed = {n: m.metrics["checksum"] for n, m in replies.items()}
        self.confirm_failures = dict(failures)


class _ConfirmClient(ClientHalf):
    def on_confirm(self, message, round):
        from lightning_fedkg.federated.message import Message

        assert message.config["round"] == round
        return Message(metrics={"checksum": float(sum(t.sum() for t in message.arrays.values()))})


class _Confirming(Strategy):
    name = "confirming_fede"
    Server = _ConfirmServer
    Client = _ConfirmClient
    groups = ("entity",)


def test_a_round_runs_every_stage_in_order_and_a_second_stage_failure_is_recorded(one_thread):
    from lightning_fedkg.config import load_config as _load
    from lightning_fedkg.federated.federation import FederatedRun

    cfg = _load(None, ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
                       "trainer.accelerator=cpu", "federated.local_epochs=1",
                       f"federated.strategy={__name__}:_Confirming"])
    run = FederatedRun(cfg, run_dir=None)
    run.train_round(1)
    names = [r.name for r in run.channel.records(round=1)]
    # all downloads/uploads of stage "train" come before any message of stage "confirm"
    assert names.index("confirm_request") > max(i for i, n in enumerate(names) if n == "upload")
    for name, checksum in run.server.confirmed.items():
        expected = float(sum(t.sum() for t in run.server.rows(name).values()))
        assert checksum == pytest.approx(expected, rel=1e-6)

    def broken(message, round):
        raise RuntimeError("confirm lost")

    run.client_halves["client_2"].on_confirm = broken
    run.train_round(2)
    assert set(run.server.confirmed) == {"client_0", "client_1"}
    assert run.failures[-1] == {"round": 2, "stage": "confirm", "party": "client_2",
                                "error": "RuntimeError: confirm lost"}


class _RankingServer(HolderMeanServer):
    """A second evaluation exchange that ranks on the server: after the usual evaluation,
    each client is told where its MRR stands among the clients' and answers with what it
    was told (a stand-in for retrieval's several exchanges: scores up, ranking on the server)."""

    eval_stages = ("evaluate", "rank")

    def aggregate_evaluate(self, round, split, replies, failures):
        self.first = super().aggregate_evaluate(round, split, replies, failures)
        return self.first

    def configure_rank(self, round, split):
        from lightning_fedkg.federated.message import Message

        order = sorted(self.clients, key=lambda n: -dict((e["name"], e["mrr"]) for e in self.first[1])[n])
        return {n: Message(config={"split": split, "position": order.index(n)}) for n in self.clients}

    def aggregate_rank(self, round, split, replies, failures):
        avg, per_client = self.first
        return avg, [{**e, "position": int(replies[e["name"]].metrics["position"])} for e in per_client]


class _RankingClient(ClientHalf):
    def on_rank(self, message, round):
        from lightning_fedkg.federated.message import Message

        return Message(metrics={"position": message.config["position"]})


class _Ranking(Strategy):
    name = "ranking_fede"
    Server = _RankingServer
    Client = _RankingClient
    groups = ("entity",)


def test_evaluation_runs_every_evaluation_stage_and_ranks_on_the_server(one_thread):
    run = FederatedRun(umls_config(federated__strategy=f"{__name__}:_Ranking"), run_dir=None)
    run.train_round(1)
    avg, per_client = run.evaluate("val", 1)
    # The last stage's aggregation is the result; the positions are the MRR order (oracle: a sort).
    order = sorted(per_client, key=lambda e: -e["mrr"])
    assert [e["position"] for e in per_client] == [order.index(e) for e in per_client]
    assert avg == run.server.first[0]
    names = [r.name for r in run.channel.records(round=1)]
    # every message of the first evaluation stage comes before the second stage's
    assert max(i for i, n in enumerate(names) if n in ("eval_download", "eval_result")) < names.index("rank_request")
    assert names.count("rank_request") == names.count("rank") == 3


def test_the_upload_stage_aggregates_the_rows_clients_hold(one_thread):
    run = FederatedRun(umls_config(), run_dir=None)
    run.align()
    for half in run.client_halves.values():  # rows of their own, as after unlearning
        for group in half.shared().values():
            group.write({n: torch.randn_like(t) for n, t in group.tensors.items()})
    uploads = {n: half.upload()["entity_emb"].clone() for n, half in run.client_halves.items()}
    before = run.server.table["entity_emb"].clone()
    run.stage(1, "upload")
    # Oracle: every row is the mean of the rows its holders uploaded; a row no client holds keeps its value.
    sums, counts = torch.zeros_like(before, dtype=torch.float64), torch.zeros(before.shape[0])
    for name, rows in uploads.items():
        index = run.server.client_index("entity_emb", name)
        sums[index] += rows.double()
        counts[index] += 1
    expected = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], before.double())
    assert torch.allclose(run.server.table["entity_emb"].double(), expected, atol=1e-6)
    records = run.channel.records(round=1)
    assert {r.name for r in records} == {"upload"} and all(r.receiver == "server" for r in records)


def test_a_late_answer_is_a_timeout_failure(one_thread):
    from lightning_fedkg.config import load_config as _load
    from lightning_fedkg.federated.federation import FederatedRun, RoundFailed

    cfg = _load(None, ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
                       "trainer.accelerator=cpu", "federated.strategy=fede", "federated.local_epochs=1",
                       "federated.max_retries=0"])
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    before = {t: v.clone() for t, v in run.server.table.items()}
    cfg.federated.client_timeout = 1e-6  # no local epoch ends within a microsecond
    with pytest.raises(RoundFailed):
        run.train_round(1)
    assert {f["party"] for f in run.failures} == {"client_0", "client_1", "client_2"}
    assert all(f["stage"] == "train" and f["error"].startswith("timeout after") for f in run.failures)
    assert all(torch.equal(before[t], run.server.table[t]) for t in before)  # late uploads are discarded


def test_the_transport_is_pluggable(one_thread):
    from lightning_fedkg.config import load_config as _load
    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.federated.federation import FederatedRun

    class CountingTransport(Channel):
        """Another transport with the Channel's interface (here: counts what it delivers)."""

        def __init__(self):
            super().__init__()
            self.delivered = 0

        def send(self, sender, receiver, name, payload, round):
            self.delivered += 1
            return super().send(sender, receiver, name, payload, round)

    transport = CountingTransport()
    cfg = _load(None, ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
                       "trainer.accelerator=cpu", "federated.strategy=fede", "federated.local_epochs=1"])
    run = FederatedRun(cfg, run_dir=None, transport=transport)
    run.train_round(1)
    assert run.channel is transport and transport.delivered == len(transport.records()) == 12  # align 6 + round 6
