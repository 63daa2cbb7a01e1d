"""KnowledgeGraph and its loaders: formats, input policy, PyG offline loading."""

import logging
from pathlib import Path

import pytest
import torch

from lightning_fedkg.data import (
    BUNDLED_DATASETS,
    KGFormatError,
    KnowledgeGraph,
    clean_splits,
    load_kg,
    load_openke,
    load_pyg,
    load_triples_folder,
    unique_triples,
)
from lightning_fedkg.data.kg_io import names_to_ids, read_named_triples

from conftest import SHARED_DATA, needs_shared


def write_split_files(folder: Path, splits: dict[str, str], ext: str = ".txt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in splits.items():
        (folder / f"{name}{ext}").write_text(text, encoding="utf-8")
    return folder


TOY = {
    "train": "a\tr1\tb\nb\tr2\tc\nc\tr1\ta\na\tr1\tb\n",  # last line duplicates the first
    "valid": "b\tr1\tc\nz\tr1\ta\n",  # z never occurs in train
    "test": "a\tr2\tc\nc\tr9\tb\na\tr2\tc\n",  # r9 never occurs in train; duplicate
}


# ---- bundled data ----------------------------------------------------------------------

@pytest.mark.parametrize("name,counts", [
    ("umls", (135, 46, 5216, 652, 661)),
    ("nations", (14, 55, 1592, 199, 201)),
    ("kinship", (104, 25, 8544, 1068, 1074)),
])
def test_bundled_counts(name, counts):
    kg = load_kg(name)
    s = kg.stats()
    assert (s["entities"], s["relations"], s["train"], s["valid"], s["test"]) == counts
    assert s["name"] == name
    assert name in BUNDLED_DATASETS
    # vocabularies are inverse maps
    assert all(kg.entity_to_id[n] == i for i, n in enumerate(kg.entity_names))
    assert all(kg.relation_to_id[n] == i for i, n in enumerate(kg.relation_names))


def test_bundled_ids_match_the_files():
    kg = load_kg("nations")
    first = Path(__file__).resolve().parents[1] / "lightning_fedkg/data/bundled/nations/train.txt"
    h, r, t = first.read_text().splitlines()[0].split("\t")
    # ids in order of first appearance: the first line's head is entity 0, its tail 1
    assert kg.triples("train")[0].tolist() == [0, 0, 1]
    assert (kg.entity_names[0], kg.relation_names[0], kg.entity_names[1]) == (h, r, t)


# ---- named triples + policy ------------------------------------------------------------

def test_named_folder_ids_and_policy(tmp_path, caplog):
    write_split_files(tmp_path / "toy", TOY)
    with caplog.at_level(logging.WARNING, logger="lightning_fedkg"):
        kg = load_triples_folder(tmp_path / "toy")
    # first appearance train -> valid -> test, head before tail
    assert kg.entity_names == ["a", "b", "c", "z"]
    assert kg.relation_names == ["r1", "r2", "r9"]
    assert kg.triples("train").tolist() == [[0, 0, 1], [1, 1, 2], [2, 0, 0]]
    assert kg.triples("valid").tolist() == [[1, 0, 2]]
    assert kg.triples("test").tolist() == [[0, 1, 2]]
    assert kg.removed == {"train": {"duplicates": 1, "unseen": 0},
                          "valid": {"duplicates": 0, "unseen": 1},
                          "test": {"duplicates": 1, "unseen": 1}}
    text = caplog.text
    assert "removed 1 duplicate triples from split 'train'" in text
    assert "dropped 1 'valid' triples" in text
    assert "removed 1 duplicate triples from split 'test'" in text
    assert "dropped 1 'test' triples" in text
    assert kg.stats() == {"name": "toy", "entities": 4, "relations": 3,
                          "train": 3, "valid": 1, "test": 1}


def test_raw_subfolder_tsv_and_whitespace(tmp_path):
    write_split_files(tmp_path / "ds" / "raw", {"train": "a r b\nb r a\n", "valid": "a r a\n",
                                                "test": "b r b"}, ext=".tsv")
    kg = load_kg(tmp_path / "ds")
    assert kg.name == "ds"
    assert kg.triples("test").tolist() == [[1, 0, 1]]  # no trailing newline: still read
    assert names_to_ids(kg, [("b", "r", "a")]).tolist() == [[1, 0, 0]]


@pytest.mark.parametrize("bad_line,lineno", [
    ("a\tr1", 4),              # two fields
    ("a\tr1\tb\tc", 4),        # four fields
    ("a\t\tb", 4),             # empty relation
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, lineno):
    # line 2 is blank and must still count for the line number
    write_split_files(tmp_path, {"train": f"a\tr1\tb\n\nb\tr1\ta\n{bad_line}\n",
                                 "valid": "a\tr1\tb\n", "test": "a\tr1\tb\n"})
    with pytest.raises(KGFormatError) as err:
        load_triples_folder(tmp_path)
    msg = str(err.value)
    assert f"train.txt:{lineno}:" in msg
    assert str(tmp_path) in msg
    assert isinstance(err.value, ValueError)


def test_empty_split_is_an_error(tmp_path):
    write_split_files(tmp_path, {"train": "a\tr\tb\n", "valid": "\n\n", "test": "a\tr\tb\n"})
    with pytest.raises(KGFormatError, match=r"valid\.txt.*no triples"):
        load_triples_folder(tmp_path)


def test_missing_split_file(tmp_path):
    write_split_files(tmp_path, {"train": "a\tr\tb\n", "valid": "a\tr\tb\n"})
    with pytest.raises(FileNotFoundError, match="test"):
        load_triples_folder(tmp_path)


def test_read_named_triples_keeps_spaces_in_tab_files(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("new york\tcapital of\tusa\r\n\n  b\tr\tc  \n")
    h, r, t, lines = read_named_triples(p)
    assert (h, r, t, lines) == (["new york", "b"], ["capital of", "r"], ["usa", "c"], [1, 3])


# ---- KnowledgeGraph object --------------------------------------------------------------

def test_knowledge_graph_data_views_and_union():
    splits = {"train": torch.tensor([[0, 0, 1], [1, 1, 2]]), "valid": torch.tensor([[0, 0, 1]]),
              "test": torch.tensor([[2, 1, 0]]), "unlearn": torch.tensor([[1, 1, 2]])}
    kg = KnowledgeGraph(splits, 3, 2, name="k")
    d = kg.train
    assert d.edge_index.tolist() == [[0, 1], [1, 2]]
    assert d.edge_type.tolist() == [0, 1]
    assert d.num_nodes == 3
    assert kg.valid.edge_index.tolist() == [[0], [1]]
    assert kg.split_names == ["train", "valid", "test", "unlearn"]
    # train ∪ valid ∪ test, the shared triple once, unlearn not included
    assert sorted(kg.all_true_triples().tolist()) == [[0, 0, 1], [1, 1, 2], [2, 1, 0]]
    assert kg.stats()["unlearn"] == 1
    assert kg.entity_names is None and kg.entity_to_id == {}


@pytest.mark.parametrize("splits,match", [
    ({"train": torch.zeros(1, 3, dtype=torch.long), "valid": torch.zeros(0, 3)}, "missing"),
    ({"train": torch.tensor([[0, 0, 5]]), "valid": torch.zeros(0, 3), "test": torch.zeros(0, 3)},
     "entity id"),
    ({"train": torch.tensor([[0, 3, 1]]), "valid": torch.zeros(0, 3), "test": torch.zeros(0, 3)},
     "relation id"),
    ({"train": torch.zeros(2, 2), "valid": torch.zeros(0, 3), "test": torch.zeros(0, 3)}, "shape"),
])
def test_knowledge_graph_validates(splits, match):
    with pytest.raises(ValueError, match=match):
        KnowledgeGraph(splits, 2, 2)


def test_unique_and_clean_keep_first_occurrence_order():
    t = torch.tensor([[2, 0, 1], [0, 0, 1], [2, 0, 1], [1, 1, 0], [0, 0, 1]])
    assert unique_triples(t, 3, 2).tolist() == [[2, 0, 1], [0, 0, 1], [1, 1, 0]]
    splits, removed = clean_splits({"train": t, "valid": torch.tensor([[2, 1, 1], [0, 1, 0]]),
                                    "test": torch.zeros(0, 3, dtype=torch.long)}, 4, 3)
    # entity 3 and relation 2 unused; valid (2,1,1): relation 1 seen, entities 2,1 seen -> kept
    assert splits["valid"].tolist() == [[2, 1, 1], [0, 1, 0]]
    assert removed["train"]["duplicates"] == 2


# ---- OpenKE ----------------------------------------------------------------------------

def write_openke(folder: Path, train: str = "2\n0 1 0\n1 2 1\n", valid: str = "1\n0 2 1\n",
                 test: str = "1\n2 0 1\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entity2id.txt").write_text("3\nzeta\t2\nalpha beta\t0\ngamma\t1\n")
    (folder / "relation2id.txt").write_text("2\nlikes\t1\nknows\t0\n")
    (folder / "train2id.txt").write_text(train)
    (folder / "valid2id.txt").write_text(valid)
    (folder / "test2id.txt").write_text(test)
    return folder


def test_openke_reorders_columns_and_keeps_ids(tmp_path):
    kg = load_kg(write_openke(tmp_path / "ok"))  # auto-detected by entity2id.txt
    assert kg.entity_names == ["alpha beta", "gamma", "zeta"]
    assert kg.relation_names == ["knows", "likes"]
    # OpenKE lines are "head tail relation"
    assert kg.triples("train").tolist() == [[0, 0, 1], [1, 1, 2]]
    assert kg.triples("valid").tolist() == [[0, 1, 2]]
    assert kg.triples("test").tolist() == [[2, 1, 0]]


@pytest.mark.parametrize("train,match", [
    ("3\n0 1 0\n1 2 1\n", r"train2id\.txt:1: header says 3"),
    ("2\n0 1 0\n1 x 1\n", r"train2id\.txt:3:"),
    ("2\n0 1 0\n1 2\n", r"train2id\.txt:3:"),
    ("2\n0 1 0\n1 7 1\n", r"train2id\.txt:3: id out of range"),
    ("zwei\n0 1 0\n", r"train2id\.txt:1:"),
    ("0\n", "no triples"),
])
def test_openke_errors(tmp_path, train, match):
    with pytest.raises(KGFormatError, match=match):
        load_openke(write_openke(tmp_path / "bad", train=train))


@needs_shared
def test_openke_nell995(caplog, one_thread):
    with caplog.at_level(logging.WARNING, logger="lightning_fedkg"):
        kg = load_kg(SHARED_DATA / "NELL-995")
    assert (kg.num_entities, kg.num_relations) == (75492, 200)
    # before the policy: 149678 / 543 / 3992 (file headers); valid/test triples whose
    # entity or relation is not in train are dropped; NELL-995 has no duplicates
    before = {s: kg.stats()[s] + sum(kg.removed[s].values()) for s in ("train", "valid", "test")}
    assert before == {"train": 149678, "valid": 543, "test": 3992}
    assert kg.removed == {"train": {"duplicates": 0, "unseen": 0},
                          "valid": {"duplicates": 0, "unseen": 102},
                          "test": {"duplicates": 0, "unseen": 1159}}
    assert "dropped 1159 'test' triples" in caplog.text
    # spot-check one id line against the vocab files: train2id line 2 is "0 1 0"
    assert kg.triples("train")[0].tolist() == [0, 0, 1]


# ---- PyG datasets, offline ---------------------------------------------------------------

@pytest.fixture
def no_download(monkeypatch):
    import torch_geometric.data
    import torch_geometric.datasets.freebase as fb
    import torch_geometric.datasets.word_net as wn

    def forbidden(*args, **kwargs):
        raise AssertionError("a download was attempted")

    for mod in (torch_geometric.data, fb, wn):
        monkeypatch.setattr(mod, "download_url", forbidden)


def test_pyg_fb15k237_offline_no_triple_lost(tmp_path, no_download):
    src = write_split_files(tmp_path / "fb" / "raw", {
        "train": "/m/a\t/r/x\t/m/b\r\n/m/b\t/r/y\t/m/c\r\n/m/c\t/r/x\t/m/a",  # no final newline
        "valid": "/m/a\t/r/y\t/m/c\n",
        "test": "/m/b\t/r/x\t/m/c",
    }).parent
    before = sorted(p.name for p in src.rglob("*"))
    cache = tmp_path / "cache"
    kg = load_pyg(src, "FB15k_237", cache_dir=cache)
    assert kg.stats() == {"name": "fb", "entities": 3, "relations": 2,
                          "train": 3, "valid": 1, "test": 1}
    assert kg.triples("train").tolist() == [[0, 0, 1], [1, 1, 2], [2, 0, 0]]
    assert kg.entity_names == ["/m/a", "/m/b", "/m/c"]
    # same ids as our own named loader (both use first appearance)
    ours = load_kg(src, fmt="triples")
    assert all(torch.equal(ours.triples(s), kg.triples(s)) for s in ("train", "valid", "test"))
    # the user's folder is untouched; PyG worked in the cache
    assert sorted(p.name for p in src.rglob("*")) == before
    roots = list(cache.iterdir())
    assert len(roots) == 1 and (roots[0] / "processed").is_dir()
    # cached copies end with a newline
    assert all((roots[0] / "raw" / f).read_text().endswith("\n") for f in ("train.txt", "test.txt"))
    # a changed source is picked up (cache rebuilt)
    (src / "raw" / "test.txt").write_text("/m/c\t/r/y\t/m/b\n/m/a\t/r/x\t/m/c\n")
    kg2 = load_pyg(src, "FB15k_237", cache_dir=cache)
    assert kg2.triples("test").tolist() == [[2, 1, 1], [0, 0, 2]]


def test_pyg_download_is_refused_not_attempted(tmp_path, no_download):
    from lightning_fedkg.data.pyg import _pyg_class

    cls = _pyg_class("FB15k_237")
    with pytest.raises(RuntimeError, match="never downloads"):
        cls(str(tmp_path / "empty"))  # no raw files: PyG would download


def test_pyg_wordnet18rr_names_and_relation_ids(tmp_path, no_download):
    src = write_split_files(tmp_path / "wn" / "raw", {
        "train": "001 _hypernym 002\n003 _also_see 001\n002 _verb_group 003\n",
        "valid": "001 _also_see 002\n",
        "test": "003 _hypernym 002\n",
    }).parent
    kg = load_kg(src, fmt="pyg_wn18rr", cache_dir=tmp_path / "cache")
    assert kg.num_relations == 11
    assert kg.relation_names[3] == "_hypernym" and kg.relation_names[0] == "_also_see"
    # every file triple maps back to its names through the reconstructed vocab
    named = {"train": [("001", "_hypernym", "002"), ("003", "_also_see", "001"),
                       ("002", "_verb_group", "003")],
             "valid": [("001", "_also_see", "002")], "test": [("003", "_hypernym", "002")]}
    for split, rows in named.items():
        got = {tuple((kg.entity_names[h], kg.relation_names[r], kg.entity_names[t]))
               for h, r, t in kg.triples(split).tolist()}
        assert got == set(rows)


def test_pyg_wordnet18rr_unknown_relation(tmp_path, no_download):
    src = write_split_files(tmp_path / "wn", {"train": "1 _hypernym 2\n1 _foo 2\n",
                                              "valid": "1 _hypernym 2\n", "test": "1 _hypernym 2\n"})
    with pytest.raises(KGFormatError, match=r"train\.txt:2: relation '_foo'"):
        load_pyg(src, "WordNet18RR", cache_dir=tmp_path / "cache")


def test_load_kg_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a bundled"):
        load_kg(tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown fmt"):
        load_kg(tmp_path, fmt="xml")
