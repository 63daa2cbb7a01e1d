"""DNF rewriting, GQE's operators by hand, and filtered query ranks against a brute force."""

from __future__ import annotations

import copy
import pytest
import torch

from lightning_fedkg.methods.fedcqa.queries import STRUCTURES, num_slots
from lightning_fedkg.methods.fedcqa.ranking import filtered_ranks, per_query_metrics
from lightning_fedkg.methods.fedcqa.encoders import GQE, Q2P, DeepSetsGQE, TreeLSTM, dnf

pytestmark = pytest.mark.usefixtures("one_thread")


def test_dnf_by_hand():
    assert dnf(STRUCTURES["2p"]) == [(STRUCTURES["2p"], [0, 1, 2])]
    assert dnf(STRUCTURES["2u"]) == [(("e", ("r",)), [0, 1]), (("e", ("r",)), [2, 3])]
    assert dnf(STRUCTURES["up"]) == [((("e", ("r",)), ("r",)), [0, 1, 5]), ((("e", ("r",)), ("r",)), [2, 3, 5])]
    assert dnf(STRUCTURES["pi"]) == [(STRUCTURES["pi"], [0, 1, 2, 3, 4])]
    for name, structure in STRUCTURES.items():  # every slot but the union marker is used
        used = sorted({s for _, slots in dnf(structure) for s in slots})
        assert used == [i for i in range(num_slots(structure)) if not (name in ("2u", "up") and i == 4)]


def test_gqe_operators_by_hand():
    torch.manual_seed(0)
    model = GQE(5, 4, 3, gamma=2.0)
    e, r = model.entity_emb.detach(), model.relation_emb.detach()
    q = model.embed("2p", torch.tensor([[1, 2, 3]]))
    assert torch.allclose(q[0, 0], e[1] + r[2] + r[3])
    both = model.embed("2i", torch.tensor([[1, 2, 4, 0]]))[0, 0]
    branches = torch.stack([e[1] + r[2], e[4] + r[0]])
    weights = torch.softmax(model.attention(branches), dim=0)
    assert torch.allclose(both, (weights * branches).sum(0), atol=1e-6)
    union = model.embed("2u", torch.tensor([[1, 2, 4, 0, -1]]))
    scores = model.score(union)
    expected = torch.maximum(2.0 - (e - (e[1] + r[2])).abs().sum(1), 2.0 - (e - (e[4] + r[0])).abs().sum(1))
    assert torch.allclose(scores[0], expected, atol=1e-5)


def brute_force_rank(row: list[float], answer: int, answers: set) -> float:
    s = row[answer]
    greater = sum(1 for e, v in enumerate(row) if e not in answers and v > s)
    equal = sum(1 for e, v in enumerate(row) if e not in answers and v == s)
    return 1 + greater + equal / 2


def test_filtered_ranks_match_a_brute_force():
    g = torch.Generator().manual_seed(0)
    b, n = 6, 40
    scores = torch.randint(0, 8, (b, n), generator=g).float()  # many ties
    hard = [torch.randperm(n, generator=g)[: int(k)] for k in torch.randint(1, 5, (b,), generator=g)]
    easy = [torch.tensor([int(x) for x in torch.randperm(n, generator=g)[:3] if int(x) not in h.tolist()])
            for h in hard]
    hard_rows = torch.cat([torch.full((len(h),), i) for i, h in enumerate(hard)])
    easy_rows = torch.cat([torch.full((len(e),), i) for i, e in enumerate(easy)])
    ranks = filtered_ranks(scores, hard_rows, torch.cat(hard), easy_rows, torch.cat(easy))
    expected = []
    for i, h in enumerate(hard):
        answers = set(h.tolist()) | set(easy[i].tolist())
        expected += [brute_force_rank(scores[i].tolist(), int(v), answers) for v in h]
    assert ranks.tolist() == pytest.approx(expected)
    metrics = per_query_metrics(ranks, hard_rows, b)
    for i, h in enumerate(hard):
        mine = torch.tensor(expected)[hard_rows == i]
        assert float(metrics["mrr"][i]) == pytest.approx(float((1 / mine).mean()))
        assert float(metrics["hits@3"][i]) == pytest.approx(float((mine <= 3).float().mean()))


@pytest.mark.parametrize("encoder,loss,options", [
    ("gqe", "negative_sampling", {"gamma": 12.0}),
    ("gqe", "softmax", {"gamma": 12.0}),
    ("q2p", "softmax", {"particles": 2}),
    ("tree_lstm", "softmax", {}),
    ("gqe_fedngdb", "softmax", {}),
], ids=["gqe_negative_sampling", "gqe_softmax", "q2p_softmax", "tree_lstm_softmax", "gqe_fedngdb_softmax"])
@pytest.mark.slow
def test_encoders_learn_to_answer_queries_on_umls(encoder, loss, options):
    """End to end with a plain Trainer: an encoder trained on 1p/2p/2i queries of UMLS
    answers held-out test queries far above chance (MRR about .04 before training)."""
    import lightning as L
    from torch.utils.data import DataLoader

    from lightning_fedkg.data import load_kg
    from lightning_fedkg.methods.fedcqa.queries import build_query_set, split_graphs
    from lightning_fedkg.methods.fedcqa.module import QueryAnsweringModule, QueryBatches

    torch.manual_seed(0)
    kg = load_kg("umls")
    graphs = split_graphs({s: kg.triples(s) for s in ("train", "valid", "test")}, kg.num_entities, kg.num_relations)
    g = torch.Generator().manual_seed(0)
    train = {t: build_query_set(t, graphs, "train", 3000, g) for t in ("1p", "2p", "2i")}
    test = {t: build_query_set(t, graphs, "test", 200, g) for t in ("1p", "2i")}
    module = QueryAnsweringModule(kg.num_entities, 2 * kg.num_relations, encoder=encoder, dim=32, lr=0.01,
                                  negatives=32, loss=loss, **options)
    before = module.evaluate(test)["mrr"]
    trainer = L.Trainer(max_steps=300, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(QueryBatches(train, batch_size=128), batch_size=None))
    after = module.evaluate(test)
    # GQE .04 -> .29 (negative sampling), .65 (softmax) when written
    assert before < 0.1 and after["mrr"] > 0.2, (before, after)
    assert set(after["by_type"]) == {"1p", "2i"} and after["by_type"]["1p"]["queries"] == 200


def test_q2p_particles_and_scores_by_hand():
    torch.manual_seed(0)
    model = Q2P(6, 4, 8, particles=3, dropout=0.0).eval()
    anchor = model.embed("1p", torch.tensor([[2, 1]]))
    assert anchor.shape == (1, 3, 8)
    union = model.embed("2u", torch.tensor([[2, 1, 5, 3, -1]]))
    assert union.shape == (1, 6, 8)  # two alternatives' particles
    first = model.embed("1p", torch.tensor([[2, 1]]))
    assert torch.allclose(union[:, :3], first)
    scores = model.score(union)
    expected = (union[0] @ model.entity_emb.T).max(0).values + model.entity_bias
    assert torch.allclose(scores[0], expected)
    picked = model.score_candidates(union, torch.tensor([[4, 0]]))
    assert torch.allclose(picked[0], expected[[4, 0]])


def test_tree_lstm_nodes_by_hand():
    torch.manual_seed(0)
    model = TreeLSTM(6, 4, 5)
    e, r = model.entity_emb.detach(), model.relation_emb.detach()
    h, c = model.cell(r[[1]], (e[[2]], torch.zeros(1, 5)))  # (2, r1): one LSTM step from the anchor
    assert torch.allclose(model.embed("1p", torch.tensor([[2, 1]]))[:, 0], h)
    h2, c2 = model.cell(r[[3]], (e[[5]], torch.zeros(1, 5)))
    both = model.combine([(h, c), (h2, c2)], 0)[0]
    assert torch.allclose(model.embed("2i", torch.tensor([[2, 1, 5, 3]]))[:, 0], both)
    either = model.combine([(h, c), (h2, c2)], 1)[0]  # a union is a node, not DNF
    assert torch.allclose(model.embed("2u", torch.tensor([[2, 1, 5, 3, -1]]))[:, 0], either)
    assert not torch.allclose(both, either)
    # the forget gates are per child: swapping the children changes nothing (a sum)
    assert torch.allclose(model.combine([(h2, c2), (h, c)], 0)[0], both, atol=1e-6)


def test_fedngdb_gqe_by_hand():
    """The FedCQA authors' GQE: projections add, ∩ and ∪ are DeepSets operators with weights
    of their own (a union is a node, not DNF), an entity scores the dot product."""
    torch.manual_seed(0)
    model = DeepSetsGQE(6, 4, 8)
    e, r = model.entity_emb.detach(), model.relation_emb.detach()
    one = model.embed("1p", torch.tensor([[2, 1]]))
    assert one.shape == (1, 1, 8) and torch.allclose(one[0, 0], e[2] + r[1])
    a, b = e[2] + r[1], e[5] + r[3]

    def deep_sets(mlp, out):
        return out((mlp(a) + mlp(b)) / 2)

    both = deep_sets(model.intersect_mlp, model.intersect_out)
    either = deep_sets(model.union_mlp, model.union_out)
    assert torch.allclose(model.embed("2i", torch.tensor([[2, 1, 5, 3]]))[0, 0], both, atol=1e-6)
    assert torch.allclose(model.embed("2u", torch.tensor([[2, 1, 5, 3, -1]]))[0, 0], either, atol=1e-6)
    assert not torch.allclose(both, either)
    # up: the union of two branches, then the shared last relation added
    up = model.embed("up", torch.tensor([[2, 1, 5, 3, -1, 0]]))
    assert torch.allclose(up[0, 0], either + r[0], atol=1e-6)
    assert torch.allclose(model.score(up)[0], e @ (either + r[0]), atol=1e-5)
    assert torch.allclose(model.score_candidates(up, torch.tensor([[4, 0]]))[0], model.score(up)[0, [4, 0]])
    # the operators' first layer halves the width, as the authors' code has it
    assert model.intersect_mlp[0].out_features == 4 and model.union_out.bias is None


def test_a_persistent_optimizer_outlives_fits_and_resumes_exactly():
    """``reset_optimizer=False``: AdamW's moments carry over ``fit()`` calls (a client's
    rounds), and a module restored from the weights and :meth:`optimizer_state_dict` trains on
    exactly as the original; with the default every fit starts a fresh AdamW."""
    import lightning as L
    from torch.utils.data import DataLoader

    from lightning_fedkg.data import load_kg
    from lightning_fedkg.methods.fedcqa.queries import build_query_set, split_graphs
    from lightning_fedkg.methods.fedcqa.module import QueryAnsweringModule, QueryBatches

    kg = load_kg("umls")
    graphs = split_graphs({s: kg.triples(s) for s in ("train", "valid", "test")}, kg.num_entities, kg.num_relations)
    train = {t: build_query_set(t, graphs, "train", 200, torch.Generator().manual_seed(0)) for t in ("1p", "2p")}

    def fit(module, seed):
        L.Trainer(max_steps=5, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False).fit(module, DataLoader(QueryBatches(train, 32, seed), batch_size=None))

    def build(reset):
        torch.manual_seed(0)
        return QueryAnsweringModule(kg.num_entities, 2 * kg.num_relations, dim=16, lr=0.01, loss="softmax",
                                    reset_optimizer=reset)

    fresh, kept = build(True), build(False)
    fit(fresh, 1), fit(kept, 1)
    first = kept._optimizer
    # the optimizer's state dict holds its live tensors, as a checkpoint writes them at once
    saved = {"module": {k: v.clone() for k, v in kept.state_dict().items()},
             "optimizer": copy.deepcopy(kept.optimizer_state_dict())}
    assert fresh.optimizer_state_dict() is None and saved["optimizer"]["state"]
    fit(fresh, 2), fit(kept, 2)
    assert kept._optimizer is first and int(first.state_dict()["state"][0]["step"]) == 10
    assert int(fresh._optimizer.state_dict()["state"][0]["step"]) == 5
    # a round trip through the saved state continues as if nothing happened
    restored = build(False)
    restored.load_state_dict(saved["module"])
    restored.load_optimizer_state_dict(saved["optimizer"])
    fit(restored, 2)
    for (name, a), b in zip(kept.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(fresh.state_dict()["encoder.entity_emb"], kept.state_dict()["encoder.entity_emb"])
