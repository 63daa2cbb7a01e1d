"""HolderMeanServer over several named groups: each with its own row index, alignment and tables.

The federation is built as in ``tests/test_strategies.py`` (fake parties, a real Channel);
the oracle is a brute-force loop over item *names*: for every entity (relation) the rows
of the clients that hold it and answered, averaged in float64 as FedE's Eq. 2 says.
"""

from __future__ import annotations

import io
import zlib
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lightning_fedkg.data.federated import FederatedKG
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.strategy import ClientHalf, Strategy
from lightning_fedkg.models.shareable import InitSpec, SharedGroup
from tests.test_strategies import DIM, ENTITY_NAMES, RELATION_NAMES, Federation, make_cfg, positions


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


class EntityAndRelation(Strategy):
    """FedE and FedR at once: entity rows over entity holders, relation rows over relation holders."""

    name = "entity_and_relation"
    Server = HolderMeanServer
    Client = ClientHalf
    groups = ("entity", "relation")


def overlapping_fkg(same: bool = False) -> FederatedKG:
    """Entities: 0 at clients 0, 2; 1, 2 at 0, 1; 3 at 1; 4, 5 at 2.
    Relations *overlap*: 0 at clients 0, 2; 1 at 0, 1; 2 at 1; 3 at 2.
    ``same``: three clients with client 0's KG."""
    trains = [torch.tensor([[0, 0, 1], [1, 1, 2]]), torch.tensor([[2, 1, 3], [3, 2, 1]]),
              torch.tensor([[4, 0, 5], [5, 3, 0]])]
    if same:
        trains = [trains[0]] * 3
    splits = [{"train": t, "valid": t[:1], "test": t[1:]} for t in trains]
    return FederatedKG.from_global_splits(splits, num_entities=6, num_relations=4, entity_names=ENTITY_NAMES,
                                          relation_names=RELATION_NAMES, clean=False)


def random_rows(party) -> None:
    """A local fit: every parameter gets values of the party's own seeded draw."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{party.name}/{len(party.fits)}".encode()))
    with torch.no_grad():
        for p in party.model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


def by_name(fed, tensor: str, index: str, names: list[str]) -> torch.Tensor:
    """The server's rows of ``tensor`` in the order of ``names``."""
    return fed.server.table[tensor][positions(fed.server.alignments[index], names, fed.cfg)]


def oracle(fed, start: dict, replies: dict, tensor: str, index: str, names: list[str], aggregation: str):
    """Brute force, one item at a time: ``{name: row}`` after the round."""
    out = []
    for i, item in enumerate(names):
        base = start[tensor][i].double()
        uploads = [replies[c].arrays[tensor][fed.party[c].names[index].index(item)].double()
                   for c in fed.names if c in replies and item in fed.party[c].names[index]]
        if not uploads:
            out.append(start[tensor][i])
            continue
        total = uploads[0]
        for u in uploads[1:]:
            total = total + u
        if aggregation == "selected_holders":
            row = total / len(uploads)
        else:  # unsampled holders count as returning the current row
            holders = sum(item in p.names[index] for p in fed.parties)
            row = base + (total - len(uploads) * base) / holders
        out.append(row.float())
    return torch.stack(out)


@pytest.mark.parametrize("model", ["transe", "transd"])
@pytest.mark.parametrize("aggregation", ["selected_holders", "all_holders"])
@pytest.mark.parametrize("selected", [("client_0", "client_1", "client_2"), ("client_0", "client_2")])
def test_entity_and_relation_groups_are_holder_means_over_their_own_holders(model, aggregation, selected):
    fed = Federation(EntityAndRelation, make_cfg(model=model, aggregation=aggregation), fkg=overlapping_fkg(),
                     train=random_rows).align()
    s = fed.server
    # one union per index kind, from the digests each client sent for both indexes
    assert s.alignments["entity"].size == 6 and s.alignments["relation"].size == 4
    assert s.alignments["entity"].holders[positions(s.alignments["entity"], ENTITY_NAMES, fed.cfg)].tolist() == \
        [2, 2, 2, 1, 1, 1]
    assert s.alignments["relation"].holders[positions(s.alignments["relation"], RELATION_NAMES, fed.cfg)].tolist() \
        == [2, 2, 1, 1]
    with pytest.raises(ValueError, match="alignments"):
        s.alignment  # two row indexes: no single alignment
    assert [r.shapes for r in fed.channel.records(round=0, name="align")] == [
        {"entity_digests": [3, 32], "relation_digests": [2, 32]}] * 3
    entity_tensors = set(fed.parties[0].model.shareable_groups()["entity"].tensors)
    relation_tensors = set(fed.parties[0].model.shareable_groups()["relation"].tensors)
    assert set(s.table) == entity_tensors | relation_tensors
    assert s.group_of == {**{t: "entity" for t in entity_tensors}, **{t: "relation" for t in relation_tensors}}

    items = {"entity": ENTITY_NAMES, "relation": RELATION_NAMES}
    kinds = {**{t: "entity" for t in entity_tensors}, **{t: "relation" for t in relation_tensors}}
    start = {t: by_name(fed, t, kinds[t], items[kinds[t]]).clone() for t in s.table}
    # what each client receives: its own rows of both groups, in its local order
    for name, message in s.configure_train(1, list(selected)).items():
        party = fed.party[name]
        for t, rows in message.arrays.items():
            local = party.names[kinds[t]]
            assert torch.equal(rows, start[t][[items[kinds[t]].index(n) for n in local]]), (name, t)
    replies = fed.train(1, list(selected))
    for t in s.table:
        expected = oracle(fed, start, replies, t, kinds[t], items[kinds[t]], aggregation)
        assert torch.equal(by_name(fed, t, kinds[t], items[kinds[t]]), expected), t
    if selected == ("client_0", "client_2"):
        # "delta" (entity) and "r_east" (relation) are held by client_1 alone: unchanged
        assert torch.equal(by_name(fed, "entity_emb", "entity", ["delta"]), start["entity_emb"][3:4])
        assert torch.equal(by_name(fed, "relation_emb", "relation", ["r_east"]), start["relation_emb"][2:3])
    # both groups crossed in both directions, rows per client of each index
    for rec in fed.channel.records(round=1):
        k = int((rec.receiver if rec.name == "download" else rec.sender).split("_")[1])
        n_e, n_r = len(fed.parties[k].names["entity"]), len(fed.parties[k].names["relation"])
        assert {t: shape[0] for t, shape in rec.shapes.items()} == {
            t: n_e if kinds[t] == "entity" else n_r for t in s.table}


def test_entity_and_relation_by_hand():
    # client k writes k+1 into every entity row and -(k+1) into every relation row
    fed = Federation(EntityAndRelation, make_cfg(), fkg=overlapping_fkg()).align()
    fed.train(1)
    assert torch.equal(by_name(fed, "entity_emb", "entity", ENTITY_NAMES),
                       torch.tensor([2.0, 1.5, 1.5, 2.0, 3.0, 3.0])[:, None].expand(6, DIM))
    # relations: 0 {0, 2} -> -2, 1 {0, 1} -> -1.5, 2 {1} -> -2, 3 {2} -> -3
    assert torch.equal(by_name(fed, "relation_emb", "relation", RELATION_NAMES),
                       torch.tensor([-2.0, -1.5, -2.0, -3.0])[:, None].expand(4, DIM))


@pytest.mark.parametrize("aggregation", ["selected_holders", "all_holders"])
def test_identical_clients_leave_both_groups_unchanged(aggregation):
    fed = Federation(EntityAndRelation, make_cfg(model="transd", aggregation=aggregation),
                     fkg=overlapping_fkg(same=True), train=None).align()  # fit uploads what it received
    assert fed.server.alignments["entity"].holders.tolist() == [3, 3, 3]
    start = {t: v.clone() for t, v in fed.server.table.items()}
    assert set(start) == {"entity_emb", "entity_proj", "relation_emb", "relation_proj"}
    fed.train(1)
    fed.train(2, ["client_1"])
    for t, v in fed.server.table.items():
        assert torch.equal(v, start[t]), t


# ---------------------------------------------------------------- a group without row index, a shared index
class Operators(nn.Module):
    """A ``[2, 3]`` operator shared whole (index None), and a second entity-indexed table."""

    def __init__(self, num_entities: int) -> None:
        super().__init__()
        self.op = nn.Parameter(torch.zeros(2, 3))
        self.side = nn.Parameter(torch.zeros(num_entities, 2))


def add_operators(party) -> None:
    """Give a fake party the :class:`Operators` tables and declare them as two more groups."""
    party.extra = Operators(party.kg.num_entities)
    groups = party.model.shareable_groups

    def shareable_groups():
        return {**groups(),
                "operators": SharedGroup({"op": party.extra.op}, None, {"op": InitSpec("uniform", (-1.0, 1.0))}),
                "entity_side": SharedGroup({"side": party.extra.side}, "entity",
                                           {"side": InitSpec("uniform", (-1.0, 1.0))})}

    party.module = SimpleNamespace(model=party.model, shareable_groups=shareable_groups)


class WithOperators(Strategy):
    name = "with_operators"
    Server = HolderMeanServer
    Client = ClientHalf
    groups = ("entity", "operators", "entity_side")


def operator_federation(aggregation="selected_holders") -> Federation:
    def fit(party):
        k = int(party.name.split("_")[1])
        with torch.no_grad():
            party.extra.op.copy_(torch.arange(6.0).reshape(2, 3) + 2.0 ** k)  # 1, 2, 4 + arange
            party.extra.side.fill_(float(k))
            party.model.entity_emb.fill_(float(k))

    fed = Federation(WithOperators, make_cfg(aggregation=aggregation), train=fit)
    for p in fed.parties:  # the halves read the groups from party.module at each exchange
        add_operators(p)
    return fed.align()


def test_a_group_without_row_index_is_averaged_whole_and_groups_may_share_an_index():
    fed = operator_federation()
    s = fed.server
    assert s.alignments["operators"] is None
    assert s.alignments["entity"] is s.alignments["entity_side"] is s.alignment  # one union per index kind
    assert s.table["op"].shape == (2, 3) and s.table["side"].shape == (6, 2)
    assert s.table["op"].abs().max() <= 1.0 and s.table["op"].std() > 0.1
    assert [r.shapes for r in fed.channel.records(round=0, name="align")] == [{"entity_digests": [3, 32]}] * 3
    start = s.table["op"].clone()
    downloads = s.configure_train(1, fed.names)
    assert all(torch.equal(m.arrays["op"], start) for m in downloads.values())
    assert downloads["client_0"].arrays["op"] is not s.table["op"]  # a copy
    # client_1 fails: the mean over clients 0 and 2 only, equally weighted: arange + (1 + 4) / 2
    replies = fed.exchange("train", {n: m for n, m in downloads.items() if n != "client_1"}, 1)
    s.aggregate_train(1, replies, {"client_1": "RuntimeError: boom"})
    assert torch.equal(s.table["op"], torch.arange(6.0).reshape(2, 3) + 2.5)
    pos = positions(s.alignment, ENTITY_NAMES, fed.cfg)
    # entities: 0 {0, 2} -> 1, 1 and 2 {0, (1 failed)} -> 0, 3 {1 failed} kept, 4, 5 {2} -> 2
    assert s.table["side"][pos][[0, 1, 2, 4, 5]].tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0],
                                                            [2.0, 2.0]]
    fed.train(2)
    # the float64 mean of (a + 1) + (a + 2) + (a + 4), cast back to float32
    a = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    assert torch.equal(s.table["op"], ((3 * a + 7.0) / 3).float())


def test_all_holders_damps_a_whole_tensor_by_the_number_of_its_holders():
    fed = operator_federation("all_holders")
    start = fed.server.table["op"].clone().double()
    fed.train(1, ["client_2"])
    up = torch.arange(6.0, dtype=torch.float64).reshape(2, 3) + 4.0
    assert torch.equal(fed.server.table["op"], (start + (up - start) / 3).float())


# ---------------------------------------------------------------- state
def test_several_groups_state_roundtrip():
    fed = operator_federation()
    fed.train(1)
    buffer = io.BytesIO()
    torch.save(fed.server.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh = Federation(WithOperators, make_cfg()).server  # never aligned (the server builds no party)
    assert fresh.alignments == {} and fresh.alignment is None
    fresh.load_state_dict(state)
    assert fresh.alignments["entity"] is fresh.alignments["entity_side"] and fresh.alignments["operators"] is None
    for name in fed.names:
        got, want = fresh.rows(name), fed.server.rows(name)
        assert set(got) == set(want) == {"entity_emb", "op", "side"}
        assert all(torch.equal(got[t], want[t]) for t in want)


def test_a_tensor_in_two_groups_is_refused():
    class Twice(Strategy):
        name = "twice"
        Server = HolderMeanServer
        Client = ClientHalf
        groups = ("entity", "again")

    def declare_twice(fed):
        for p in fed.parties:
            groups = p.model.shareable_groups
            p.module = SimpleNamespace(model=p.model,
                                       shareable_groups=lambda g=groups: {**g(), "again": g()["entity"]})

    fed = Federation(Twice)
    declare_twice(fed)
    with pytest.raises(ValueError, match="entity_emb.*one group"):
        fed.align()
