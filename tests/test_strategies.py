"""Strategy hooks on a hand-built 3-client federation with hand-set embeddings."""

from types import SimpleNamespace

import pytest
import torch

from lightning_fedkg.config import ExperimentConfig
from lightning_fedkg.data.federated import FederatedKG
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.strategies import Entire, FedE, FedR, Single, build_strategy
from lightning_fedkg.federated.strategies.base import num_selected
from lightning_fedkg.models import build_model

DIM = 4


def make_fkg() -> FederatedKG:
    # Entities: 0 at clients 0, 2; 1 and 2 at clients 0, 1; 3 at 1; 4, 5 at 2.
    # Relations are disjoint: {0} / {1, 2} / {3}.
    trains = [
        torch.tensor([[0, 0, 1], [1, 0, 2]]),
        torch.tensor([[2, 1, 3], [3, 2, 1]]),
        torch.tensor([[4, 3, 5], [5, 3, 0]]),
    ]
    splits = [{"train": t, "valid": t[:1], "test": t[1:]} for t in trains]
    return FederatedKG.from_global_splits(splits, num_entities=6, num_relations=4, clean=False)


def make_cfg(**federated) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.model.dim = DIM
    cfg.model.name = "transe"
    for k, v in federated.items():
        setattr(cfg.federated, k, v)
    return cfg


def make_party(k, name, num_entities, num_relations, model="transe"):
    torch.manual_seed(100 + k)
    return SimpleNamespace(
        index=k, name=name, module=SimpleNamespace(model=build_model(model, num_entities, num_relations, DIM))
    )


def make_clients(fkg, model="transe"):
    return [
        make_party(k, f"client_{k}", kg.num_entities, kg.num_relations, model) for k, kg in enumerate(fkg.clients)
    ]


def setup(strategy, cfg=None, fkg=None):
    fkg = fkg or make_fkg()
    clients = make_clients(fkg)
    channel = Channel()
    strategy.setup(fkg, clients, cfg or make_cfg(), channel=channel)
    return fkg, clients, channel


def fake_training(clients):
    """Set client k's entity rows to k+1 and its relation rows to -(k+1)."""
    with torch.no_grad():
        for k, c in enumerate(clients):
            c.module.model.entity_emb.fill_(k + 1.0)
            c.module.model.relation_emb.fill_(-(k + 1.0))


# ---------------------------------------------------------------- selection
@pytest.mark.parametrize("fraction, clients, expected", [(1.0, 3, 3), (0.5, 10, 5), (0.1, 3, 1), (0.25, 10, 3), (0.01, 5, 1)])
def test_num_selected(fraction, clients, expected):
    assert num_selected(fraction, clients) == expected


def test_num_selected_rejects_bad_fraction():
    with pytest.raises(ValueError):
        num_selected(0.0, 3)
    with pytest.raises(ValueError):
        num_selected(1.5, 3)


def test_selection_is_seeded_distinct_and_resumable():
    s = FedE()
    fkg = FederatedKG.from_global_splits(
        [{"train": torch.tensor([[0, 0, 1]]), "valid": torch.tensor([[0, 0, 1]]), "test": torch.tensor([[0, 0, 1]])}] * 10,
        num_entities=2, num_relations=1, clean=False,
    )
    cfg = make_cfg(fraction=0.5)
    s.setup(fkg, make_clients(fkg), cfg)
    picks = [s.select_clients(r) for r in range(1, 21)]
    assert all(len(p) == 5 and len(set(p)) == 5 and p == sorted(p) and 0 <= p[0] and p[-1] < 10 for p in picks)
    assert len({tuple(p) for p in picks}) > 1  # the draw changes between rounds
    state = s.state_dict()
    nxt = [s.select_clients(r) for r in range(21, 24)]
    s2 = FedE()
    s2.setup(fkg, make_clients(fkg), cfg)
    assert [s2.select_clients(1)] == [picks[0]]  # same seed, same first draw
    s2.load_state_dict(state)
    assert [s2.select_clients(r) for r in range(21, 24)] == nxt


# ---------------------------------------------------------------- FedE
def test_fede_setup_builds_index_maps_holder_counts_and_initial_table():
    s = FedE()
    fkg = make_fkg()
    clients = make_clients(fkg)
    before = torch.get_rng_state()
    s.setup(fkg, clients, make_cfg(), channel=Channel())
    assert torch.equal(torch.get_rng_state(), before)  # the server's draw uses a private RNG
    assert [i.tolist() for i in s.indices] == [[0, 1, 2], [1, 2, 3], [0, 4, 5]]
    assert s.all_holders.tolist() == [2, 2, 2, 1, 1, 1]
    table = s.table["entity_emb"]
    rho = (10.0 + 2.0) / DIM
    assert table.shape == (6, DIM) and table.abs().max() <= rho and table.std() > 0.1 * rho
    again = FedE()
    setup(again)
    assert torch.equal(again.table["entity_emb"], table)
    other_seed = FedE()
    cfg = make_cfg()
    cfg.seed = 1
    setup(other_seed, cfg)
    assert not torch.equal(other_seed.table["entity_emb"], table)


def test_fede_round_downloads_rows_keeps_relations_and_holder_means_uploads():
    s = FedE()
    fkg, clients, channel = setup(s)
    relations_before = [c.module.model.relation_emb.detach().clone() for c in clients]
    s.distribute(1, [0, 1, 2], clients)
    for k, c in enumerate(clients):
        assert torch.equal(c.module.model.entity_emb.detach(), s.table["entity_emb"][fkg.entity_index[k]])
        assert torch.equal(c.module.model.relation_emb.detach(), relations_before[k])
    fake_training(clients)
    s.collect(1, [0, 1, 2], clients)
    # entity: holders -> mean of (k+1): 0:{0,2}->2, 1:{0,1}->1.5, 2:{0,1}->1.5, 3:{1}->2, 4,5:{2}->3
    assert s.table["entity_emb"][:, 0].tolist() == [2.0, 1.5, 1.5, 2.0, 3.0, 3.0]
    # What crossed: only float entity rows, n_c x DIM each way.
    for rec in channel.records():
        assert set(rec.shapes) == {"entity_emb"}
        assert all(d.startswith("float") for d in rec.dtypes.values())
    assert [r.name for r in channel.records()] == ["download"] * 3 + ["upload"] * 3
    assert channel.total_bytes == 2 * (3 + 3 + 3) * DIM * 4


def test_fede_unsampled_holders_selected_vs_all_holders():
    for aggregation, expected_row0 in (("selected_holders", 1.0), ("all_holders", None)):
        s = FedE()
        fkg, clients, channel = setup(s, make_cfg(aggregation=aggregation))
        start = s.table["entity_emb"].clone()
        s.distribute(1, [0], clients)
        fake_training(clients)
        s.collect(1, [0], clients)
        table = s.table["entity_emb"]
        # Entities 3, 4, 5 have no sampled holder: unchanged in both variants.
        assert torch.equal(table[3:], start[3:])
        if aggregation == "selected_holders":
            assert torch.equal(table[:3], torch.ones(3, DIM))
        else:
            # entity 0 has 2 holders (only client 0 sampled): E + (1 - E)/2.
            assert torch.allclose(table[0], start[0] + (1.0 - start[0]) / 2, atol=1e-6)
        assert {r.receiver for r in channel.records(name="download")} == {"client_0"}


def test_fede_prepare_evaluation_sends_aggregated_rows_through_channel():
    s = FedE()
    fkg, clients, channel = setup(s)
    fake_training(clients)
    s.prepare_evaluation(1, clients[1], round=5)
    (rec,) = channel.records()
    assert (rec.round, rec.sender, rec.receiver, rec.name) == (5, "server", "client_1", "eval_download")
    assert torch.equal(clients[1].module.model.entity_emb.detach(), s.table["entity_emb"][fkg.entity_index[1]])
    assert torch.equal(clients[1].module.model.relation_emb.detach(), torch.full((2, DIM), -2.0))


def test_fede_state_dict_roundtrip():
    s = FedE()
    fkg, clients, _ = setup(s)
    s.distribute(1, [0, 1, 2], clients)
    fake_training(clients)
    s.collect(1, [0, 1, 2], clients)
    state = s.state_dict()
    t = FedE()
    setup(t)
    assert not torch.equal(t.table["entity_emb"], s.table["entity_emb"])
    t.load_state_dict(state)
    assert torch.equal(t.table["entity_emb"], s.table["entity_emb"])


def test_fede_shares_every_entity_table_of_models_with_extra_tables():
    s = FedE()
    fkg = make_fkg()
    clients = make_clients(fkg, model="transd")
    cfg = make_cfg()
    cfg.model.name = "transd"
    s.setup(fkg, clients, cfg, channel=Channel())
    names = set(s.table)
    assert names == set(clients[0].module.model.entity_parameter_names()) and len(names) > 1
    assert not any(n.startswith("relation_") for n in names)


# ---------------------------------------------------------------- FedR
def test_fedr_shares_only_relations_and_disjoint_relations_pass_through():
    s = FedR()
    fkg, clients, channel = setup(s)
    assert s.all_holders.tolist() == [1, 1, 1, 1]
    entities_before = [c.module.model.entity_emb.detach().clone() for c in clients]
    s.distribute(1, [0, 1, 2], clients)
    for k, c in enumerate(clients):
        assert torch.equal(c.module.model.entity_emb.detach(), entities_before[k])  # entities stay local
    with torch.no_grad():
        for c in clients:
            c.module.model.relation_emb.copy_(torch.randn_like(c.module.model.relation_emb))
    s.collect(1, [0, 1, 2], clients)
    for k, c in enumerate(clients):
        # One holder per relation: the "mean" is the client's own rows, exactly (FedR = Single here).
        assert torch.equal(s.table["relation_emb"][fkg.relation_index[k]], c.module.model.relation_emb.detach())
    assert all(set(r.shapes) == {"relation_emb"} for r in channel.records())
    assert channel.total_bytes == 2 * (1 + 2 + 1) * DIM * 4


# ---------------------------------------------------------------- Single
def test_single_trains_everyone_and_sends_nothing():
    s = Single()
    fkg, clients, channel = setup(s, make_cfg(fraction=0.34))
    assert s.select_clients(1) == [0, 1, 2]
    before = [c.module.model.entity_emb.detach().clone() for c in clients]
    s.distribute(1, [0, 1, 2], clients)
    s.collect(1, [0, 1, 2], clients)
    for k in range(3):
        s.prepare_evaluation(k, clients[k], round=1)
        assert torch.equal(clients[k].module.model.entity_emb.detach(), before[k])
    assert len(channel) == 0 and channel.total_bytes == 0


# ---------------------------------------------------------------- Entire
@pytest.mark.parametrize("model", ["transe", "transh"])
def test_entire_client_view_gathers_global_rows(model):
    fkg = make_fkg()
    clients = make_clients(fkg, model)
    made = []

    def make_learner(name, kg):
        made.append((name, kg.num_entities, kg.num_relations))
        return make_party(-1, name, kg.num_entities, kg.num_relations, model)

    s = Entire()
    cfg = make_cfg()
    cfg.model.name = model
    channel = Channel()
    s.setup(fkg, clients, cfg, channel=channel, make_learner=make_learner)
    assert made == [("central", 6, 4)]
    assert s.learners(clients) == [s.central] and s.select_clients(1) == [0]
    central = s.central.module.model
    with torch.no_grad():  # row i of every table holds the value i (+ table offset)
        for offset, (name, p) in enumerate(central.named_parameters(recurse=False)):
            p.copy_(torch.arange(p.shape[0], dtype=p.dtype).unsqueeze(1).expand_as(p) + 100 * offset)
    for k, c in enumerate(clients):
        s.prepare_evaluation(k, c, round=1)
        params = dict(c.module.model.named_parameters(recurse=False))
        for name, p in central.named_parameters(recurse=False):
            index = fkg.entity_index[k] if name.startswith("entity_") else fkg.relation_index[k]
            assert torch.equal(params[name].detach(), p.detach()[index]), name
    assert len(channel) == 0


def test_entire_requires_a_learner_factory():
    with pytest.raises(ValueError):
        setup(Entire())


def test_build_strategy():
    assert isinstance(build_strategy("fede"), FedE) and isinstance(build_strategy("fedr"), FedR)
    with pytest.raises(ValueError):
        build_strategy("fedavg")
