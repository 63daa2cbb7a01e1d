"""FKGE KGEmb-Update (lightning_fedkg.methods.fkge.update): virtual rows in and out, replace vs
average, backtracking bit for bit, no mutation of the input KG, TransD's two entity tables.

Bundled UMLS (135 entities), dim 8, at most a few epochs of batch 512: a few seconds.
"""

from __future__ import annotations

import pytest
import torch

from lightning_fedkg.data import LoaderSettings, UniformSampler, load_kg
from lightning_fedkg.methods.fkge.update import add_virtual_rows, kgemb_update, remove_virtual_rows
from lightning_fedkg.models.kge_module import KGEModule

DIM = 8
DM = dict(sampler=UniformSampler(16), loader=LoaderSettings(batch_size=512, eval_batch_size=1024))


@pytest.fixture(scope="module")
def kg():
    return load_kg("umls")


def _module(kg, model="transe", seed=0, **kw) -> KGEModule:
    torch.manual_seed(seed)
    kw.setdefault("lr", 0.05)
    return KGEModule(model, num_entities=kg.num_entities, num_relations=kg.num_relations, dim=DIM, **kw)


def _virtual(kg, k=5, v=3, seed=1):
    """Aligned ids 0..k-1, k translated rows, v virtual entities, one triple per virtual entity."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(k)
    trans = torch.randn(k, DIM, generator=g)
    virt = torch.randn(v, DIM, generator=g)
    n = kg.num_entities
    triples = torch.tensor([[n + i, i % kg.num_relations, i] for i in range(v)])
    return ids, trans, virt, triples


def _snapshot(module):
    return {k: t.detach().clone() for k, t in module.state_dict().items()}


def _assert_state_equal(module, snap):
    state = module.state_dict()
    assert state.keys() == snap.keys()
    for k, t in snap.items():
        assert state[k].shape == t.shape and torch.equal(state[k], t), k


# ------------------------------------------------------------------ (1) add / remove alone


def test_remove_restores_row_counts_and_keeps_non_aligned_rows(kg):
    module = _module(kg)
    snap = _snapshot(module)
    ids, trans, virt, triples = _virtual(kg)
    n, r = kg.num_entities, kg.num_relations
    _, info = add_virtual_rows(kg, module, ids, trans, virt, triples, virtual_relations=2)
    m = module.model
    assert m.entity_emb.shape[0] == n + 3 and m.num_entities == n + 3
    assert m.relation_emb.shape[0] == r + 2 and m.num_relations == r + 2
    assert torch.equal(m.entity_emb[n:], virt)
    remove_virtual_rows(module, info)
    assert m.entity_emb.shape[0] == n and m.num_entities == n
    assert m.relation_emb.shape[0] == r and m.num_relations == r
    rest = torch.arange(5, n)
    assert torch.equal(m.entity_emb[rest], snap["model.entity_emb"][rest])
    assert torch.equal(m.relation_emb, snap["model.relation_emb"])
    assert torch.equal(m.entity_emb[:5], trans)  # the update itself stays
    assert torch.equal(info.aligned_before, snap["model.entity_emb"][:5])


# ------------------------------------------------------------------ (2) replace vs average


@pytest.mark.parametrize("mode", ["replace", "average"])
def test_aligned_rows_replace_or_average(kg, mode):
    module = _module(kg)
    old = module.model.entity_emb.detach().clone()
    ids = torch.tensor([7, 2, 40])
    trans = torch.tensor([[1.0] * DIM, [2.0] * DIM, [-4.0] * DIM])
    add_virtual_rows(kg, module, ids, trans, None, None, mode=mode)
    got = module.model.entity_emb[ids]
    want = trans if mode == "replace" else (old[ids] + trans) / 2
    assert torch.equal(got, want)
    assert module.model.entity_emb.shape[0] == kg.num_entities  # no virtual entities asked


def test_bad_inputs_raise(kg):
    module = _module(kg)
    with pytest.raises(ValueError, match="mode"):
        add_virtual_rows(kg, module, torch.tensor([0]), torch.zeros(1, DIM), mode="sum")
    with pytest.raises(ValueError, match="distinct"):
        add_virtual_rows(kg, module, torch.tensor([0, 0]), torch.zeros(2, DIM))
    with pytest.raises(ValueError, match="entity id"):
        add_virtual_rows(kg, module, torch.tensor([0]), torch.zeros(1, DIM), torch.zeros(1, DIM),
                         torch.tensor([[kg.num_entities + 1, 0, 0]]))
    assert module.model.num_entities == kg.num_entities


# ------------------------------------------------------------------ (3) backtracking


def test_backtracking_restores_exact_state_when_worse(kg):
    module = _module(kg, reset_optimizer=False)
    ids_v, _, virt, triples = _virtual(kg)
    first = kgemb_update(kg, module, torch.zeros(0, dtype=torch.long), torch.zeros(0, DIM), virt,
                         triples, epochs=3, datamodule_kwargs=DM, valid_before=-1.0)
    assert first["accepted"] is True  # a trained start, with persistent Adam state
    for p, s in module._optimizer.state.items():  # moments cut back to the original rows
        assert s["exp_avg"].shape == p.shape and s["exp_avg_sq"].shape == p.shape
    snap = _snapshot(module)
    opt = module.optimizer_state_dict()
    opt_snap = {p: {k: v.clone() for k, v in s.items()} for p, s in opt["state"].items()}
    ids = torch.arange(kg.num_entities)
    garbage = torch.full((kg.num_entities, DIM), 1e6)
    garbage[::2] *= -1
    garbage[:, ::3] = 0.0
    out = kgemb_update(kg, module, ids, garbage, virt * 1e6, triples, epochs=1, datamodule_kwargs=DM)
    assert out["accepted"] is False and out["valid_after"] < out["valid_before"]
    _assert_state_equal(module, snap)
    restored = module.optimizer_state_dict()["state"]
    for p, s in opt_snap.items():
        for k, v in s.items():
            assert torch.equal(restored[p][k], v)


def test_backtracking_keeps_improved_state(kg):
    module = _module(kg)  # untrained: one epoch at lr 0.05 improves it
    snap = _snapshot(module)
    ids, _, virt, triples = _virtual(kg)
    trans = module.model.entity_emb.detach()[ids].clone()
    out = kgemb_update(kg, module, ids, trans, virt, triples, epochs=1, datamodule_kwargs=DM)
    assert out["accepted"] is True and out["valid_after"] > out["valid_before"]
    assert out["split"] == "valid" and out["seconds"] > 0
    assert module.model.entity_emb.shape == snap["model.entity_emb"].shape
    assert not torch.equal(module.model.entity_emb, snap["model.entity_emb"])
    # a second update measured against an unreachable best is rejected and changes nothing
    snap2 = _snapshot(module)
    out2 = kgemb_update(kg, module, ids, trans, virt, triples, epochs=1, datamodule_kwargs=DM,
                        valid_before=2.0, backtrack_on="test")
    assert out2["accepted"] is False and out2["split"] == "test"
    _assert_state_equal(module, snap2)


# ------------------------------------------------------------------ (4) augmented KG


def test_virtual_triples_in_augmented_train_only(kg):
    module = _module(kg)
    train_before = kg.triples("train").clone()
    ids, trans, virt, triples = _virtual(kg)
    aug, _ = add_virtual_rows(kg, module, ids, trans, virt, triples)
    assert aug.num_entities == kg.num_entities + 3 and aug.num_relations == kg.num_relations
    assert torch.equal(aug.triples("train")[-3:], triples)
    assert torch.equal(aug.triples("train")[:-3], train_before)
    for s in ("valid", "test"):
        assert torch.equal(aug.triples(s), kg.triples(s))
    # the input KG is untouched
    assert kg.num_entities == 135 and torch.equal(kg.triples("train"), train_before)
    assert int(kg.triples("train")[:, [0, 2]].max()) < kg.num_entities
    assert len(aug.entity_names) == aug.num_entities and len(kg.entity_names) == kg.num_entities


# ------------------------------------------------------------------ (5) TransD


def test_transd_two_entity_tables(kg):
    module = _module(kg, "transd")
    m = module.model
    snap = _snapshot(module)
    ids, trans, virt, triples = _virtual(kg)
    n = kg.num_entities
    _, info = add_virtual_rows(kg, module, ids, trans, virt, triples,
                               generator=torch.Generator().manual_seed(0))
    assert m.entity_emb.shape[0] == n + 3 and m.entity_proj.shape[0] == n + 3
    assert torch.equal(m.entity_emb[n:], virt)
    assert torch.equal(m.entity_proj[:n], snap["model.entity_proj"])  # projections untouched
    assert m.entity_proj[n:].abs().max() <= m.embedding_range  # fresh init rows
    remove_virtual_rows(module, info)
    assert m.entity_emb.shape[0] == n and m.entity_proj.shape[0] == n
    assert torch.equal(m.entity_proj, snap["model.entity_proj"])
    # the full update with training and a forced rejection
    snap = _snapshot(module)
    out = kgemb_update(kg, module, ids, trans, virt, triples, epochs=1, datamodule_kwargs=DM,
                       virtual_relations=1, valid_before=2.0)
    assert out["accepted"] is False
    _assert_state_equal(module, snap)


def test_failed_training_leaves_previous_state(kg):
    module = _module(kg)
    snap = _snapshot(module)

    def boom():
        raise RuntimeError("boom")

    module.regularizers.append(boom)
    ids, trans, virt, triples = _virtual(kg)
    with pytest.raises(RuntimeError, match="boom"):
        kgemb_update(kg, module, ids, trans, virt, triples, epochs=1, datamodule_kwargs=DM,
                     valid_before=-1.0)
    assert module.model.num_entities == kg.num_entities
    _assert_state_equal(module, snap)
