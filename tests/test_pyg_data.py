"""A KG is a PyG dataset in and out (lightning_fedkg/data/pyg.py): PyG's two KG layouts
load with their ids, KnowledgeGraph -> Data -> KnowledgeGraph is the identity, the bundled
KGs are PyG datasets, a root is named from a config (``pyg:<Class>@<root>``), a federated
split gives each client's PyG Data with its id maps, and a federation built from PyG data
trains end to end."""

import shutil
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from lightning_fedkg.config import ConfigError
from lightning_fedkg.data import (UMLS, KGDataset, KGFormatError, KnowledgeGraph, kg_from_pyg, kg_to_pyg, load_kg,
                                  partition_by_relation, save_kg_dataset)
from lightning_fedkg.data.pyg import load_pyg_root

from conftest import make_small_config

SPLITS = ("train", "valid", "test")


def same_kg(a: KnowledgeGraph, b: KnowledgeGraph) -> None:
    assert (a.num_entities, a.num_relations) == (b.num_entities, b.num_relations)
    assert a.split_names == b.split_names
    for s in a.split_names:
        assert torch.equal(a.triples(s), b.triples(s)), s
    assert a.entity_names == b.entity_names and a.relation_names == b.relation_names


def with_extra_split(kg: KnowledgeGraph) -> KnowledgeGraph:
    """``kg`` with an extra split (a forgetting set: part of train) and an unused relation id."""
    splits = {s: kg.triples(s) for s in kg.split_names} | {"unlearn": kg.triples("train")[:7]}
    return KnowledgeGraph(splits, kg.num_entities, kg.num_relations + 1, name=kg.name)


@pytest.mark.parametrize("masks", [False, True])
def test_kg_to_pyg_and_back_is_the_identity(masks):
    for kg in (load_kg("umls"), with_extra_split(load_kg("nations"))):
        data = kg_to_pyg(kg, masks=masks)
        if masks:  # WordNet18RR's layout: one graph, a mask per split
            assert isinstance(data, Data) and data.val_mask.sum() == kg.triples("valid").shape[0]
        else:  # FB15k_237's layout: one graph per split, PyG's split names
            assert set(data) == {"train", "val", "test", *(s for s in kg.split_names if s not in SPLITS)}
            assert torch.equal(data["val"].edge_index, kg.triples("valid")[:, [0, 2]].t())
        back = load_kg(data, name=kg.name)
        same_kg(back, kg)
        assert back.removed and all(v == {"duplicates": 0, "unseen": 0} for v in back.removed.values())


def test_pyg_data_without_names_or_relation_count_takes_them_from_the_edges():
    t = torch.tensor([[0, 0, 1], [1, 2, 2], [2, 1, 0], [0, 1, 2]])
    split = lambda rows: Data(edge_index=t[rows][:, [0, 2]].t(), edge_type=t[rows][:, 1], num_nodes=4)
    kg = load_kg({"train": split([0, 1, 2]), "val": split([3]), "test": split([3])})
    assert (kg.num_entities, kg.num_relations, kg.entity_names) == (4, 3, None)
    assert torch.equal(kg.triples("train"), t[:3]) and torch.equal(kg.triples("valid"), t[3:])
    with pytest.raises(KGFormatError, match="missing"):
        load_kg({"train": split([0]), "test": split([3])})
    with pytest.raises(KGFormatError, match="train_mask"):
        load_kg(split([0, 1]))  # one graph and no masks: no splits


def fb15k_237_root(root: Path, kg: KnowledgeGraph) -> Path:
    """A PyG ``FB15k_237`` root holding ``kg``'s splits as its raw files (tab-separated
    names, the last line ending in a newline, as PyG's files do)."""
    (root / "raw").mkdir(parents=True)
    for s in SPLITS:
        t = kg.triples(s).tolist()
        lines = [f"{kg.entity_names[h]}\t{kg.relation_names[r]}\t{kg.entity_names[o]}\n" for h, r, o in t]
        (root / "raw" / f"{s}.txt").write_text("".join(lines))
    return root


def test_a_torch_geometric_dataset_class_loads_from_its_root_offline(tmp_path):
    kg = load_kg("umls")
    root = fb15k_237_root(tmp_path / "FB15k_237", kg)
    loaded = load_kg(f"pyg:FB15k_237@{root}")
    # PyG numbers by first appearance, as the named-triples reader does: the same ids
    same_kg(load_kg(root), KnowledgeGraph({s: loaded.triples(s) for s in SPLITS}, loaded.num_entities,
                                          loaded.num_relations, kg.entity_names, kg.relation_names))
    assert (root / "processed").is_dir()  # PyG processed its raw files where it always does
    from torch_geometric.datasets import FB15k_237

    train = FB15k_237(str(root), split="train")[0]  # the same root, read by PyG alone
    assert torch.equal(loaded.triples("train"), torch.stack([train.edge_index[0], train.edge_type,
                                                             train.edge_index[1]], 1))


def test_an_empty_root_is_a_clear_error_in_the_loader_and_before_a_run(tmp_path):
    (tmp_path / "empty" / "raw").mkdir(parents=True)
    for root in (tmp_path / "empty", tmp_path / "absent"):
        with pytest.raises(FileNotFoundError, match="holds nothing.*never downloads"):
            load_pyg_root("FB15k_237", root)
    from lightning_fedkg.cli import check_data_name

    cfg = make_small_config("fede", f"data.name=pyg:WordNet18RR@{tmp_path / 'empty'}")
    with pytest.raises(ConfigError, match="holds nothing"):
        check_data_name(cfg)
    with pytest.raises(ConfigError, match=r"pyg:<Class>@<root>"):
        check_data_name(make_small_config("fede", "data.name=pyg:FB15k_237"))
    with pytest.raises(ValueError, match="not a dataset class"):
        load_kg(f"pyg:NoSuchKG@{tmp_path}")


def test_the_bundled_kgs_are_pyg_datasets_with_load_kgs_ids(tmp_path):
    kg = load_kg("umls")
    for pyg_split, split in (("train", "train"), ("val", "valid"), ("test", "test")):
        dataset = UMLS(tmp_path / "umls", split=pyg_split)  # filled from the package, offline
        assert len(dataset) == 1
        data = dataset[0]
        assert torch.equal(data.edge_index, kg.data(split).edge_index)
        assert torch.equal(data.edge_type, kg.data(split).edge_type) and data.num_nodes == kg.num_entities
    assert dataset.entity_names == kg.entity_names and dataset.num_relations == kg.num_relations
    same_kg(load_kg(f"pyg:UMLS@{tmp_path / 'umls'}"), kg)


def test_any_kg_saved_as_a_dataset_root_keeps_its_ids(tmp_path):
    kg = load_kg("kinship")
    # ids a first-appearance reader would not give: the dataset must keep these
    perm = torch.randperm(kg.num_entities, generator=torch.Generator().manual_seed(0))
    names = [kg.entity_names[int(i)] for i in torch.argsort(perm)]
    moved = KnowledgeGraph({s: torch.stack([perm[t[:, 0]], t[:, 1], perm[t[:, 2]]], 1)
                            for s, t in ((s, kg.triples(s)) for s in SPLITS)},
                           kg.num_entities, kg.num_relations, names, kg.relation_names)
    root = save_kg_dataset(kg_to_pyg(moved), tmp_path / "kinship")
    same_kg(kg_from_pyg({s: KGDataset(root, split=s) for s in ("train", "val", "test")}), moved)


def test_each_clients_pyg_data_maps_back_to_global_ids():
    kg = load_kg("umls")
    fed = partition_by_relation(kg, 3, seed=1)
    for c in range(fed.num_clients):
        datas = fed.client_data(c)
        assert set(datas) == {"train", "val", "test"}
        for s, pyg in (("train", "train"), ("valid", "val"), ("test", "test")):
            d = datas[pyg]
            assert d.num_nodes == fed.clients[c].num_entities == d.n_id.numel()
            glob = torch.stack([d.n_id[d.edge_index[0]], d.r_id[d.edge_type], d.n_id[d.edge_index[1]]], 1)
            assert torch.equal(glob, fed.global_triples(c, s))
        assert fed.client_data(c, "valid").edge_type.numel() == datas["val"].edge_type.numel()
    # every client's triples are the source's triples
    every = torch.cat([fed.global_triples(c, s) for c in range(3) for s in SPLITS])
    source = {tuple(x) for x in torch.cat([kg.triples(s) for s in SPLITS]).tolist()}
    assert {tuple(x) for x in every.tolist()} <= source


def test_a_federation_built_from_pyg_data_trains(tmp_path):
    """UMLS as PyG data (one Data per split) -> a dataset root -> FedE from a config naming it
    -> the test MRR beats the same clients' untrained models."""
    from lightning_fedkg.federated.party import build_client_parties, load_federated_kg
    from lightning_fedkg.federated.tasks import LinkPrediction, weighted_average
    from lightning_fedkg.run import fit

    data = {s: UMLS(tmp_path / "umls", split=s)[0] for s in ("train", "val", "test")}
    root = save_kg_dataset(data, tmp_path / "from_data")
    shutil.rmtree(tmp_path / "umls")
    cfg = make_small_config("fede", f"data.name=pyg:KGDataset@{root}", "model.dim=16", "train.num_negatives=16",
                            "federated.rounds=4", "federated.eval_every=2", "train.lr=0.05", "trainer.threads=1")
    fkg = load_federated_kg(cfg)
    assert fkg.num_entities == 135 and fkg.num_clients == 3
    task = LinkPrediction()
    untrained = weighted_average([task.evaluate(p, "test") for p in build_client_parties(cfg, task, fkg)])["mrr"]
    metrics = fit(cfg, tmp_path / "run")
    assert metrics["rounds"] == 4
    assert metrics["test"]["mrr"] > untrained + 0.1, (metrics["test"]["mrr"], untrained)


def test_the_python_blocks_of_the_datasets_page_run(tmp_path, monkeypatch):
    """docs/datasets.md shows how to hand PyG data to a federation: its code must run."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "datasets.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "docs/datasets.md", "exec"), {})
    assert (tmp_path / "data" / "pyg" / "my_kg" / "raw" / "entities.dict").is_file()


def test_wordnet18rrs_one_graph_with_masks_loads_through_pyg_offline(tmp_path):
    """PyG's WordNet18RR gives one Data with train/val/test masks and its own relation ids:
    ``pyg:WordNet18RR@root`` cuts it by the masks, with the same triples as PyG's graph."""
    from torch_geometric.datasets import WordNet18RR

    raw = tmp_path / "wn" / "raw"
    raw.mkdir(parents=True)
    files = {"train": "001 _hypernym 002\n003 _also_see 001\n002 _verb_group 003\n",
             "valid": "001 _also_see 002\n", "test": "003 _hypernym 002\n"}
    for s, text in files.items():
        (raw / f"{s}.txt").write_text(text)
    kg = load_kg(f"pyg:WordNet18RR@{tmp_path / 'wn'}")
    graph = WordNet18RR(str(tmp_path / "wn"))[0]  # processed by the load above: no download
    assert (kg.num_entities, kg.num_relations) == (graph.num_nodes, len(WordNet18RR.edge2id))
    assert kg.relation_names[WordNet18RR.edge2id["_hypernym"]] == "_hypernym"
    for s, mask in (("train", graph.train_mask), ("valid", graph.val_mask), ("test", graph.test_mask)):
        expect = torch.stack([graph.edge_index[0], graph.edge_type, graph.edge_index[1]], 1)[mask]
        assert torch.equal(kg.triples(s), expect)
    assert kg.triples("train").shape[0] == 3
