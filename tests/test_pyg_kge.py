"""Our KGE models as PyG ``KGEModel`` subclasses: PyG's own API (``forward``, ``loss``,
``loader``, ``random_sample``, ``test``) against hand-computed values, against our fast
1-vs-many scoring, and in a PyG-style training loop on bundled UMLS."""

import math

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn.kge as pyg_kge

from lightning_fedkg.data import load_kg
from lightning_fedkg.models.kge import MODELS, TransH, build_model

N, R, D = 12, 4, 6


def _transh_by_hand() -> TransH:
    """TransH with dim 2, gamma 3 and tables set by hand (see the test for the arithmetic)."""
    m = TransH(num_entities=3, num_relations=1, dim=2, gamma=3.0)
    with torch.no_grad():
        m.entity_emb.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]))
        m.relation_emb.copy_(torch.tensor([[0.5, 0.5]]))
        m.relation_normal.copy_(torch.tensor([[0.0, 4.0]]))  # unit normal (0, 1) after normalising
    return m


def test_forward_and_loss_by_hand():
    # w = (0, 1); e_perp = e - (w.e) w keeps the first coordinate: h_perp = (1, 0),
    # e1_perp = (0, 0), e2_perp = (2, 0); d_r = (0.5, 0.5); p = 1.
    # s(0, 0, 0) = 3 - |1.5 - 1| - |.5| = 2;  s(0, 0, 1) = 3 - |1.5 - 0| - |.5| = 1;
    # s(0, 0, 2) = 3 - |1.5 - 2| - |.5| = 2.
    m = _transh_by_hand()
    h, r, t = torch.tensor([0]), torch.tensor([0]), torch.tensor([1])
    assert m(h, r, t).tolist() == [1.0]
    assert m(head_index=h, rel_type=r, tail_index=t).tolist() == [1.0]  # PyG's keyword names
    assert m.score_tails(h, r).tolist() == [[2.0, 1.0, 2.0]]
    # PyG's loss: BCE with logits, positive target 1, its random_sample corruption target 0.
    m.random_sample = lambda h_, r_, t_: (h_, r_, torch.tensor([2]))
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(2.0))) / 2
    assert m.loss(h, r, t).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_pyg_loss_is_bce_over_our_scores_of_pyg_corruptions(name):
    torch.manual_seed(0)
    m = build_model(name, N, R, D)
    h, r, t = torch.randint(N, (9,)), torch.randint(R, (9,)), torch.randint(N, (9,))
    torch.manual_seed(1)
    loss = m.loss(h, r, t)
    # PyG's random_sample: one randint draw; the first B // 2 rows get a new head, the rest a new tail.
    torch.manual_seed(1)
    rnd = torch.randint(N, (9,))
    rows, half = torch.arange(9), 9 // 2
    with torch.no_grad():
        pos = m.score_tails(h, r)[rows, t]
        neg = torch.cat([m.score_heads(r, t)[rows, rnd][:half], m.score_tails(h, r)[rows, rnd][half:]])
    expected = torch.cat([F.softplus(-pos), F.softplus(neg)]).mean()
    torch.testing.assert_close(loss.detach(), expected)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_pyg_base_without_its_tables(name):
    """PyG's __init__ is skipped: no node_emb/rel_emb, no extra RNG draws, our state-dict keys."""
    torch.manual_seed(3)
    m = build_model(name, N, R, D, gamma=4.0, epsilon=2.0)
    assert isinstance(m, pyg_kge.KGEModel)
    assert (m.num_nodes, m.num_relations, m.hidden_channels) == (N, R, D)
    assert all(k.startswith(("entity_", "relation_")) for k in m.state_dict())
    # The first table is the first thing drawn after the seed: U(-rho, rho), rho = 6 / D.
    torch.manual_seed(3)
    first = torch.empty_like(m.entity_emb).uniform_(-6.0 / D, 6.0 / D)
    assert torch.equal(m.entity_emb, first)
    m.resize_rows("entity", N + 2)
    assert m.num_nodes == N + 2


@pytest.mark.parametrize("name", ["transe", "transh", "rotate"])
def test_pyg_test_ranks_as_our_scoring(name):
    """PyG's one-triple-at-a-time ``test`` agrees with ranks from ``score_tails``."""
    torch.manual_seed(0)
    m = build_model(name, N, R, D)
    h, r, t = torch.randint(N, (20,)), torch.randint(R, (20,)), torch.randint(N, (20,))
    mean_rank, mrr, hits = m.test(h, r, t, batch_size=5, k=3, log=False)
    with torch.no_grad():
        scores = m.score_tails(h, r)
    # PyG's rank is 0-based: the number of candidates scored above the true tail.
    rank = (scores > scores[torch.arange(20), t].unsqueeze(1)).sum(1).float()
    assert mean_rank == pytest.approx(rank.mean().item(), abs=1e-6)
    assert mrr == pytest.approx((1 / (rank + 1)).mean().item(), rel=1e-6)
    assert hits == int((rank < 3).sum()) / 20


def test_transh_learns_through_pyg_loader_and_test(one_thread):
    """A PyG-style loop (PyG's loader, loss and test; no Lightning) learns UMLS."""
    torch.manual_seed(0)
    kg = load_kg("umls")
    train, test = kg.data("train"), kg.data("test")
    model = TransH(kg.num_entities, kg.num_relations, 32, gamma=8.0)
    test_triples = (test.edge_index[0], test.edge_type, test.edge_index[1])
    untrained_mr, _, untrained_hits = model.test(*test_triples, batch_size=1000, log=False)
    # Random scores rank the true tail near the middle of the 135 entities.
    assert 45 < untrained_mr < 90 and untrained_hits < 0.15
    loader = model.loader(train.edge_index[0], train.edge_type, train.edge_index[1], batch_size=256, shuffle=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(5):
        for batch in loader:
            optimizer.zero_grad()
            model.loss(*batch).backward()
            optimizer.step()
    mean_rank, mrr, hits = model.test(*test_triples, batch_size=1000, log=False)
    # Measured with seed 0: mean rank 67.6 -> 11.2, hits@10 0.067 -> 0.56.
    assert mean_rank < untrained_mr / 3
    assert hits > 0.4
    assert mrr > 0.1
