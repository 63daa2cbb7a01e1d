"""Tests for the lightning_fedkg.models.kge package: hand-computed scores, brute-force oracles
for the 1-vs-many paths, PyG parity, init ranges, chunking and bf16 autocast."""

import math

import pytest
import torch
from torch_geometric.nn.kge import ComplEx as PygComplEx
from torch_geometric.nn.kge import DistMult as PygDistMult

from lightning_fedkg.models import MODELS, KGEModel, RotatE, TransE, TransR, build_model

# Hand-checkable entities (d = 2): e0 = [1, 0], e1 = [0, 1], e2 = [1, 1].
E2 = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]


def _set(model: KGEModel, **tables) -> KGEModel:
    with torch.no_grad():
        for name, value in tables.items():
            getattr(model, name).copy_(torch.tensor(value, dtype=torch.float32))
    return model


def _score(model, triples):
    t = torch.tensor(triples)
    with torch.no_grad():
        return model(t[:, 0], t[:, 1], t[:, 2])


def _assert_scores(model, triples, expected):
    torch.testing.assert_close(_score(model, triples), torch.tensor(expected), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- hand-computed scores
def test_transe_hand_values():
    m = _set(TransE(3, 1, 2, gamma=10.0), entity_emb=E2, relation_emb=[[0.0, 1.0]])
    # (0,0,2): [1,0]+[0,1]-[1,1] = [0,0]   -> 10 - 0
    # (1,0,0): [0,1]+[0,1]-[1,0] = [-1,2]  -> 10 - 3
    # (2,0,1): [1,1]+[0,1]-[0,1] = [1,1]   -> 10 - 2
    _assert_scores(m, [[0, 0, 2], [1, 0, 0], [2, 0, 1]], [10.0, 7.0, 8.0])
    m2 = _set(TransE(3, 1, 2, gamma=10.0, p_norm=2), entity_emb=E2, relation_emb=[[0.0, 1.0]])
    # (1,0,0) with L2: 10 - sqrt(1 + 4)
    _assert_scores(m2, [[1, 0, 0]], [10.0 - math.sqrt(5.0)])


def test_transh_hand_values():
    # w_r = [3,4] is normalised to [0.6, 0.8]; e_perp = e - (w.e) w:
    # e0 -> [1,0] - 0.6*[0.6,0.8] = [0.64,-0.48]; e1 -> [-0.48,0.36]; e2 -> [0.16,-0.12]
    m = _set(MODELS["transh"](3, 1, 2, gamma=10.0), entity_emb=E2,
             relation_emb=[[0.0, 1.0]], relation_normal=[[3.0, 4.0]])
    # (0,0,2): [0.64,-0.48]+[0,1]-[0.16,-0.12] = [0.48, 0.64]   -> 10 - 1.12
    # (1,0,0): [-0.48,0.36]+[0,1]-[0.64,-0.48] = [-1.12, 1.84] -> 10 - 2.96
    _assert_scores(m, [[0, 0, 2], [1, 0, 0]], [8.88, 7.04])


def test_transr_hand_values_rectangular():
    # d = 2, d_r = 1, M_r = [[1, 2]]: M e0 = 1, M e1 = 2, M e2 = 3; r = [-1]
    m = _set(TransR(3, 1, 2, gamma=10.0, relation_dim=1), entity_emb=E2,
             relation_emb=[[-1.0]], relation_matrix=[[1.0, 2.0]])
    # (0,0,2): 1-1-3 = -3 -> 7 ; (1,0,0): 2-1-1 = 0 -> 10 ; (0,0,1): 1-1-2 = -2 -> 8
    _assert_scores(m, [[0, 0, 2], [1, 0, 0], [0, 0, 1]], [7.0, 10.0, 8.0])


def test_transr_matrix_is_row_major_dr_by_d():
    # relation_matrix row [0, 1, 0, 0] is M_r = [[0, 1], [0, 0]]: M e0 = [0, 0], M e2 = [1, 0]
    # (0,0,2) with r = 0: ||[0,0] - [1,0]|| = 1 -> 9 (column-major would give M^T e0 = M^T e2 -> 10)
    m = _set(TransR(3, 1, 2, gamma=10.0), entity_emb=E2,
             relation_emb=[[0.0, 0.0]], relation_matrix=[[0.0, 1.0, 0.0, 0.0]])
    _assert_scores(m, [[0, 0, 2]], [9.0])


def test_transr_identity_init_equals_transe():
    torch.manual_seed(0)
    tr = TransR(6, 2, 4)
    assert torch.equal(tr.relation_matrix, torch.eye(4).reshape(1, 16).repeat(2, 1))
    te = _set(TransE(6, 2, 4), entity_emb=tr.entity_emb.tolist(), relation_emb=tr.relation_emb.tolist())
    h, r, t = torch.tensor([0, 1, 5]), torch.tensor([0, 1, 1]), torch.tensor([2, 3, 4])
    torch.testing.assert_close(tr(h, r, t), te(h, r, t))


def test_transd_hand_values():
    # e_perp = e + (e_p . e) r_p with r_p = [1,0]; e_p: [1,1],[0,0],[0,1]
    # e0 -> [1,0]+1*[1,0] = [2,0]; e1 -> [0,1]; e2 -> [1,1]+1*[1,0] = [2,1]; r = [0,1]
    m = _set(MODELS["transd"](3, 1, 2, gamma=10.0), entity_emb=E2,
             entity_proj=[[1.0, 1.0], [0.0, 0.0], [0.0, 1.0]],
             relation_emb=[[0.0, 1.0]], relation_proj=[[1.0, 0.0]])
    # (0,0,2): [2,0]+[0,1]-[2,1] = 0 -> 10 ; (1,0,0): [-2,2] -> 6 ; (2,0,1): [2,1] -> 7
    _assert_scores(m, [[0, 0, 2], [1, 0, 0], [2, 0, 1]], [10.0, 6.0, 7.0])


def test_transd_hand_values_resize():
    e_p = [[1.0, 1.0], [0.0, 0.0], [0.0, 1.0]]  # e_p . e = 1, 0, 1
    # d_r = 3 (zero-pad): r_p = [0,0,1] -> e0 [1,0,1], e1 [0,1,0], e2 [1,1,1]; r = [0,1,0]
    m = _set(MODELS["transd"](3, 1, 2, gamma=10.0, relation_dim=3), entity_emb=E2,
             entity_proj=e_p, relation_emb=[[0.0, 1.0, 0.0]], relation_proj=[[0.0, 0.0, 1.0]])
    # (0,0,2): 0 -> 10 ; (1,0,0): [0,1,0]+[0,1,0]-[1,0,1] = [-1,2,-1] -> 6
    _assert_scores(m, [[0, 0, 2], [1, 0, 0]], [10.0, 6.0])
    # d_r = 1 (truncate): r_p = [2] -> e0 1+2 = 3, e1 0, e2 1+2 = 3; r = [0.5]
    m1 = _set(MODELS["transd"](3, 1, 2, gamma=10.0, relation_dim=1), entity_emb=E2,
              entity_proj=e_p, relation_emb=[[0.5]], relation_proj=[[2.0]])
    # (1,0,0): 0+0.5-3 -> 7.5 ; (0,0,1): 3+0.5-0 -> 6.5
    _assert_scores(m1, [[1, 0, 0], [0, 0, 1]], [7.5, 6.5])


def test_distmult_hand_values():
    m = _set(MODELS["distmult"](3, 1, 2), entity_emb=E2, relation_emb=[[2.0, 3.0]])
    # (0,0,2): 1*2*1 = 2 ; (1,0,2): 1*3*1 = 3 ; (2,0,2): 2+3 = 5 ; (0,0,1): 0
    _assert_scores(m, [[0, 0, 2], [1, 0, 2], [2, 0, 2], [0, 0, 1]], [2.0, 3.0, 5.0, 0.0])


# Complex vectors with d = 2 stored [re1, re2, im1, im2]:
# e0 = (1, 2), e1 = (i, 0), e2 = (1+i, i); relation (i, 1) for ComplEx, phases (pi/2, 0) for RotatE.
C_ENT = [[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0]]


def test_complex_hand_values():
    m = _set(MODELS["complex"](3, 1, 2), entity_emb=C_ENT, relation_emb=[[0.0, 1.0, 1.0, 0.0]])
    # s = Re(sum_k h_k r_k conj(t_k))
    # (0,0,1): k1 1*i*(-i) = 1 ; k2 2*1*0 = 0             -> 1
    # (1,0,0): k1 i*i*1 = -1 ; k2 0                       -> -1
    # (2,0,2): k1 (1+i)i(1-i) = 2i -> 0 ; k2 i*1*(-i) = 1 -> 1
    # (2,0,0): k1 (-1+i)*1 -> -1 ; k2 i*2 -> 0             -> -1
    # (0,0,2): k1 i(1-i) = 1+i -> 1 ; k2 2*(-i) -> 0       -> 1
    _assert_scores(m, [[0, 0, 1], [1, 0, 0], [2, 0, 2], [2, 0, 0], [0, 0, 2]],
                   [1.0, -1.0, 1.0, -1.0, 1.0])


def test_rotate_hand_values():
    # gamma 10, eps 2, d 2 -> rho = 6; theta = r * pi / 6, so r = (3, 0) -> (pi/2, 0)
    m = _set(RotatE(3, 1, 2, gamma=10.0, epsilon=2.0), entity_emb=C_ENT, relation_emb=[[3.0, 0.0]])
    # rotation multiplies k1 by i, leaves k2
    # (0,0,1): (i, 2) - (i, 0) = (0, 2)           -> 10 - 2
    # (1,0,0): (-1, 0) - (1, 2) = (-2, -2)        -> 10 - 4
    # (2,0,2): (-1+i, i) - (1+i, i) = (-2, 0)     -> 10 - 2
    # (0,0,2): (i, 2) - (1+i, i) = (-1, 2-i)      -> 10 - (1 + sqrt 5)
    _assert_scores(m, [[0, 0, 1], [1, 0, 0], [2, 0, 2], [0, 0, 2]],
                   [8.0, 6.0, 8.0, 9.0 - math.sqrt(5.0)])


def test_rotate_zero_phase_is_sum_of_complex_moduli():
    torch.manual_seed(1)
    m = RotatE(7, 2, 5)
    with torch.no_grad():
        m.relation_emb.zero_()
    h, r, t = torch.tensor([0, 3, 6, 2]), torch.tensor([0, 1, 1, 0]), torch.tensor([1, 3, 4, 5])
    hc = torch.complex(*m.entity_emb[h].detach().chunk(2, dim=-1))
    tc = torch.complex(*m.entity_emb[t].detach().chunk(2, dim=-1))
    torch.testing.assert_close(m(h, r, t).detach(), m.gamma - (hc - tc).abs().sum(-1))
    # zero distance (t == h) must not give NaN gradients
    m(h, r, h).sum().backward()
    assert torch.isfinite(m.entity_emb.grad).all()


def test_rotate_modulus_gradient_matches_autograd_oracle():
    from lightning_fedkg.models.kge.rotate import _ComplexModulus

    torch.manual_seed(2)
    re, im = torch.randn(5, 3, dtype=torch.double), torch.randn(5, 3, dtype=torch.double)
    assert torch.autograd.gradcheck(_ComplexModulus.apply, (re.requires_grad_(), im.requires_grad_()))
    # at the origin the subgradient 0 is used: d|z|/dre = re/|z| elsewhere, here 0 and 0.6
    z_re = torch.tensor([0.0, 3.0], requires_grad=True)
    z_im = torch.tensor([0.0, 4.0], requires_grad=True)
    _ComplexModulus.apply(z_re, z_im).sum().backward()
    assert z_re.grad.tolist() == pytest.approx([0.0, 0.6])
    assert z_im.grad.tolist() == pytest.approx([0.0, 0.8])


# ---------------------------------------------------------------- regularisation hooks
def test_regularization_hand_values():
    dm = _set(MODELS["distmult"](3, 1, 2), entity_emb=E2, relation_emb=[[2.0, 3.0]])
    # N3: entities 1+1+1+1 = 4, relation 8+27 = 35; batch (0,0,2): rows e0,e2 -> 1+2 = 3
    assert dm.regularization_loss().item() == pytest.approx(39.0)
    assert dm.regularization_loss(torch.tensor([[0, 0, 2]])).item() == pytest.approx(38.0)

    th = _set(MODELS["transh"](3, 1, 2, orthogonality_margin=0.1), entity_emb=E2,
              relation_emb=[[0.0, 1.0]], relation_normal=[[3.0, 4.0]])
    # scale: ||e2||^2 - 1 = 1 ; orthogonality: (w.d)^2/||d||^2 - 0.1^2 = 0.64 - 0.01
    assert th.regularization_loss().item() == pytest.approx(1.63)

    tr = _set(TransR(3, 1, 2, relation_dim=1), entity_emb=E2,
              relation_emb=[[-1.0]], relation_matrix=[[1.0, 2.0]])
    # batch (2,0,1): ||e2||^2-1 = 1, ||e1|| ok, ||r|| ok, (M e2)^2-1 = 8, (M e1)^2-1 = 3
    assert tr.regularization_loss(torch.tensor([[2, 0, 1]])).item() == pytest.approx(12.0)

    td = _set(MODELS["transd"](3, 1, 2), entity_emb=E2,
              entity_proj=[[1.0, 1.0], [0.0, 0.0], [0.0, 1.0]],
              relation_emb=[[0.0, 1.0]], relation_proj=[[1.0, 0.0]])
    # batch (1,0,0): e1,e0,r unit -> 0; h_perp [0,1] -> 0; t_perp [2,0] -> 3
    assert td.regularization_loss(torch.tensor([[1, 0, 0]])).item() == pytest.approx(3.0)
    # whole tables: only ||e2||^2 - 1 = 1
    assert td.regularization_loss().item() == pytest.approx(1.0)


# ---------------------------------------------------------------- brute-force oracles
N, R, D = 40, 3, 6
VARIANTS = [
    ("transe", {}), ("transe", {"p_norm": 2}), ("transh", {}), ("transr", {}),
    ("transr", {"relation_dim": 4}), ("transd", {}), ("transd", {"relation_dim": 8}),
    ("distmult", {}), ("complex", {}), ("rotate", {}),
]
IDS = [f"{n}-{'-'.join(f'{k}{v}' for k, v in kw.items())}" if kw else n for n, kw in VARIANTS]


def _random_model(name, kw, seed=0):
    torch.manual_seed(seed)
    m = build_model(name, N, R, D, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    return m


def _oracle_tails(m, h, r, cand):
    """cand [B, n]: stack forward(h_i, r_i, cand_ij)."""
    B, n = cand.shape
    return m(h.repeat_interleave(n), r.repeat_interleave(n), cand.reshape(-1)).view(B, n)


def _oracle_heads(m, r, t, cand):
    B, n = cand.shape
    return m(cand.reshape(-1), r.repeat_interleave(n), t.repeat_interleave(n)).view(B, n)


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
@pytest.mark.parametrize("batch", [30, 3])
def test_one_vs_many_matches_forward(name, kw, batch):
    m = _random_model(name, kw)
    g = torch.Generator().manual_seed(3)
    B = batch
    h, t = torch.randint(N, (B,), generator=g), torch.randint(N, (B,), generator=g)
    # 30 rows share 3 relations (grouped path of TransH/R/D); 3 rows have distinct ones
    r = torch.randint(R, (B,), generator=g) if B > R else torch.arange(B) % R
    shared = torch.randint(N, (17,), generator=g)
    per_row = torch.randint(N, (B, 9), generator=g)
    every = torch.arange(N).expand(B, N)
    with torch.no_grad():
        cases = [
            (m.score_tails(h, r), _oracle_tails(m, h, r, every)),
            (m.score_tails(h, r, shared), _oracle_tails(m, h, r, shared.expand(B, -1))),
            (m.score_tails(h, r, per_row), _oracle_tails(m, h, r, per_row)),
            (m.score_heads(r, t), _oracle_heads(m, r, t, every)),
            (m.score_heads(r, t, shared), _oracle_heads(m, r, t, shared.expand(B, -1))),
            (m.score_heads(r, t, per_row), _oracle_heads(m, r, t, per_row)),
        ]
    for got, want in cases:
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_chunked_equals_unchunked(name, kw):
    m = _random_model(name, kw, seed=4)
    h, r = torch.tensor([0, 5, 9, 33]), torch.tensor([0, 2, 1, 1])
    per_row = torch.randint(N, (4, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = [m.score_tails(h, r), m.score_heads(r, h, per_row)]
        calls = []
        original = m._compare
        m._compare = lambda q, c: calls.append(1) or original(q, c)
        m.max_chunk_elements = 1  # one candidate per chunk
        tiny = [m.score_tails(h, r), m.score_heads(r, h, per_row)]
    assert len(calls) >= 11  # the per-row path really ran in chunks
    for a, b in zip(full, tiny):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["transh", "transr", "transd"])
def test_shared_candidates_group_by_relation_only_when_relations_repeat(name):
    m = _random_model(name, {})
    calls = []
    original = m._compare_shared
    m._compare_shared = lambda q, c: calls.append(q.shape[0]) or original(q, c)
    with torch.no_grad():
        m.score_tails(torch.arange(6), torch.tensor([2, 0, 2, 2, 0, 2]))
        assert sorted(calls) == [2, 4]  # one block per distinct relation
        calls.clear()
        m.score_heads(torch.tensor([0, 1, 2]), torch.arange(3))
        assert calls == []  # all relations distinct: chunked broadcast instead


def test_empty_and_invalid_candidates():
    m = _random_model("transh", {})
    h, r = torch.tensor([0, 1]), torch.tensor([0, 1])
    assert m.score_tails(h, r, torch.empty(0, dtype=torch.long)).shape == (2, 0)
    with pytest.raises(ValueError, match="rows"):
        m.score_tails(h, r, torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="LongTensor"):
        m.score_heads(r, h, torch.zeros(4))


# ---------------------------------------------------------------- PyG parity
def test_distmult_matches_pyg():
    m = _random_model("distmult", {})
    pyg = PygDistMult(N, R, D)
    with torch.no_grad():
        pyg.node_emb.weight.copy_(m.entity_emb)
        pyg.rel_emb.weight.copy_(m.relation_emb)
    h, r, t = torch.randint(N, (50,)), torch.randint(R, (50,)), torch.randint(N, (50,))
    torch.testing.assert_close(m(h, r, t), pyg(h, r, t))


def test_complex_matches_pyg():
    m = _random_model("complex", {})
    pyg = PygComplEx(N, R, D)
    with torch.no_grad():
        pyg.node_emb.weight.copy_(m.entity_emb[:, :D])
        pyg.node_emb_im.weight.copy_(m.entity_emb[:, D:])
        pyg.rel_emb.weight.copy_(m.relation_emb[:, :D])
        pyg.rel_emb_im.weight.copy_(m.relation_emb[:, D:])
    h, r, t = torch.randint(N, (50,)), torch.randint(R, (50,)), torch.randint(N, (50,))
    torch.testing.assert_close(m(h, r, t), pyg(h, r, t))


# ---------------------------------------------------------------- parameters and init
EXPECTED_TABLES = {
    # name: ({entity tables: width}, {relation tables: width}) for dim 8, relation_dim default
    "transe": ({"entity_emb": 8}, {"relation_emb": 8}),
    "transh": ({"entity_emb": 8}, {"relation_emb": 8, "relation_normal": 8}),
    "transr": ({"entity_emb": 8}, {"relation_emb": 8, "relation_matrix": 64}),
    "transd": ({"entity_emb": 8, "entity_proj": 8}, {"relation_emb": 8, "relation_proj": 8}),
    "distmult": ({"entity_emb": 8}, {"relation_emb": 8}),
    "complex": ({"entity_emb": 16}, {"relation_emb": 16}),
    "rotate": ({"entity_emb": 16}, {"relation_emb": 8}),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_names_shapes_and_init_range(name):
    torch.manual_seed(0)
    m = build_model(name, 500, 300, 8, gamma=6.0, epsilon=2.0)
    ents, rels = EXPECTED_TABLES[name]
    assert m.entity_parameter_names() == list(ents)
    assert m.relation_parameter_names() == list(rels)
    params = dict(m.named_parameters())
    assert set(params) == set(ents) | set(rels)
    for table, width in ents.items():
        assert params[table].shape == (500, width)
    for table, width in rels.items():
        assert params[table].shape == (300, width)
    rho = (6.0 + 2.0) / 8
    assert m.embedding_range == pytest.approx(rho)
    for table, p in params.items():
        if table == "relation_matrix":  # identity init, checked separately
            continue
        assert p.abs().max().item() <= rho
        assert p.abs().max().item() > 0.95 * rho  # uses the whole range, not a smaller one
        assert abs(p.mean().item()) < 0.05 * rho


def test_build_model_names_and_errors():
    assert set(MODELS) == {"transe", "transh", "transr", "transd", "distmult", "complex", "rotate"}
    m = build_model("TransR", 4, 2, 3, gamma=5.0, relation_dim=2, p_norm=2)
    assert isinstance(m, TransR) and m.gamma == 5.0 and m.relation_dim == 2 and m.p_norm == 2.0
    with pytest.raises(ValueError, match="complex.*transr"):
        build_model("transx", 4, 2, 3)


# ---------------------------------------------------------------- bf16 autocast
@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_bf16_autocast_gradients_flow(name, kw):
    m = build_model(name, N, R, D, **kw)
    # two distinct relations in four rows: TransH/R/D take the grouped path for shared
    # candidates; the first two rows alone (distinct relations) take the broadcast path
    h, r, t = torch.tensor([0, 4, 7, 1]), torch.tensor([2, 0, 2, 2]), torch.tensor([3, 4, 39, 1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pos = m(h, r, t)
        tails = m.score_tails(h, r, torch.tensor([1, 2, 3]))
        heads = m.score_heads(r, t, torch.tensor([[5, 6], [7, 8], [9, 10], [0, 0]]))
        everything = m.score_tails(h, r)
        distinct = m.score_heads(r[:2], t[:2])
        loss = (pos.float().sum() - tails.float().mean() - heads.float().mean()
                + everything.float().mean() - distinct.float().mean()
                + 0.1 * m.regularization_loss(torch.stack([h, r, t], 1)))
    loss.backward()
    assert pos.shape == (4,) and tails.shape == (4, 3) and heads.shape == (4, 2)
    assert everything.shape == (4, N) and distinct.shape == (2, N)
    for pname, p in m.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", ["transe", "transd", "transr", "rotate"])
def test_resize_rows_grows_and_shrinks_in_place_and_restores_exactly(name):
    torch.manual_seed(0)
    model = build_model(name, 5, 3, 4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = {n: id(p) for n, p in model.named_parameters()}
    h, r = torch.tensor([0, 4]), torch.tensor([1, 2])
    scores = model.score_tails(h, r).detach().clone()
    extra = {n: torch.full((2, *p.shape[1:]), 0.5) for n, p in model.named_parameters(recurse=False)
             if n.startswith("entity_")}
    model.resize_rows("entity", 7, values=extra)
    assert model.num_entities == 7 and model.entity_emb.shape[0] == 7
    assert torch.equal(model.entity_emb[5:], extra["entity_emb"])
    assert model.score_tails(h, r).shape == (2, 7)
    assert torch.allclose(model.score_tails(h, r)[:, :5], scores)
    assert model.shareable_groups()["entity"].tensors["entity_emb"].shape[0] == 7
    model.resize_rows("entity", 5)
    model.resize_rows("relation", 4, generator=torch.Generator().manual_seed(1))
    model.resize_rows("relation", 3)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
        assert id(p) == ids[n]  # the same Parameter objects
    assert torch.equal(model.score_tails(h, r), scores)
    with pytest.raises(ValueError):
        model.resize_rows("entity", 6, values={"entity_emb": torch.zeros(2, 4)})
