"""FederatedKG, the FedE relation partitioner and the client-folder loaders."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from lightning_fedkg.data import (
    FederatedKG,
    KnowledgeGraph,
    load_federated,
    load_federated_folder,
    load_fedlu_folder,
    load_kg,
    partition_by_relation,
    resample_split,
    write_fedlu_folder,
)
from lightning_fedkg.data.kg import KGFormatError

from conftest import SHARED_DATA, make_small_config, needs_shared


def sequential_resample(rows, perm, n_valid, n_test):
    """Oracle: the resample rule walked one triple at a time with Python counters."""
    rows = rows.tolist()
    ecount, rcount = Counter(), Counter()
    for h, r, t in rows:
        ecount[h] += 1
        ecount[t] += 1
        rcount[r] += 1
    taken, skipped, need = [], 0, n_valid + n_test
    for i in perm.tolist():
        if len(taken) == need:
            break
        h, r, t = rows[i]
        if h == t:
            ok = rcount[r] > 1 and ecount[h] > 2
        else:
            ok = rcount[r] > 1 and ecount[h] > 1 and ecount[t] > 1
        if ok:
            ecount[h] -= 1
            ecount[t] -= 1
            rcount[r] -= 1
            taken.append(i)
        else:
            skipped += 1
    taken_set = set(taken)
    train = [rows[i] for i in perm.tolist() if i not in taken_set]
    return (train, [rows[i] for i in taken[:n_valid]], [rows[i] for i in taken[n_valid:]], skipped)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("chunk", [1, 3, 16, 4096])
def test_resample_split_equals_sequential_oracle(seed, chunk):
    g = torch.Generator().manual_seed(seed)
    n, num_ent, num_rel = 120, 70 + 10 * seed, 12
    rows = torch.stack([torch.randint(0, num_ent, (n,), generator=g),
                        torch.randint(0, num_rel, (n,), generator=g),
                        torch.randint(0, num_ent, (n,), generator=g)], 1)
    rows[:5, 2] = rows[:5, 0]  # self-loops exercise the h == t rule
    perm = torch.randperm(n, generator=g)
    n_valid = n_test = 12
    train, valid, test, skipped = resample_split(rows, perm, n_valid, n_test, chunk=chunk)
    o_train, o_valid, o_test, o_skipped = sequential_resample(rows, perm, n_valid, n_test)
    assert skipped == o_skipped and skipped > 0
    assert train.tolist() == o_train
    assert valid.tolist() == o_valid
    assert test.tolist() == o_test


def test_resample_split_raises_when_impossible():
    rows = torch.tensor([[0, 0, 1], [2, 1, 3]])
    with pytest.raises(ValueError, match="eligible"):
        resample_split(rows, torch.arange(2), 1, 0)


def random_kg(seed=0, num_entities=60, num_relations=9, n=900):
    g = torch.Generator().manual_seed(seed)
    t = torch.stack([torch.randint(0, num_entities, (n,), generator=g),
                     torch.randint(0, num_relations, (n,), generator=g),
                     torch.randint(0, num_entities, (n,), generator=g)], 1)
    t = torch.unique(t, dim=0)[torch.randperm(torch.unique(t, dim=0).shape[0], generator=g)]
    k = t.shape[0]
    splits = {"train": t[: int(0.8 * k)], "valid": t[int(0.8 * k): int(0.9 * k)],
              "test": t[int(0.9 * k):]}
    names = [f"e{i}" for i in range(num_entities)]
    return KnowledgeGraph(splits, num_entities, num_relations, names,
                          [f"r{i}" for i in range(num_relations)], name="rand")


@pytest.mark.parametrize("num_clients", [1, 2, 4])
def test_partition_invariants(num_clients):
    kg = random_kg()
    fed = partition_by_relation(kg, num_clients, seed=3)
    assert fed.num_clients == num_clients
    assert (fed.num_entities, fed.num_relations) == (kg.num_entities, kg.num_relations)
    pool = torch.cat([kg.triples(s) for s in ("train", "valid", "test")])
    rel_ex = fed.relation_existence()
    # relations disjoint, covering all relations, group sizes differ by at most one
    assert rel_ex.sum(0).tolist() == [1] * kg.num_relations
    sizes = rel_ex.sum(1)
    assert int(sizes.max() - sizes.min()) <= 1
    used = []
    for c in range(num_clients):
        client = fed.clients[c]
        glob = {s: fed.global_triples(c, s) for s in client.split_names}
        n = sum(t.shape[0] for t in glob.values())
        assert glob["valid"].shape[0] == round(0.1 * n)
        assert glob["test"].shape[0] == round(0.1 * n)
        # local entities / relations are exactly the train ones, sorted by global id
        train_ents = torch.unique(glob["train"][:, [0, 2]])
        assert torch.equal(fed.entity_index[c], train_ents)
        assert torch.equal(fed.relation_index[c], torch.unique(glob["train"][:, 1]))
        for s in ("valid", "test"):
            assert torch.isin(glob[s][:, [0, 2]], train_ents).all()
            assert torch.isin(glob[s][:, 1], fed.relation_index[c]).all()
            assert torch.isin(glob[s][:, 1], torch.nonzero(rel_ex[c]).flatten()).all()
        # names follow the global ids
        assert client.entity_names == [kg.entity_names[i] for i in fed.entity_index[c].tolist()]
        used += [tuple(x) for s in glob.values() for x in s.tolist()]
    # all triples used exactly once
    assert Counter(used) == Counter(tuple(x) for x in pool.tolist())


def test_partition_is_deterministic_per_seed():
    kg = random_kg(1)
    a, b, c = (partition_by_relation(kg, 3, seed=s) for s in (7, 7, 8))
    for x, y in zip(a.clients, b.clients):
        assert all(torch.equal(x.triples(s), y.triples(s)) for s in ("train", "valid", "test"))
    assert not all(torch.equal(x.triples("valid"), y.triples("valid"))
                   for x, y in zip(a.clients, c.clients))


def test_existence_union_and_stats():
    kg = random_kg(2)
    fed = partition_by_relation(kg, 3, seed=0)
    ex = fed.entity_existence()
    assert ex.shape == (3, kg.num_entities)
    for c in range(3):
        assert torch.equal(torch.nonzero(ex[c]).flatten(), fed.entity_index[c])
    union = fed.union()
    assert union.num_entities == kg.num_entities
    for s in ("train", "valid", "test"):
        expect = torch.cat([fed.global_triples(c, s) for c in range(3)])
        assert torch.equal(union.triples(s), expect)  # relations disjoint: no duplicates
    stats = fed.stats()
    assert [d["client"] for d in stats] == [0, 1, 2]
    assert [d["entities"] for d in stats] == [int(ex[c].sum()) for c in range(3)]


def test_federated_kg_validates_index():
    kg = KnowledgeGraph({"train": torch.tensor([[0, 0, 1]]), "valid": torch.zeros(0, 3),
                         "test": torch.zeros(0, 3)}, 2, 1)
    with pytest.raises(ValueError, match="strictly increasing"):
        FederatedKG([kg], [torch.tensor([3, 1])], [torch.tensor([0])], 5, 1)
    with pytest.raises(ValueError, match="2 local ids"):
        FederatedKG([kg], [torch.tensor([1])], [torch.tensor([0])], 5, 1)


# ---- folder loaders --------------------------------------------------------------------

def write_clients(root: Path, clients: list[dict[str, str]], fmt: str) -> Path:
    for k, files in enumerate(clients):
        d = root / (f"client_{k}" if fmt == "fede" else str(k))
        d.mkdir(parents=True)
        for s, text in files.items():
            (d / (s + (".tsv" if fmt == "fede" else ".txt"))).write_text(text)
    return root


def test_federated_folder_sorted_ids_and_policy(tmp_path, caplog):
    root = write_clients(tmp_path / "fed", [
        {"train": "m\tr2\tb\nb\tr2\tm\n", "valid": "m\tr2\tb\n", "test": "b\tr2\tq\n"},  # q unseen
        {"train": "a\tr1\tb\nb\tr1\tz\n", "valid": "z\tr1\ta\n", "test": "a\tr1\tb\n"},
    ], "fede")
    fed = load_federated(root)  # dispatch on client_0/
    assert fed.entity_names == ["a", "b", "m", "z"]  # sorted; q only in a dropped triple
    assert fed.relation_names == ["r1", "r2"]
    assert fed.entity_index[0].tolist() == [1, 2] and fed.entity_index[1].tolist() == [0, 1, 3]
    assert fed.relation_index[0].tolist() == [1] and fed.relation_index[1].tolist() == [0]
    c0, c1 = fed.clients
    assert c0.entity_names == ["b", "m"]
    assert c0.triples("train").tolist() == [[1, 0, 0], [0, 0, 1]]
    assert c0.triples("test").shape == (0, 3)
    assert c1.triples("valid").tolist() == [[2, 0, 0]]
    assert "client_0: dropped 1 'test' triples" in caplog.text
    assert fed.global_triples(1, "train").tolist() == [[0, 0, 1], [1, 0, 3]]


def test_fedlu_folder_keeps_unlearn(tmp_path):
    root = write_clients(tmp_path / "lu", [
        {"train": "a\tr\tb\nb\tr\ta\n", "valid": "a\tr\tb\n", "test": "b\tr\ta\n",
         "unlearn": "b\tr\ta\n"},
        {"train": "c\ts\ta\na\ts\tc\n", "valid": "c\ts\ta\n", "test": "a\ts\tc\n",
         "unlearn": "a\ts\tc\n"},
    ], "fedlu")
    fed = load_federated(root)  # dispatch on 0/
    assert fed.clients[0].split_names == ["train", "valid", "test", "unlearn"]
    assert fed.global_triples(1, "unlearn").tolist() == [[0, 1, 2]]
    union = fed.union()
    assert union.triples("unlearn").tolist() == [[1, 0, 0], [0, 1, 2]]


def test_fedlu_folder_written_reads_back_with_the_same_named_triples(tmp_path):
    fed = partition_by_relation(load_kg("umls"), 3, seed=4)
    forget = [kg.triples("train")[:2] for kg in fed.clients]
    write_fedlu_folder(fed, tmp_path / "R3", {"unlearn": forget})
    back = load_fedlu_folder(tmp_path / "R3")

    def named(f, c, split):
        return sorted((f.entity_names[h], f.relation_names[r], f.entity_names[t])
                      for h, r, t in f.global_triples(c, split).tolist())

    for c in range(3):
        for split in ("train", "valid", "test"):
            assert named(back, c, split) == named(fed, c, split)
        assert named(back, c, "unlearn") == sorted(
            (fed.entity_names[h], fed.relation_names[r], fed.entity_names[t])
            for h, r, t in fed.global_triples(c, "train")[:2].tolist())
        # the dictionaries list the client's own vocabulary in local-id order (FedLU reads them)
        lines = (tmp_path / "R3" / str(c) / "entities.dict").read_text().splitlines()
        assert lines == [f"{i}\t{fed.entity_names[g]}" for i, g in enumerate(fed.entity_index[c].tolist())]


def test_fedlu_folder_refuses_names_with_whitespace(tmp_path):
    kg = KnowledgeGraph({"train": torch.tensor([[0, 0, 1]]), "valid": torch.tensor([[0, 0, 1]]),
                         "test": torch.tensor([[0, 0, 1]])}, 2, 1, ["a b", "c"], ["r"])
    fed = FederatedKG([kg], [torch.tensor([0, 1])], [torch.tensor([0])], 2, 1, ["a b", "c"], ["r"])
    with pytest.raises(ValueError, match="whitespace"):
        write_fedlu_folder(fed, tmp_path / "x")


def test_client_folders_must_be_numbered_contiguously(tmp_path):
    one = {"train": "a\tr\tb\n", "valid": "a\tr\tb\n", "test": "a\tr\tb\n"}
    root = tmp_path / "gap"
    for k in (0, 2):
        d = root / f"client_{k}"
        d.mkdir(parents=True)
        for s, text in one.items():
            (d / f"{s}.tsv").write_text(text)
    with pytest.raises(KGFormatError, match=r"0\.\.C-1"):
        load_federated_folder(root)


def test_load_federated_partitions_a_plain_kg():
    fed = load_federated("nations", num_clients=2, seed=5)
    assert fed.num_clients == 2 and fed.num_relations == 55
    assert fed.relation_existence().sum(1).tolist() == [28, 27]


# ---- real benchmark data ---------------------------------------------------------------

@needs_shared
def test_fb15k237_fed3_matches_its_stats(one_thread):
    root = SHARED_DATA / "FB15k-237-Fed3"
    stats = json.loads((root / "stats.json").read_text())
    fed = load_federated_folder(root)
    assert fed.num_entities == stats["total_entities"] == 14541
    assert fed.num_relations == 237
    for got, want in zip(fed.stats(), stats["clients"]):
        assert (got["train"], got["valid"], got["test"]) == (want["train"], want["valid"], want["test"])
        assert (got["entities"], got["relations"]) == (want["entities_train"], want["relations"])
    assert fed.stats()[0]["train"] == 76674
    # each client's relations are those listed in stats.json
    for c, names in enumerate(stats["client_relations"]):
        assert sorted(names) == fed.clients[c].relation_names


@needs_shared
@pytest.mark.slow
def test_fedlu_r10_loads_with_unlearn(one_thread):
    fed = load_fedlu_folder(SHARED_DATA / "FB15k-237-R10")
    assert fed.num_clients == 10
    assert (fed.num_entities, fed.num_relations) == (14541, 237)
    lines = (SHARED_DATA / "FB15k-237-R10" / "0" / "unlearn.txt").read_text().strip().splitlines()
    assert fed.stats()[0]["unlearn"] == len(lines) == 144
    assert fed.stats()[0]["train"] == 14352


def test_random_partition_deals_out_every_triple_once_with_shared_relations():
    from lightning_fedkg.data import load_kg, partition_randomly

    kg = load_kg("umls")
    fkg = partition_randomly(kg, 3, seed=7)
    pool = torch.cat([kg.triples(s) for s in ("train", "valid", "test")])
    dealt = torch.cat([fkg.global_triples(c, s) for c in range(3) for s in ("train", "valid", "test")])
    key = lambda t: set(map(tuple, t.tolist()))  # noqa: E731
    assert key(dealt) == key(pool) and dealt.shape[0] == len(key(pool))  # each triple exactly once
    sizes = [sum(fkg.clients[c].triples(s).shape[0] for s in ("train", "valid", "test")) for c in range(3)]
    assert max(sizes) - min(sizes) <= 1
    shared = fkg.relation_existence().all(dim=0).sum().item()
    assert shared > 0.8 * kg.num_relations  # relations overlap, unlike the relation partition
    for c, client in enumerate(fkg.clients):  # the input policy holds: eval items are in train
        train = client.triples("train")
        for split in ("valid", "test"):
            t = client.triples(split)
            assert torch.isin(t[:, [0, 2]], train[:, [0, 2]]).all() and torch.isin(t[:, 1], train[:, 1]).all()
    assert torch.equal(partition_randomly(kg, 3, seed=7).global_triples(1), fkg.global_triples(1))


def test_fedr_averages_the_relations_clients_share_on_a_random_partition():
    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.federation import FederatedRun

    cfg = load_config(None, ["data.name=umls", "data.partition=random", "model.dim=8", "train.num_negatives=8",
                             "train.negative_mode=shared", "trainer.accelerator=cpu", "federated.strategy=fedr",
                             "federated.local_epochs=1"])
    run = FederatedRun(cfg, run_dir=None)
    run.train_round(1)
    run.load_evaluation_state(1, "val")  # every client now holds the aggregated relation rows
    a, b = run.clients[0], run.clients[1]
    shared = sorted(set(a.names["relation"]) & set(b.names["relation"]))
    assert len(shared) > 10
    for name in shared:
        row_a = a.model.relation_emb[a.names["relation"].index(name)]
        row_b = b.model.relation_emb[b.names["relation"].index(name)]
        assert torch.equal(row_a, row_b), name  # one averaged row, where Single keeps two


def test_a_retrain_folder_keeps_the_source_vocabulary_ids_and_splits(tmp_path):
    # Client 0's only triples of entity "x" are forgotten: in a retrain folder they leave
    # train for unlearn. The unlearn split counts as training triples, so "x", the ids and
    # every evaluation triple of "x" stay, and the forgotten triples are all there to rank.
    source = {"train": "a\tr\tb\nb\tr\ta\nx\tr\ta\n", "valid": "a\tr\tx\n", "test": "b\tr\ta\n",
              "unlearn": "x\tr\ta\n"}
    retrain = dict(source, train="a\tr\tb\nb\tr\ta\n")
    other = {"train": "c\ts\ta\na\ts\tc\n", "valid": "c\ts\ta\n", "test": "a\ts\tc\n"}
    for name, client0 in (("source", source), ("retrain", retrain)):
        for c, files in enumerate((client0, other)):
            for split, text in files.items():
                (tmp_path / name / str(c)).mkdir(parents=True, exist_ok=True)
                (tmp_path / name / str(c) / f"{split}.txt").write_text(text)
    src, re_ = load_fedlu_folder(tmp_path / "source"), load_fedlu_folder(tmp_path / "retrain")
    assert re_.entity_names == src.entity_names == ["a", "b", "c", "x"]
    assert re_.entity_index[0].tolist() == src.entity_index[0].tolist()
    for split in ("valid", "test", "unlearn"):
        assert re_.clients[0].triples(split).tolist() == src.clients[0].triples(split).tolist()
    assert re_.clients[0].triples("valid").shape[0] == 1  # (a, r, x) is not dropped
    assert re_.clients[0].triples("train").shape[0] == 2


def test_client_entities_all_runs_fede_with_every_row_at_every_client():
    """FedE with ``data.client_entities=all``: every client's table has every entity, and the
    download after a round gives every client the same rows, the mean of the uploads."""
    from lightning_fedkg.federated.federation import FederatedRun

    run = FederatedRun(make_small_config("fede", data__client_entities="all", federated__rounds=1), None)
    run.align()
    n = run.fkg.num_entities
    assert all(p.module.model.entity_emb.shape[0] == n for p in run.clients)
    run.train_round(1)
    trained = torch.stack([p.module.model.entity_emb.detach().double() for p in run.clients])
    run.evaluate("valid", 1)  # the download
    held = [p.module.model.entity_emb.detach() for p in run.clients]
    assert all(torch.equal(h, held[0]) for h in held)
    assert torch.allclose(held[0].double(), trained.mean(0), atol=1e-6)
    run.close()
