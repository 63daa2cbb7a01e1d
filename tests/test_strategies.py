"""Strategy halves on a hand-built 3-client federation with hand-set embeddings.

Every exchange goes through a real :class:`Channel` as the runner does it: the server half
configures a message per client, the Channel serializes it, the client half handles the
decoded copy and its reply crosses the Channel back. Parties are fakes whose ``fit``
writes known values (client ``k``: entity rows ``k+1``, relation rows ``-(k+1)``), so
holder-means can be checked by hand. The server's global ids are the sorted keyed hashes
of the names, so expectations are stated per *name* (loader global id) and mapped through
the hash order (:func:`positions`).
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch

from lightning_fedkg.config import ExperimentConfig
from lightning_fedkg.data.federated import FederatedKG
from lightning_fedkg.federated.alignment import federation_key, hash_names
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.strategy import STRATEGIES, ClientHalf
from lightning_fedkg.methods.entire import Entire
from lightning_fedkg.methods.fede import FedE
from lightning_fedkg.methods.fedr import FedR
from lightning_fedkg.methods.single import Single
from lightning_fedkg.federated.strategy import SERVER, ServerContext, Strategy, client_name, num_selected
from lightning_fedkg.methods.entire.strategy import CENTRAL, client_view
from lightning_fedkg.federated.holder_mean import initial_rows
from lightning_fedkg.federated.tasks import METRIC_KEYS
from lightning_fedkg.models import build_model
from lightning_fedkg.models.shareable import InitSpec
from lightning_fedkg.registry import RegistryError

DIM = 4
RHO = (10.0 + 2.0) / DIM  # build_model's defaults: gamma 10, epsilon 2
ENTITY_NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
RELATION_NAMES = ["r_north", "r_south", "r_east", "r_west"]
TASK = SimpleNamespace(metric_keys=METRIC_KEYS, monitor="mrr")

#: Channel names of each stage's two directions (as the runner names them).
WIRE = {"align": ("align_request", "align"), "train": ("download", "upload"),
        "val": ("eval_download", "eval_result"), "test": ("test_download", "test_result")}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


# ---------------------------------------------------------------- the federation
def make_fkg(order=(0, 1, 2), relabel=None, entity_names=ENTITY_NAMES, relation_names=RELATION_NAMES) -> FederatedKG:
    """Entities: 0 at clients 0, 2; 1 and 2 at clients 0, 1; 3 at 1; 4, 5 at 2.
    Relations are disjoint: {0} / {1, 2} / {3}.

    ``order`` picks (and orders) the clients; ``relabel`` (a permutation of the entity
    ids) gives every entity another global id, keeping its name.
    """
    trains = [
        torch.tensor([[0, 0, 1], [1, 0, 2]]),
        torch.tensor([[2, 1, 3], [3, 2, 1]]),
        torch.tensor([[4, 3, 5], [5, 3, 0]]),
    ]
    names = list(entity_names)
    if relabel is not None:
        perm = torch.tensor(relabel)
        trains = [torch.stack([perm[t[:, 0]], t[:, 1], perm[t[:, 2]]], 1) for t in trains]
        names = [None] * len(relabel)
        for old, new in enumerate(relabel):
            names[new] = entity_names[old]
    splits = [{"train": trains[k], "valid": trains[k][:1], "test": trains[k][1:]} for k in order]
    return FederatedKG.from_global_splits(splits, num_entities=6, num_relations=4, entity_names=names,
                                          relation_names=list(relation_names), clean=False)


def make_cfg(model: str = "transe", seed: int = 0, **federated) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.seed = seed
    cfg.model.dim = DIM
    cfg.model.name = model
    cfg.federated.local_epochs = 2
    for k, v in federated.items():
        setattr(cfg.federated, k, v)
    return cfg


def fill_known(party) -> None:
    """Client k's entity rows = k+1, relation rows = -(k+1) (every table of each kind)."""
    k = int(party.name.split("_")[-1])
    with torch.no_grad():
        for n in party.model.entity_parameter_names():
            getattr(party.model, n).fill_(k + 1.0)
        for n in party.model.relation_parameter_names():
            getattr(party.model, n).fill_(-(k + 1.0))


class FakeParty:
    """What a client half needs of a party: name, cfg, module.shareable_groups(), names,
    fit, evaluate, log, task. ``fit`` calls ``train(self)`` (default: :func:`fill_known`)."""

    def __init__(self, name, kg, cfg, names, train=fill_known, seed=0):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = build_model(cfg.model.name, kg.num_entities, kg.num_relations, DIM)
        self.module = SimpleNamespace(model=self.model, shareable_groups=self.model.shareable_groups)
        self.name, self.kg, self.cfg, self.names, self.task = name, kg, cfg, names, TASK
        self.train = train
        self.fits: list[int] = []
        self.evaluated: list[str] = []
        self.logged: list[tuple[dict, int]] = []

    def fit(self, epochs):
        self.fits.append(epochs)
        if self.train is not None:
            self.train(self)
        return {"loss": 0.25, "examples": int(self.kg.triples("train").shape[0])}

    def evaluate(self, split):
        self.evaluated.append(split)
        k = int(self.name.split("_")[-1]) if self.name.startswith("client_") else 9
        return {**{m: 0.1 * (k + 1) for m in METRIC_KEYS}, "count": 2, "triples": k + 1}

    def log(self, scalars, round):
        self.logged.append((scalars, round))


def param(party, name: str) -> torch.Tensor:
    return getattr(party.model, name).detach()


class Federation:
    """A server half, one client half per fake party, a Channel between them."""

    def __init__(self, strategy: type[Strategy], cfg=None, fkg=None, train=fill_known, make_party=False):
        self.strategy = strategy
        self.cfg = cfg or make_cfg()
        self.fkg = fkg or make_fkg()
        self.parties = [
            FakeParty(client_name(k), kg, self.cfg, {"entity": list(kg.entity_names), "relation": list(kg.relation_names)},
                      train=train, seed=100 + k)
            for k, kg in enumerate(self.fkg.clients)
        ]
        self.names = [p.name for p in self.parties]
        self.party = {p.name: p for p in self.parties}
        self.halves = {p.name: strategy.Client(p, strategy) for p in self.parties}
        self.made: list[tuple[str, int, int]] = []
        ctx = ServerContext(self.cfg, self.names, TASK)
        if make_party:
            ctx.fkg, ctx.make_party = self.fkg, self._make_central
        self.server = strategy.Server(ctx, strategy)
        self.channel = Channel()

    def _make_central(self, name, kg):
        self.made.append((name, kg.num_entities, kg.num_relations))
        return FakeParty(name, kg, self.cfg, {}, train=None, seed=7)

    # -------------------------------------------------------------- exchanges
    def exchange(self, stage: str, messages: dict[str, Message], round: int, wire: str | None = None):
        down, up = WIRE[wire or stage]
        replies = {}
        for name, message in messages.items():
            received = message if message.is_empty() else self.channel.send(SERVER, name, down, message, round)
            reply = self.halves[name].handle(stage, received, round) or Message()
            replies[name] = reply if reply.is_empty() else self.channel.send(name, SERVER, up, reply, round)
        return replies

    def align(self):
        messages = self.server.configure_align()
        if messages:
            self.server.aggregate_align(self.exchange("align", messages, 0), {})
        return self

    def train(self, round: int, selected=None):
        selected = self.names if selected is None else selected
        replies = self.exchange("train", self.server.configure_train(round, selected), round)
        self.server.aggregate_train(round, replies, {})
        return replies

    def evaluate(self, round: int, split: str = "val"):
        replies = self.exchange("evaluate", self.server.configure_evaluate(round, split), round, wire=split)
        return self.server.aggregate_evaluate(round, split, replies, {})


def key(cfg) -> bytes:
    return federation_key(cfg.federated.federation_key, cfg.seed)


def positions(alignment, names: list[str], cfg) -> torch.Tensor:
    """``pos[g]``: the server's row of the item the loader calls ``g`` (the hash-order permutation)."""
    digests = hash_names(names, key(cfg))
    match = (digests[:, None, :] == alignment.digests[None, :, :]).all(-1)
    assert bool((match.sum(1) == 1).all()), "every name's digest is one row of the union"
    return match.float().argmax(1)


def table(fed: Federation, name: str = "entity_emb") -> torch.Tensor:
    return fed.server.table[name]


# ---------------------------------------------------------------- selection
@pytest.mark.parametrize("fraction, clients, expected",
                         [(1.0, 3, 3), (0.5, 10, 5), (0.1, 3, 1), (0.25, 10, 3), (0.01, 5, 1), (0.34, 3, 1),
                          (0.5, 3, 2), (0.15, 10, 2)])
def test_num_selected(fraction, clients, expected):
    assert num_selected(fraction, clients) == expected


def test_num_selected_rejects_bad_fraction():
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError):
            num_selected(bad, 3)


def test_selection_is_seeded_distinct_and_resumable():
    names = [client_name(k) for k in range(10)]

    def server(seed=0):
        return FedE.Server(ServerContext(make_cfg(seed=seed, fraction=0.5), names, TASK), FedE)

    s = server()
    picks = [s.select_clients(r) for r in range(1, 21)]
    for p in picks:
        assert len(p) == 5 and len(set(p)) == 5 and set(p) <= set(names)
        assert p == sorted(p, key=names.index)  # in client order
    assert len({tuple(p) for p in picks}) > 1  # the draw changes between rounds
    state = s.state_dict()
    nxt = [s.select_clients(r) for r in range(21, 24)]
    s2 = server()
    assert s2.select_clients(1) == picks[0]  # same seed, same first draw
    s2.load_state_dict(state)
    assert [s2.select_clients(r) for r in range(21, 24)] == nxt  # resumed mid-run
    other = server(seed=1)
    assert [other.select_clients(r) for r in range(1, 21)] != picks


# ---------------------------------------------------------------- FedE: alignment
def test_fede_alignment_index_maps_and_holders_match_the_loader_up_to_hash_order():
    fed = Federation(FedE)
    before = torch.get_rng_state()
    fed.align()
    assert torch.equal(torch.get_rng_state(), before)  # the server's draws use no global RNG
    al = fed.server.alignment
    assert al.size == 6 and set(al.index) == set(fed.names)
    assert bool((al.digests[1:] != al.digests[:-1]).any(1).all())  # distinct rows
    pos = positions(al, ENTITY_NAMES, fed.cfg)
    assert sorted(pos.tolist()) == list(range(6))
    global_digests = hash_names(ENTITY_NAMES, key(fed.cfg))
    for k, name in enumerate(fed.names):
        # union[index[c]] is the same entity as the loader's entity_index[c], row for row
        assert torch.equal(al.digests[al.index[name]], global_digests[fed.fkg.entity_index[k]])
        assert al.index[name].tolist() == pos[fed.fkg.entity_index[k]].tolist()
    assert al.holders[pos].tolist() == fed.fkg.entity_existence().sum(0).tolist() == [2, 2, 2, 1, 1, 1]
    # round 0 on the wire: digests only, one 32-byte row per entity a client holds
    requests = fed.channel.records(round=0, name="align_request")
    replies = fed.channel.records(round=0, name="align")
    assert [r.receiver for r in requests] == fed.names and all(r.bytes == 0 for r in requests)
    assert [r.shapes for r in replies] == [{"entity_digests": [3, 32]}] * 3
    assert all(r.dtypes == {"entity_digests": "uint8"} for r in replies)
    assert all(r.config == ("groups",) for r in replies)


def test_fede_initial_table_is_seeded_and_within_the_declared_range():
    fed = Federation(FedE).align()
    t = table(fed)
    assert set(fed.server.table) == {"entity_emb"}
    assert t.shape == (6, DIM) and t.dtype == torch.float32
    assert t.abs().max() <= RHO and t.std() > 0.1 * RHO
    assert torch.equal(table(Federation(FedE).align()), t)  # same seed, same table
    assert not torch.equal(table(Federation(FedE, make_cfg(seed=1)).align()), t)


def test_fede_initial_rows_depend_only_on_the_digest():
    a = Federation(FedE).align()
    # Another federation: clients 2 and 0 only (entity "delta" is absent), in that order,
    # with every entity under another global id.
    b = Federation(FedE, fkg=make_fkg(order=(2, 0), relabel=[5, 3, 1, 0, 2, 4])).align()
    assert b.server.alignment.size == 5
    common = [n for n in ENTITY_NAMES if n != "delta"]
    pa = positions(a.server.alignment, common, a.cfg)
    pb = positions(b.server.alignment, common, b.cfg)
    assert pa.tolist() != pb.tolist()  # the rows sit elsewhere...
    assert torch.equal(table(a)[pa], table(b)[pb])  # ...with the same values
    # and each is what initial_rows draws from that name's digest alone
    spec = InitSpec("uniform", (-RHO, RHO))
    for n, p in zip(common, pa.tolist()):
        alone = initial_rows(hash_names([n], key(a.cfg)), [DIM], spec, a.cfg.seed, "entity_emb")
        assert torch.equal(alone[0], table(a)[p]), n


# ---------------------------------------------------------------- FedE: rounds
def test_fede_round_downloads_rows_keeps_relations_and_holder_means_uploads():
    fed = Federation(FedE).align()
    al = fed.server.alignment
    start = table(fed).clone()
    relations_before = [param(p, "relation_emb").clone() for p in fed.parties]
    received = {}

    def train(party):  # what the client holds when fit runs: the downloaded rows
        received[party.name] = (param(party, "entity_emb").clone(), param(party, "relation_emb").clone())
        fill_known(party)

    for p in fed.parties:
        p.train = train
    replies = fed.train(1)
    for k, name in enumerate(fed.names):
        entity_rows, relation_rows = received[name]
        assert torch.equal(entity_rows, start[al.index[name]])
        assert torch.equal(relation_rows, relations_before[k])  # relations never came from the server
        assert fed.party[name].fits == [fed.cfg.federated.local_epochs]
        assert fed.party[name].logged == [({"train/loss": 0.25}, 1)]
        assert set(replies[name].arrays) == {"entity_emb"} and replies[name].metrics["loss"] == 0.25
    # entity: holders -> mean of (k+1): 0:{0,2}->2, 1:{0,1}->1.5, 2:{0,1}->1.5, 3:{1}->2, 4,5:{2}->3
    pos = positions(al, ENTITY_NAMES, fed.cfg)
    expected = torch.tensor([2.0, 1.5, 1.5, 2.0, 3.0, 3.0])
    assert torch.equal(table(fed)[pos], expected[:, None].expand(6, DIM))
    # What crossed in round 1: only float entity rows, n_c x DIM each way, through the Channel.
    records = fed.channel.records(round=1)
    assert [r.name for r in records] == ["download", "upload"] * 3
    assert [(r.sender, r.receiver) for r in records[:2]] == [(SERVER, "client_0"), ("client_0", SERVER)]
    for rec in records:
        assert rec.shapes == {"entity_emb": [3, DIM]} and rec.dtypes == {"entity_emb": "float32"}
    assert sum(r.bytes for r in records) == 2 * (3 + 3 + 3) * DIM * 4
    # the clients still hold their own relation rows
    for k, p in enumerate(fed.parties):
        assert torch.equal(param(p, "relation_emb"), torch.full_like(relations_before[k], -(k + 1.0)))


@pytest.mark.parametrize("aggregation", ["selected_holders", "all_holders"])
def test_fede_unsampled_holders_selected_vs_all_holders(aggregation):
    fed = Federation(FedE, make_cfg(aggregation=aggregation)).align()
    pos = positions(fed.server.alignment, ENTITY_NAMES, fed.cfg)
    start = table(fed)[pos].clone()  # by loader id
    fed.train(1, selected=["client_0"])
    after = table(fed)[pos]
    # Entities 3, 4, 5 have no sampled holder: unchanged in both variants.
    assert torch.equal(after[3:], start[3:])
    if aggregation == "selected_holders":
        assert torch.equal(after[:3], torch.ones(3, DIM))
    else:
        # entities 0, 1, 2 have 2 holders each, only client 0 was sampled: E + (1 - E) / 2.
        base = start[:3].double()
        assert torch.equal(after[:3], (base + (1.0 - base) / 2).float())
        assert torch.allclose(after[:3], start[:3] + (1.0 - start[:3]) / 2, atol=1e-6)
    assert [r.receiver for r in fed.channel.records(name="download")] == ["client_0"]
    assert [p.fits for p in fed.parties] == [[2], [], []]


@pytest.mark.parametrize("aggregation", ["selected_holders", "all_holders"])
def test_fede_rows_of_a_failed_client_keep_their_value(aggregation):
    # client_1 was selected but raised: only clients 0 and 2 answer the round.
    fed = Federation(FedE, make_cfg(aggregation=aggregation)).align()
    pos = positions(fed.server.alignment, ENTITY_NAMES, fed.cfg)
    start = table(fed)[pos].clone()
    messages = fed.server.configure_train(1, fed.names)
    replies = fed.exchange("train", {n: m for n, m in messages.items() if n != "client_1"}, 1)
    fed.server.aggregate_train(1, replies, {"client_1": "RuntimeError: boom"})
    after = table(fed)[pos]
    assert torch.equal(after[3], start[3])  # "delta": held by client_1 alone
    assert torch.equal(after[[0, 4, 5]], torch.tensor([2.0, 3.0, 3.0])[:, None].expand(3, DIM))
    if aggregation == "selected_holders":  # 1, 2 held by clients 0 (answered) and 1 (failed)
        assert torch.equal(after[1:3], torch.ones(2, DIM))
    else:
        base = start[1:3].double()
        assert torch.equal(after[1:3], (base + (1.0 - base) / 2).float())


def test_fede_evaluation_sends_the_aggregated_rows_and_the_split():
    fed = Federation(FedE).align()
    fed.train(1)
    al = fed.server.alignment
    for p in fed.parties:  # local changes after the round that evaluation must overwrite
        with torch.no_grad():
            p.model.entity_emb.fill_(42.0)
    avg, per_client = fed.evaluate(5, "val")
    records = fed.channel.records(round=5)
    assert [(r.sender, r.receiver, r.name) for r in records] == [
        x for k in range(3) for x in ((SERVER, f"client_{k}", "eval_download"), (f"client_{k}", SERVER, "eval_result"))]
    for k, (p, down, up) in enumerate(zip(fed.parties, records[::2], records[1::2])):
        assert down.config == ("split",) and down.shapes == {"entity_emb": [3, DIM]}
        assert up.shapes == {} and set(up.metrics) >= set(METRIC_KEYS)
        assert torch.equal(param(p, "entity_emb"), table(fed)[al.index[p.name]])
        assert torch.equal(param(p, "relation_emb"), torch.full((p.kg.num_relations, DIM), -(k + 1.0)))
        assert p.evaluated == ["val"] and p.fits == [2]  # evaluating does not train
    # triple-weighted average of client metrics 0.1 (k+1) with weights k+1
    assert avg["mrr"] == pytest.approx((0.1 * 1 + 0.2 * 2 + 0.3 * 3) / 6)
    assert [e["name"] for e in per_client] == fed.names
    # a client that failed to evaluate gets no weight
    replies = {n: Message(metrics=fed.party[n].evaluate("val")) for n in ("client_0", "client_2")}
    avg, per_client = fed.server.aggregate_evaluate(6, "val", replies, {"client_1": "RuntimeError: boom"})
    assert per_client[1] == {"name": "client_1", "failed": "RuntimeError: boom", "triples": 0}
    assert avg["mrr"] == pytest.approx((0.1 * 1 + 0.3 * 3) / 4)


def test_fede_server_state_dict_roundtrip():
    fed = Federation(FedE, make_cfg(fraction=0.67)).align()
    fed.train(1, fed.server.select_clients(1))
    buffer = io.BytesIO()
    torch.save(fed.server.state_dict(), buffer)  # plain tensors and containers only
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh = Federation(FedE, make_cfg(fraction=0.67))  # never aligned
    assert fresh.server.alignment is None and fresh.server.table == {}
    fresh.server.load_state_dict(state)
    s, t = fed.server, fresh.server
    assert torch.equal(t.table["entity_emb"], s.table["entity_emb"])
    assert torch.equal(t.alignment.digests, s.alignment.digests)
    assert torch.equal(t.alignment.holders, s.alignment.holders)
    assert {n: i.tolist() for n, i in t.alignment.index.items()} == {n: i.tolist() for n, i in s.alignment.index.items()}
    for name in fed.names:
        assert torch.equal(t.rows(name)["entity_emb"], s.rows(name)["entity_emb"])
    assert [t.select_clients(r) for r in range(2, 6)] == [s.select_clients(r) for r in range(2, 6)]
    # the state is a snapshot: later rounds do not change it
    snapshot = s.state_dict()
    fed.train(2)
    assert not torch.equal(snapshot["table"]["entity_emb"], s.table["entity_emb"])


def test_fede_shares_every_declared_entity_tensor_of_transd():
    fed = Federation(FedE, make_cfg(model="transd")).align()
    model = fed.parties[0].model
    declared = set(model.shareable_groups()["entity"].tensors)
    assert declared == set(model.entity_parameter_names()) == {"entity_emb", "entity_proj"}
    assert set(fed.server.table) == declared
    for t in fed.server.table.values():
        assert t.shape == (6, DIM)
    fed.train(1)
    pos = positions(fed.server.alignment, ENTITY_NAMES, fed.cfg)
    expected = torch.tensor([2.0, 1.5, 1.5, 2.0, 3.0, 3.0])[:, None].expand(6, DIM)
    for name in declared:
        assert torch.equal(fed.server.table[name][pos], expected), name
    for rec in fed.channel.records(round=1):
        assert set(rec.shapes) == declared, rec
    assert not any(n.startswith("relation_") for r in fed.channel.records() for n in r.shapes)


@pytest.mark.parametrize("aggregation", ["selected_holders", "all_holders"])
def test_identical_clients_make_aggregation_the_identity(aggregation):
    # Three clients with the same KG: every entity has three holders.
    same = torch.tensor([[0, 0, 1], [1, 1, 2], [2, 0, 3]])
    fkg = FederatedKG.from_global_splits([{"train": same, "valid": same[:1], "test": same[1:]}] * 3,
                                         num_entities=4, num_relations=2, entity_names=ENTITY_NAMES[:4],
                                         relation_names=RELATION_NAMES[:2], clean=False)
    # fit is a no-op: every client uploads exactly the rows it received
    fed = Federation(FedE, make_cfg(aggregation=aggregation), fkg=fkg, train=None).align()
    start = table(fed).clone()
    fed.train(1)
    assert torch.equal(table(fed), start)

    def same_values(party):  # every client writes the same value per entity name
        with torch.no_grad():
            for j, n in enumerate(party.names["entity"]):
                party.model.entity_emb[j] = 0.1 * (ENTITY_NAMES.index(n) + 1) + torch.arange(DIM) / 3.0

    for p in fed.parties:
        p.train = same_values
    fed.train(2)
    pos = positions(fed.server.alignment, ENTITY_NAMES[:4], fed.cfg)
    assert torch.equal(table(fed)[pos], fed.parties[0].model.entity_emb.detach())


# ---------------------------------------------------------------- FedR
def test_fedr_shares_only_relations_and_disjoint_relations_pass_through():
    def random_relations(party):
        with torch.no_grad():
            party.model.relation_emb.copy_(torch.randn_like(party.model.relation_emb))

    fed = Federation(FedR, train=random_relations)
    entities_before = [param(p, "entity_emb").clone() for p in fed.parties]
    fed.align()
    al = fed.server.alignment
    assert set(fed.server.table) == {"relation_emb"} and fed.server.table["relation_emb"].shape == (4, DIM)
    assert al.holders.tolist() == [1, 1, 1, 1]
    pos = positions(al, RELATION_NAMES, fed.cfg)
    for k, name in enumerate(fed.names):
        assert al.index[name].tolist() == pos[fed.fkg.relation_index[k]].tolist()
    assert [r.shapes for r in fed.channel.records(round=0, name="align")] == [
        {"relation_digests": [1, 32]}, {"relation_digests": [2, 32]}, {"relation_digests": [1, 32]}]
    start = fed.server.table["relation_emb"].clone()
    torch.manual_seed(3)
    fed.train(1)
    for k, p in enumerate(fed.parties):
        assert torch.equal(param(p, "entity_emb"), entities_before[k])  # entities stay local
        # One holder per relation: the "mean" is the client's own rows, exactly (FedR = Single here).
        assert torch.equal(fed.server.table["relation_emb"][al.index[p.name]], param(p, "relation_emb"))
    assert not torch.equal(fed.server.table["relation_emb"], start)
    records = fed.channel.records(round=1)
    assert all(set(r.shapes) == {"relation_emb"} for r in records)
    assert sum(r.bytes for r in records) == 2 * (1 + 2 + 1) * DIM * 4
    assert not any(n.startswith("entity") for r in fed.channel.records() for n in r.shapes)


# ---------------------------------------------------------------- Single
def test_single_selects_everyone_and_sends_no_arrays():
    fed = Federation(Single, make_cfg(fraction=0.34))
    generator = fed.server.generator.get_state()
    assert fed.server.select_clients(1) == fed.names  # fraction ignored
    assert torch.equal(fed.server.generator.get_state(), generator)  # no draw
    assert fed.server.configure_align() == {}
    fed.align()
    assert all(h.shared() == {} and h.upload() == {} for h in fed.halves.values())
    before = [param(p, "entity_emb").clone() for p in fed.parties]
    messages = fed.server.configure_train(1, fed.names)
    assert all(m.is_empty() for m in messages.values())
    fed.train(1)
    for k, p in enumerate(fed.parties):
        assert p.fits == [2]
        assert torch.equal(param(p, "entity_emb"), torch.full_like(before[k], k + 1.0))  # its own training
    avg, _ = fed.evaluate(1, "val")
    for k, p in enumerate(fed.parties):
        assert torch.equal(param(p, "entity_emb"), torch.full_like(before[k], k + 1.0))  # nothing overwrote it
        assert p.evaluated == ["val"]
    # Clients report losses and metrics; no array ever crosses.
    assert len(fed.channel) > 0 and fed.channel.total_bytes == 0
    assert all(r.shapes == {} for r in fed.channel.records())
    assert avg["mrr"] == pytest.approx(1.4 / 6)


# ---------------------------------------------------------------- Entire
def fill_by_row(module) -> None:
    """Row i of every table holds the value i + 100 × (table number)."""
    with torch.no_grad():
        for offset, (_, p) in enumerate(module.model.named_parameters(recurse=False)):
            p.copy_(torch.arange(p.shape[0], dtype=p.dtype).unsqueeze(1).expand_as(p) + 100 * offset)


@pytest.mark.parametrize("model", ["transe", "transh"])
def test_entire_client_view_gathers_global_rows(model):
    fed = Federation(Entire, make_cfg(model=model), make_party=True)
    assert fed.made == [(CENTRAL, 6, 4)]
    s = fed.server
    assert s.central.name == CENTRAL
    assert s.configure_align() == {} and s.select_clients(1) == []
    assert s.configure_train(1, []) == {}  # the central party trains; no client does
    assert s.central.fits == [2] and s.central.logged == [({"train/loss": 0.25}, 1)]
    assert all(p.fits == [] for p in fed.parties)
    fill_by_row(s.central)
    central = dict(s.central.model.named_parameters(recurse=False))
    for k, p in enumerate(fed.parties):  # client_view itself
        view = client_view(s.central.module, fed.fkg.entity_index[k], fed.fkg.relation_index[k])
        assert set(view) == set(central)
    fed.evaluate(1, "val")
    for k, p in enumerate(fed.parties):
        params = dict(p.model.named_parameters(recurse=False))
        for name, c in central.items():
            index = fed.fkg.entity_index[k] if name.startswith("entity_") else fed.fkg.relation_index[k]
            assert torch.equal(params[name].detach(), c.detach()[index]), name
        assert p.evaluated == ["val"]
    downloads = fed.channel.records(name="eval_download")
    assert [r.receiver for r in downloads] == fed.names
    assert set(downloads[0].shapes) == set(central)


def test_entire_refuses_to_run_without_make_party_or_fkg():
    cfg, names = make_cfg(), ["client_0", "client_1"]
    with pytest.raises(ValueError, match="in-process"):
        Entire.Server(ServerContext(cfg, names, TASK), Entire)
    with pytest.raises(ValueError):
        Entire.Server(ServerContext(cfg, names, TASK, fkg=make_fkg()), Entire)
    with pytest.raises(ValueError):
        Entire.Server(ServerContext(cfg, names, TASK, make_party=lambda n, kg: None), Entire)
    assert Entire.in_process_only and not any(s.in_process_only for s in (FedE, FedR, Single))


# ---------------------------------------------------------------- registry
def test_strategies_resolve_by_name_and_import_path():
    assert {"single", "entire", "fede", "fedr"} <= set(STRATEGIES.names())
    for name, cls in (("fede", FedE), ("fedr", FedR), ("single", Single), ("entire", Entire)):
        assert STRATEGIES.get(name) is cls and cls.name == name
    assert STRATEGIES.get("FedE") is FedE  # case-insensitive
    assert STRATEGIES.get("lightning_fedkg.methods.fedr.strategy:FedR") is FedR
    assert FedE.Server is HolderMeanServer and FedR.Server is HolderMeanServer and FedE.Client is ClientHalf
    assert (FedE.groups, FedR.groups, Single.groups) == (("entity",), ("relation",), ())
    with pytest.raises(RegistryError, match="fede"):  # the message lists the valid names
        STRATEGIES.get("fedavg")
    with pytest.raises(RegistryError):  # not a Strategy
        STRATEGIES.get("lightning_fedkg.federated.holder_mean:HolderMeanServer")
    with pytest.raises(RegistryError):
        STRATEGIES.get("lightning_fedkg.methods.nope:FedE")
