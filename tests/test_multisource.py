"""Multi-source KGs (FKGE's setting): split_into_sources, aligned_pairs, the folder layout."""

import importlib.util
import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch

from lightning_fedkg.data import KGFormatError, KnowledgeGraph, load_kg, partition_by_relation
from lightning_fedkg.methods.fkge.multisource import (
    aligned_pairs,
    load_multisource,
    load_multisource_folder,
    multisource_stats,
    split_into_sources,
    write_multisource_folder,
)

SPLIT3 = ("train", "valid", "test")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tools" / "make_multisource.py"


@pytest.fixture(scope="module")
def umls():
    return load_kg("umls")


@pytest.fixture(scope="module")
def sources(umls):
    return split_into_sources(umls, 3, seed=7)


def named(kg: KnowledgeGraph, split: str) -> list[tuple[str, str, str]]:
    """Brute force: every triple of a split spelled out with the KG's names."""
    return [(kg.entity_names[h], kg.relation_names[r], kg.entity_names[t])
            for h, r, t in kg.triples(split).tolist()]


def same_kg(a: KnowledgeGraph, b: KnowledgeGraph) -> bool:
    return (a.name == b.name and a.entity_names == b.entity_names
            and a.relation_names == b.relation_names
            and all(torch.equal(a.triples(s), b.triples(s)) for s in SPLIT3))


def test_deterministic(umls, sources):
    again = split_into_sources(umls, 3, seed=7)
    assert all(same_kg(a, b) for a, b in zip(sources, again))
    other = split_into_sources(umls, 3, seed=8)
    assert not all(same_kg(a, b) for a, b in zip(sources, other))
    assert [kg.name for kg in sources] == ["umls-src0", "umls-src1", "umls-src2"]


def test_every_triple_in_exactly_one_source(umls, sources):
    # the pool is the loaded KG's train+valid+test; the loader's policy is reported in
    # kg.removed (the bundled UMLS files need none), and the splitter itself drops nothing
    assert all(v == {"duplicates": 0, "unseen": 0} for v in umls.removed.values())
    original = Counter(t for s in SPLIT3 for t in named(umls, s))
    got = Counter(t for kg in sources for s in SPLIT3 for t in named(kg, s))
    assert got == original
    assert max(got.values()) == 1
    assert sum(sum(kg.stats()[s] for s in SPLIT3) for kg in sources) == 5216 + 652 + 661
    for kg in sources:
        assert all(v == {"duplicates": 0, "unseen": 0} for v in kg.removed.values())


def test_relations_disjoint_and_eval_seen_in_train(sources):
    rel_sets = [set(kg.relation_names) for kg in sources]
    assert sum(map(len, rel_sets)) == len(set().union(*rel_sets)) == 46
    for kg in sources:
        n = sum(kg.stats()[s] for s in SPLIT3)
        assert kg.stats()["valid"] == round(0.05 * n) and kg.stats()["test"] == round(0.05 * n)
        train = kg.triples("train")
        ents, rels = set(train[:, [0, 2]].flatten().tolist()), set(train[:, 1].tolist())
        # local ids are exactly the train entities / relations, in order of first appearance
        assert ents == set(range(kg.num_entities)) and rels == set(range(kg.num_relations))
        flat = train[:, [0, 2]].flatten().tolist()
        assert list(dict.fromkeys(flat)) == list(range(kg.num_entities))
        assert list(dict.fromkeys(train[:, 1].tolist())) == list(range(kg.num_relations))
        for s in ("valid", "test"):
            t = kg.triples(s)
            assert set(t[:, [0, 2]].flatten().tolist()) <= ents
            assert set(t[:, 1].tolist()) <= rels


def test_same_triples_as_partition_by_relation(umls, sources):
    fed = partition_by_relation(umls, 3, seed=7, valid_frac=0.05, test_frac=0.05)
    for kg, client in zip(sources, fed.clients):
        for s in SPLIT3:
            assert Counter(named(kg, s)) == Counter(named(client, s))


def test_shared_relations(umls):
    src = split_into_sources(umls, 3, seed=7, shared_relations=0.2)
    counts = Counter(r for kg in src for r in kg.relation_names)
    shared = [r for r, c in counts.items() if c > 1]
    assert len(shared) >= round(0.2 * 46) - 1  # a shared relation with few triples may miss a source
    assert len(counts) == 46
    original = Counter(t for s in SPLIT3 for t in named(umls, s))
    assert Counter(t for kg in src for s in SPLIT3 for t in named(kg, s)) == original
    stats = multisource_stats(src)
    assert stats["shared_relations"][0][1] == len(set(src[0].relation_names) & set(src[1].relation_names)) > 0
    with pytest.raises(ValueError, match="shared_relations"):
        split_into_sources(umls, 3, seed=7, shared_relations=1.0)


def test_aligned_pairs_brute_force(sources):
    for a in sources:
        for b in sources:
            for kind in ("entity", "relation"):
                na = a.entity_names if kind == "entity" else a.relation_names
                nb = b.entity_names if kind == "entity" else b.relation_names
                where = {n: j for j, n in enumerate(nb)}
                expected = [[i, where[n]] for i, n in enumerate(na) if n in where]
                got = aligned_pairs(a, b, kind)
                assert got.dtype == torch.long and got.shape == (len(expected), 2)
                assert got.tolist() == expected
    # UMLS: 135 entities over 3 sources, so they share most of them
    assert aligned_pairs(sources[0], sources[1]).shape[0] > 100
    stats = multisource_stats(sources)
    assert stats["shared_entities"][0][0] == sources[0].num_entities
    assert stats["shared_entities"][0][1] == aligned_pairs(sources[0], sources[1]).shape[0]
    with pytest.raises(ValueError, match="kind"):
        aligned_pairs(sources[0], sources[1], "triple")


def test_folder_round_trip(tmp_path, sources):
    root = write_multisource_folder(sources, tmp_path / "ms")
    (root / "README.md").write_text("ignored\n")
    back = load_multisource_folder(root)
    assert all(same_kg(a, b) for a, b in zip(sources, back)) and len(back) == 3
    assert all(same_kg(a, b) for a, b in zip(sources, load_multisource(root)))
    assert all(same_kg(a, b) for a, b in zip(sources, load_multisource("umls", 3, seed=7)))


def test_folder_with_openke_kg(tmp_path, sources):
    """An OpenKE sub-folder aligns with the others by the name strings of entity2id.txt."""
    root = tmp_path / "ms"
    write_multisource_folder(sources[:2], root)
    kg = sources[2]
    d = root / "zz-openke"
    d.mkdir()
    # ids deliberately permuted: OpenKE's integer ids are local and never compared
    perm = torch.randperm(kg.num_entities, generator=torch.Generator().manual_seed(0))
    (d / "entity2id.txt").write_text(f"{kg.num_entities}\n" + "".join(
        f"{kg.entity_names[i]}\t{int(perm[i])}\n" for i in range(kg.num_entities)))
    (d / "relation2id.txt").write_text(f"{kg.num_relations}\n" + "".join(
        f"{n}\t{i}\n" for i, n in enumerate(kg.relation_names)))
    for s in SPLIT3:
        t = kg.triples(s)
        (d / f"{s}2id.txt").write_text(f"{t.shape[0]}\n" + "".join(
            f"{int(perm[h])} {int(perm[o])} {r}\n" for h, r, o in t.tolist()))
    back = load_multisource_folder(root)
    assert [b.name for b in back] == ["umls-src0", "umls-src1", "zz-openke"]
    assert Counter(named(back[2], "test")) == Counter(named(kg, "test"))
    assert aligned_pairs(back[0], back[2]).shape[0] == aligned_pairs(sources[0], kg).shape[0]


def test_errors(tmp_path, umls, sources):
    with pytest.raises(ValueError, match="46 relations .* cannot be split among 47 sources"):
        split_into_sources(umls, 47, seed=0)
    with pytest.raises(ValueError, match="num_clients must be >= 1"):
        split_into_sources(umls, 0, seed=0)
    unnamed = KnowledgeGraph({s: umls.triples(s) for s in SPLIT3}, umls.num_entities, umls.num_relations)
    with pytest.raises(ValueError, match="names"):
        split_into_sources(unnamed, 3, seed=0)
    with pytest.raises(ValueError, match="names"):
        aligned_pairs(unnamed, sources[0])
    # a malformed line names the file and its 1-based line number
    root = write_multisource_folder(sources, tmp_path / "bad")
    f = root / "umls-src1" / "valid.txt"
    lines = f.read_text().splitlines()
    lines[4] = "only\ttwo"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(KGFormatError, match=rf"{f}:5: expected 3 non-empty tab-separated fields"):
        load_multisource_folder(root)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no KG sub-folders"):
        load_multisource_folder(tmp_path / "empty")
    (tmp_path / "empty" / "notakg").mkdir()
    with pytest.raises(FileNotFoundError, match="not a KG folder"):
        load_multisource_folder(tmp_path / "empty")
    # names that would not read back are refused before anything is written
    bad = KnowledgeGraph({s: sources[0].triples(s) for s in SPLIT3}, sources[0].num_entities,
                         sources[0].num_relations, ["a\tb"] + sources[0].entity_names[1:],
                         sources[0].relation_names, name="x")
    with pytest.raises(ValueError, match="tab or newline"):
        write_multisource_folder([bad], tmp_path / "w")
    with pytest.raises(ValueError, match="distinct"):
        write_multisource_folder([sources[0], sources[0]], tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_loader_policy_is_reported(tmp_path, caplog):
    """A user folder whose test has an entity unseen in train: dropped, logged, counted."""
    d = tmp_path / "ms" / "kg_a"
    d.mkdir(parents=True)
    (d / "train.txt").write_text("a\tr\tb\nb\tr\tc\n")
    (d / "valid.txt").write_text("a\tr\tc\n")
    (d / "test.txt").write_text("a\tr\tz\nc\tr\ta\n")
    with caplog.at_level(logging.WARNING, logger="lightning_fedkg"):
        (kg,) = load_multisource_folder(tmp_path / "ms")
    assert kg.name == "kg_a" and kg.removed["test"] == {"duplicates": 0, "unseen": 1}
    assert "dropped 1 'test' triples" in caplog.text


def test_script(tmp_path, capsys, sources):
    spec = importlib.util.spec_from_file_location("make_multisource", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "umls-MS3"
    assert script.main(["--kg", "umls", "--sources", "3", "--seed", "7", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| umls-src0 |" in printed and "| shared entities |" in printed
    assert all(same_kg(a, b) for a, b in zip(sources, load_multisource_folder(out)))
    stats = json.loads((out / "stats.json").read_text())
    assert stats["shared_entities"] == multisource_stats(sources)["shared_entities"]
    assert stats["arguments"]["seed"] == 7 and (out / "README.md").is_file()
