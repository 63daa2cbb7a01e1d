"""Synthetic power-law KGs (``fedkg data synth``, lightning_fedkg.data.synthetic): deterministic
by seed, a normal KG folder, evaluation triples over training entities and relations."""

from __future__ import annotations

import pytest
import torch

from lightning_fedkg.cli import main
from lightning_fedkg.data import load_kg, triple_keys
from lightning_fedkg.data.synthetic import synthetic_splits, write_synthetic

SIZES = dict(num_entities=2000, num_relations=20, num_triples=30000)


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_same_seed_writes_the_same_files_and_another_seed_other_files(tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        write_synthetic(tmp_path / name, **SIZES, seed=seed)
    assert files(tmp_path / "a") == files(tmp_path / "b")
    other = files(tmp_path / "c")
    assert all(other[name] != data for name, data in files(tmp_path / "a").items())


def test_the_splits_are_distinct_triples_and_evaluation_stays_inside_train():
    splits = synthetic_splits(**SIZES, exponent=0.75, seed=0, valid_frac=0.1, test_frac=0.05)
    assert {s: t.shape[0] for s, t in splits.items()} == {"train": 25500, "valid": 3000, "test": 1500}
    everything = torch.cat(list(splits.values()))
    assert triple_keys(everything, 2000, 20).unique().numel() == 30000  # no duplicate in or across splits
    assert not (everything[:, 0] == everything[:, 2]).any()
    train = splits["train"]
    assert torch.unique(train[:, [0, 2]]).numel() == 2000 and torch.unique(train[:, 1]).numel() == 20
    entities = torch.zeros(2000, dtype=torch.bool)
    entities[train[:, [0, 2]].reshape(-1)] = True
    for split in ("valid", "test"):
        assert entities[splits[split][:, [0, 2]]].all()


def test_entity_degrees_have_a_heavy_tail():
    train = synthetic_splits(**SIZES, exponent=0.75, seed=0)["train"]
    degree = torch.bincount(train[:, [0, 2]].reshape(-1), minlength=2000).double()
    # a uniform graph's largest degree is about twice its mean; a Zipf(0.75) one's is ~40x
    assert degree.max() > 20 * degree.mean()
    assert degree.min() >= 1 and degree.median() < degree.mean()
    flat = synthetic_splits(**SIZES, exponent=0.0, seed=0)["train"]
    assert torch.bincount(flat[:, [0, 2]].reshape(-1)).max() < 3 * degree.mean()


def test_the_folder_loads_as_a_normal_kg_with_nothing_removed(tmp_path):
    write_synthetic(tmp_path, **SIZES, seed=1)
    kg = load_kg(str(tmp_path))
    assert (kg.num_entities, kg.num_relations) == (2000, 20)
    assert kg.stats()["train"] + kg.stats()["valid"] + kg.stats()["test"] == 30000
    assert all(counts == {"duplicates": 0, "unseen": 0} for counts in kg.removed.values())
    assert kg.entity_names[0].startswith("e") and len(set(map(len, kg.entity_names))) == 1  # zero-padded


def test_the_command_writes_the_folder_and_refuses_impossible_sizes(tmp_path, capsys):
    out = tmp_path / "synth"
    assert main(["data", "synth", "--entities", "500", "--relations", "5", "--triples", "4000",
                 "--exponent", "0.9", "--seed", "7", "--out", str(out)]) == 0
    assert "train 3600, valid 200, test 200" in capsys.readouterr().out
    write_synthetic(tmp_path / "same", 500, 5, 4000, 0.9, 7)
    assert files(out) == files(tmp_path / "same")
    assert main(["data", "synth", "--entities", "500", "--relations", "5", "--triples", "400",
                 "--out", str(tmp_path / "x")]) == 2
    assert "ask for at least" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs", [dict(num_entities=1), dict(num_relations=3000), dict(exponent=-1.0)])
def test_bad_arguments_are_errors(kwargs):
    with pytest.raises(ValueError):
        synthetic_splits(**{**SIZES, **kwargs})
