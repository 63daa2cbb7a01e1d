"""FedLU's data rules (lightning_fedkg/methods/fedlu/data.py): the official validation
filter, which leaves a client's forgetting set out of validation only, and the strategy
hook that applies it; other strategies refuse the setting."""

import pytest

from lightning_fedkg.config import ConfigError, load_config
from lightning_fedkg.data import KGDataModule, KnowledgeGraph, LoaderSettings
from lightning_fedkg.methods.fedlu.data import apply_valid_filter
from lightning_fedkg.registry import STRATEGIES

from test_datamodule import brute_answers, pairs, small_kg


def test_the_official_validation_filter_leaves_the_unlearn_triples_out_of_validation_only():
    kg0 = small_kg(2)
    train = kg0.triples("train")
    unlearn = train[:4]
    kg = KnowledgeGraph({s: kg0.triples(s) for s in ("train", "valid", "test")} | {"unlearn": unlearn},
                        kg0.num_entities, kg0.num_relations)
    everything = {tuple(x) for x in kg.all_true_triples().tolist()}
    without = everything - {tuple(x) for x in unlearn.tolist()}
    filtered = {}
    for valid_filter, valid_truth in (("all", everything), ("without_unlearn", without)):
        dm = apply_valid_filter(valid_filter, KGDataModule(kg, loader=LoaderSettings(eval_batch_size=100)))
        filtered[valid_filter] = sum(len(b["filter_row"]) for b in dm.eval_dataloader("valid"))
        for split, truth in (("valid", valid_truth), ("test", everything)):
            for b in dm.eval_dataloader(split):
                target = 2 if b["mode"] == "tail" else 0
                expect = {(i, e) for i, e in brute_answers(truth, b["triples"], b["mode"])
                          if e != b["triples"][i, target].item()}
                assert pairs(b["filter_row"], b["filter_col"]) == expect, (valid_filter, split)
    assert filtered["without_unlearn"] < filtered["all"]  # some validation query had an unlearn answer
    with pytest.raises(ValueError, match="valid_filter"):
        apply_valid_filter("official", KGDataModule(kg))


def test_only_fedlu_honours_train_valid_filter():
    kg0 = small_kg(2)
    kg = KnowledgeGraph({s: kg0.triples(s) for s in ("train", "valid", "test")} | {"unlearn": kg0.triples("train")[:4]},
                        kg0.num_entities, kg0.num_relations)
    fedlu = load_config(None, ["federated.strategy=fedlu", "train.valid_filter=without_unlearn"])
    dm = STRATEGIES.get("fedlu").prepare_datamodule(fedlu, KGDataModule(kg))
    assert not bool(dm.valid_filter_index.contains(kg.triples("unlearn")).any())
    assert bool(dm.filter_index.contains(kg.triples("unlearn")).all())
    fede = load_config(None, ["federated.strategy=fede", "train.valid_filter=without_unlearn"])
    with pytest.raises(ConfigError, match="train.valid_filter=without_unlearn"):
        STRATEGIES.get("fede").prepare_datamodule(fede, KGDataModule(kg))
