"""Query encoders for complex query answering: structures to embeddings, embeddings to scores.

A query with unions is answered in disjunctive normal form (Ren & Leskovec, NeurIPS 2020;
KGReasoning's models.py): :func:`dnf` rewrites a structure into union-free alternatives, each
encoded on its own, and an entity's score is its best score over the alternatives.

:class:`GQE` (Hamilton et al., "Embedding Logical Queries on Knowledge Graphs", NeurIPS
2018, in KGReasoning's form, its models.py): an anchor is its entity row, a projection
adds the relation row, an intersection is an attention-weighted sum of the branch
embeddings (weights per dimension from a two-layer network, softmax over the branches),
and ``s(e, q) = γ − ‖e − q‖₁``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_fedkg.methods.fedcqa.structures import STRUCTURES, is_branch, is_union
from lightning_fedkg.models.kge import families
from lightning_fedkg.models.shareable import InitSpec

__all__ = ["dnf", "tree_plan", "run_plan", "DNFEncoder", "GQE", "Q2P", "TreeLSTM", "DeepSetsGQE"]

E = "e"


def dnf(structure) -> list[tuple[object, list[int]]]:
    """Union-free alternatives of ``structure``: ``[(schema, slots)]``, where ``slots`` are
    the positions in an instance of ``structure`` that fill ``schema`` in its own order.
    2u gives two 1p alternatives, up two 2p ones (the shared last relation in both)."""

    def walk(node, pos: int) -> tuple[list[tuple[object, list[int]]], int]:
        if node == E:
            return [(E, [pos])], pos + 1
        if is_branch(node):
            inner, pos = walk(node[0], pos)
            rels = list(range(pos, pos + len(node[1])))
            return [((schema, node[1]), slots + rels) for schema, slots in inner], pos + len(node[1])
        union = is_union(node)
        parts = node[:-1] if union else node
        per_part = []
        for part in parts:
            alts, pos = walk(part, pos)
            per_part.append(alts)
        if union:
            return [alt for alts in per_part for alt in alts], pos + 1
        combos: list[tuple[tuple, list[int]]] = [((), [])]
        for alts in per_part:
            combos = [(schemas + (schema,), slots + more) for schemas, slots in combos for schema, more in alts]
        return [(schemas, slots) for schemas, slots in combos], pos

    alternatives, _ = walk(structure, 0)
    return alternatives


def tree_plan(node, pos: int = 0) -> tuple[tuple, int]:
    """The computation of ``node`` as an expression over slot positions, and the next slot:
    ``("a", slot)`` an anchor, ``("p", input, slot)`` a projection, ``("i", [inputs])`` an
    intersection, ``("u", [inputs])`` a union."""
    if node == E:
        return ("a", pos), pos + 1
    if is_branch(node):
        expr, pos = tree_plan(node[0], pos)
        for _ in node[1]:
            expr, pos = ("p", expr, pos), pos + 1
        return expr, pos
    union = is_union(node)
    children = []
    for part in (node[:-1] if union else node):
        child, pos = tree_plan(part, pos)
        children.append(child)
    return ("u" if union else "i", children), pos + (1 if union else 0)


def _remap(expr, slots: list[int]):
    """``expr`` with every slot position ``i`` replaced by ``slots[i]``."""
    kind = expr[0]
    if kind == "a":
        return ("a", slots[expr[1]])
    if kind == "p":
        return ("p", _remap(expr[1], slots), slots[expr[2]])
    return (kind, [_remap(c, slots) for c in expr[1]])


def run_plan(encoder, expr, rows: Tensor | None, states: dict | None = None) -> Tensor:
    """The state of ``expr`` (:meth:`plan`'s form) under ``encoder``'s operators, with slot
    ids from ``rows [B, slots]`` and ``("s", key)`` leaves taken from ``states[key]`` (the
    states other parties computed, in distributed retrieval)."""
    kind = expr[0]
    if kind == "s":
        return states[str(expr[1])]
    if kind == "a":
        return encoder.anchor_state(rows[:, expr[1]])
    if kind == "p":
        return encoder.project_state(run_plan(encoder, expr[1], rows, states), rows[:, expr[2]])
    return encoder.combine_state([run_plan(encoder, c, rows, states) for c in expr[1]], kind)


def _normal_as_uniform(dim: int) -> InitSpec:
    """The uniform init with the variance of N(0, 1/dim), the tables' own init (a server
    draws uniform rows)."""
    half = (3.0 / dim) ** 0.5
    return InitSpec("uniform", (-half, half))


class DNFEncoder(nn.Module):
    """An encoder whose query embedding is a set of vectors ``[B, P, d]`` per union-free
    alternative (:func:`dnf`), built from three operators a subclass defines: ``anchor``
    (entity ids -> ``[B, P, d]``), ``project`` and ``intersect`` (a list of branch
    embeddings -> one); :meth:`embed` joins the alternatives along the second axis."""

    def anchor(self, entities: Tensor) -> Tensor:
        raise NotImplementedError

    def project(self, q: Tensor, relations: Tensor) -> Tensor:
        raise NotImplementedError

    def intersect(self, branches: list[Tensor]) -> Tensor:
        raise NotImplementedError

    def _encode(self, schema, rows: Tensor, pos: int) -> tuple[Tensor, int]:
        if schema == E:
            return self.anchor(rows[:, pos]), pos + 1
        if is_branch(schema):
            q, pos = self._encode(schema[0], rows, pos)
            for _ in schema[1]:
                q, pos = self.project(q, rows[:, pos]), pos + 1
            return q, pos
        branches = []
        for part in schema:
            q, pos = self._encode(part, rows, pos)
            branches.append(q)
        return self.intersect(branches), pos

    def embed(self, structure: str, queries: Tensor) -> Tensor:
        """``[B, A·P, d]``: the embeddings of every DNF alternative of each query."""
        return torch.cat([self._encode(schema, queries[:, slots], 0)[0]
                          for schema, slots in dnf(STRUCTURES[structure])], 1)

    # The same computation one operator at a time, for distributed retrieval: a plan is
    # the DNF alternatives joined by one root union (the concatenation :meth:`embed` does).
    @classmethod
    def plan(cls, structure: str) -> tuple:
        """The query's computation (:func:`tree_plan`'s form) over its slot positions."""
        alternatives = [_remap(tree_plan(schema)[0], slots) for schema, slots in dnf(STRUCTURES[structure])]
        return alternatives[0] if len(alternatives) == 1 else ("u", alternatives)

    def anchor_state(self, entities: Tensor) -> Tensor:
        return self.anchor(entities)

    def project_state(self, state: Tensor, relations: Tensor) -> Tensor:
        return self.project(state, relations)

    def combine_state(self, states: list[Tensor], kind: str) -> Tensor:
        return self.intersect(states) if kind == "i" else torch.cat(states, 1)

    def output(self, state: Tensor) -> Tensor:
        """The query embedding ``[B, P, d]`` :meth:`score` takes, from a plan's root state."""
        return state


class GQE(DNFEncoder):
    """GQE's operators over an entity table ``[N, d]`` and a relation table ``[R, d]``
    (``R`` counting inverses); ``gamma`` is the score margin, the init range
    ``(gamma + 2) / d`` as KGReasoning's."""

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 24.0) -> None:
        super().__init__()
        self.gamma = float(gamma)
        bound = (self.gamma + 2.0) / dim
        self.entity_emb = nn.Parameter(torch.empty(num_entities, dim).uniform_(-bound, bound))
        self.relation_emb = nn.Parameter(torch.empty(num_relations, dim).uniform_(-bound, bound))
        #: how a fresh row of each table is drawn (a server's initial shared rows)
        self.table_inits = {n: InitSpec("uniform", (-bound, bound)) for n in ("entity_emb", "relation_emb")}
        self.attention = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))

    def anchor(self, entities: Tensor) -> Tensor:
        return self.entity_emb[entities][:, None, :]

    def project(self, q: Tensor, relations: Tensor) -> Tensor:
        return q + self.relation_emb[relations][:, None, :]

    def intersect(self, branches: list[Tensor]) -> Tensor:
        """Branch embeddings ``[B, 1, d]`` each -> ``[B, 1, d]``."""
        stacked = torch.stack(branches, 1)
        weights = torch.softmax(self.attention(stacked), dim=1)
        return (weights * stacked).sum(1)

    #: ``trainer.compile`` (set by the query-answering task): None compiles the training
    #: step's L1 distances to the entity table where that pays
    #: (:func:`~lightning_fedkg.models.kge.families.compiling_pays`: on CUDA, and on a CPU
    #: with ``trainer.compile_cpu``), False never (cdist everywhere).
    compile_distances: bool | None = None
    #: ``trainer.compile_cpu``: also compile them on a CPU.
    compile_on_cpu: bool = False

    def score(self, embeddings: Tensor, entities: Tensor | None = None) -> Tensor:
        """``[B, n]``: ``γ − ‖e − q‖₁`` maximised over the alternatives, for every entity
        (or the ``entities`` given)."""
        table = self.entity_emb if entities is None else self.entity_emb[entities]
        b, k, d = embeddings.shape
        flat = embeddings.reshape(b * k, d)
        distance = None
        # cdist's backward writes a [B, n, d] buffer once per input; the compiled distances
        # reduce the signs in registers (the softmax scores every entity, so this is most of
        # a training step). Evaluation has no backward: cdist stays there.
        if self.compile_distances is not False and torch.is_grad_enabled() and \
                families.compiling_pays(flat, table, cpu=self.compile_on_cpu):
            distance = families.fused_l1_distances(flat, table)
        if distance is None:
            distance = torch.cdist(flat, table, p=1)
        if k == 1:  # no union: a max over one alternative would cost a pass over [B, n] and its backward
            return self.gamma - distance
        return (self.gamma - distance.view(b, k, -1)).max(1).values

    def score_candidates(self, embeddings: Tensor, candidates: Tensor) -> Tensor:
        """``[B, m]`` scores of each row's own candidates ``[B, m]``."""
        rows = self.entity_emb[candidates]  # [B, m, d]
        distance = (rows[:, None, :, :] - embeddings[:, :, None, :]).abs().sum(-1)  # [B, K, m]
        return (self.gamma - distance).max(1).values


class Q2P(DNFEncoder):
    """Query2Particles (Bai, Wang, Zhang, Song, "Query2Particles: Knowledge Graph Reasoning
    with Particle Embeddings", Findings of NAACL 2022; HKUST-KnowComp/query2particles): a
    query is ``K``
    particles. An anchor's particles are its entity row plus one learned offset each; a
    projection updates every particle with a gated (GRU-like) cell driven by the relation,
    then lets the particles attend to each other (residual, LayerNorm); an intersection
    runs two self-attention + feed-forward blocks over all branches' particles and keeps
    ``K`` (each particle the mean of its counterparts across branches); a union is the
    union of the alternatives' particles (:func:`dnf`). An entity scores its best dot
    product with a particle, plus a bias of its own (the decoder is the entity table)."""

    def __init__(self, num_entities: int, num_relations: int, dim: int, particles: int = 2, heads: int = 1,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.k = int(particles)
        self.entity_emb = nn.Parameter(torch.empty(num_entities, dim).normal_(0, dim ** -0.5))
        self.relation_emb = nn.Parameter(torch.empty(num_relations, dim).normal_(0, dim ** -0.5))
        self.offsets = nn.Parameter(torch.empty(self.k, dim).normal_(0, dim ** -0.5))
        self.entity_bias = nn.Parameter(torch.zeros(num_entities))
        self.table_inits = {"entity_emb": _normal_as_uniform(dim), "relation_emb": _normal_as_uniform(dim),
                            "entity_bias": InitSpec("uniform", (0.0, 0.0))}
        self.gate = nn.Linear(2 * dim, 2 * dim)
        self.candidate = nn.Linear(2 * dim, dim)
        self.project_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.project_norm = nn.LayerNorm(dim)
        self.intersect_blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=dropout, batch_first=True)
            for _ in range(2))

    def project(self, particles: Tensor, relations: Tensor) -> Tensor:
        """``[B, K, d]`` particles moved along each row's relation."""
        r = self.relation_emb[relations][:, None, :].expand_as(particles)
        update, reset = torch.sigmoid(self.gate(torch.cat([particles, r], -1))).chunk(2, -1)
        proposal = torch.tanh(self.candidate(torch.cat([reset * particles, r], -1)))
        moved = (1 - update) * particles + update * proposal
        attended, _ = self.project_attention(moved, moved, moved, need_weights=False)
        return self.project_norm(moved + attended)

    def intersect(self, branches: list[Tensor]) -> Tensor:
        """Branch particles ``[B, K, d]`` each -> ``[B, K, d]``."""
        x = torch.cat(branches, 1)
        for block in self.intersect_blocks:
            x = block(x)
        return x.view(x.shape[0], len(branches), self.k, -1).mean(1)

    def anchor(self, entities: Tensor) -> Tensor:
        return self.entity_emb[entities][:, None, :] + self.offsets[None]

    def score(self, embeddings: Tensor, entities: Tensor | None = None) -> Tensor:
        """``[B, n]``: each entity's best particle dot product, plus its bias."""
        table = self.entity_emb if entities is None else self.entity_emb[entities]
        bias = self.entity_bias if entities is None else self.entity_bias[entities]
        return (embeddings @ table.T).max(1).values + bias

    def score_candidates(self, embeddings: Tensor, candidates: Tensor) -> Tensor:
        """``[B, m]`` scores of each row's own candidates ``[B, m]``."""
        rows = self.entity_emb[candidates]  # [B, m, d]
        return torch.einsum("bkd,bmd->bkm", embeddings, rows).max(1).values + self.entity_bias[candidates]


def fold_tree(node, rows: Tensor, pos: int, leaf, project, combine):
    """Evaluate a query tree whose unions are nodes (the tree-LSTM's and ``gqe_fedngdb``'s
    walk), its anchors and relations read from ``rows`` in slot order from ``pos``:
    ``leaf(entities)``, ``project(state, relations)``, ``combine(children, union)``.
    Returns ``(state, next position)``."""
    if node == E:
        return leaf(rows[:, pos]), pos + 1
    if is_branch(node):
        state, pos = fold_tree(node[0], rows, pos, leaf, project, combine)
        for _ in node[1]:
            state, pos = project(state, rows[:, pos]), pos + 1
        return state, pos
    union = is_union(node)
    children = []
    for part in (node[:-1] if union else node):
        state, pos = fold_tree(part, rows, pos, leaf, project, combine)
        children.append(state)
    return combine(children, union), pos + (1 if union else 0)


class TreeLSTM(nn.Module):
    """The tree-LSTM query encoder of SQE (Bai, Zheng, Song, "Sequential Query Encoding for
    Complex Query Answering on Knowledge Graphs", TMLR 2023; HKUST-KnowComp/SQE,
    model/tree_lstm.py): every node
    of the query's computation tree has an LSTM state ``(h, c)``. An anchor starts at
    ``(E[e], 0)``; a projection is an LSTM cell whose input is the relation row; an
    intersection or a union is a child-sum Tree-LSTM node (Tai et al., ACL 2015) whose
    input is an operator row (0 = ∩, 1 = ∪), with one forget gate per child. Unions are
    nodes of the tree here, not DNF alternatives. An entity scores ``h · e``."""

    def __init__(self, num_entities: int, num_relations: int, dim: int) -> None:
        super().__init__()
        self.entity_emb = nn.Parameter(torch.empty(num_entities, dim).normal_(0, dim ** -0.5))
        self.relation_emb = nn.Parameter(torch.empty(num_relations, dim).normal_(0, dim ** -0.5))
        self.operator_emb = nn.Parameter(torch.empty(2, dim).normal_(0, dim ** -0.5))
        self.table_inits = {"entity_emb": _normal_as_uniform(dim), "relation_emb": _normal_as_uniform(dim)}
        self.cell = nn.LSTMCell(dim, dim)
        self.w_iou = nn.Linear(dim, 3 * dim)
        self.u_iou = nn.Linear(dim, 3 * dim, bias=False)
        self.w_f = nn.Linear(dim, dim)
        self.u_f = nn.Linear(dim, dim, bias=False)

    def combine(self, children: list[tuple[Tensor, Tensor]], operator: int) -> tuple[Tensor, Tensor]:
        """A child-sum node over ``[(h, c)]`` children (each ``[B, d]``) for ``operator``."""
        x = self.operator_emb[operator]
        h = torch.stack([ch for ch, _ in children], 1)  # [B, k, d]
        c = torch.stack([cc for _, cc in children], 1)
        i, o, u = (self.w_iou(x) + self.u_iou(h.sum(1))).chunk(3, -1)
        f = torch.sigmoid(self.w_f(x) + self.u_f(h))  # one gate per child
        cell = torch.sigmoid(i) * torch.tanh(u) + (f * c).sum(1)
        return torch.sigmoid(o) * torch.tanh(cell), cell

    def _encode(self, node, rows: Tensor, pos: int) -> tuple[tuple[Tensor, Tensor], int]:
        def leaf(entities: Tensor) -> tuple[Tensor, Tensor]:
            h = self.entity_emb[entities]
            return h, torch.zeros_like(h)

        return fold_tree(node, rows, pos, leaf, lambda state, r: self.cell(self.relation_emb[r], state),
                         lambda children, union: self.combine(children, 1 if union else 0))

    def embed(self, structure: str, queries: Tensor) -> Tensor:
        """``[B, 1, d]``: the root's hidden state."""
        (h, _), _ = self._encode(STRUCTURES[structure], queries, 0)
        return h[:, None, :]

    # One operator at a time (distributed retrieval); a state is ``(h, c)`` stacked, [B, 2, d].
    @classmethod
    def plan(cls, structure: str) -> tuple:
        """The query's tree (:func:`tree_plan`): unions are nodes, not DNF alternatives."""
        return tree_plan(STRUCTURES[structure])[0]

    def anchor_state(self, entities: Tensor) -> Tensor:
        h = self.entity_emb[entities]
        return torch.stack([h, torch.zeros_like(h)], 1)

    def project_state(self, state: Tensor, relations: Tensor) -> Tensor:
        return torch.stack(self.cell(self.relation_emb[relations], (state[:, 0], state[:, 1])), 1)

    def combine_state(self, states: list[Tensor], kind: str) -> Tensor:
        return torch.stack(self.combine([(s[:, 0], s[:, 1]) for s in states], 1 if kind == "u" else 0), 1)

    def output(self, state: Tensor) -> Tensor:
        return state[:, :1]

    def score(self, embeddings: Tensor, entities: Tensor | None = None) -> Tensor:
        table = self.entity_emb if entities is None else self.entity_emb[entities]
        return (embeddings @ table.T).max(1).values

    def score_candidates(self, embeddings: Tensor, candidates: Tensor) -> Tensor:
        return torch.einsum("bkd,bmd->bkm", embeddings, self.entity_emb[candidates]).max(1).values


class DeepSetsGQE(nn.Module):
    """The "GQE" of the FedCQA authors' code (HKUST-KnowComp/FedNGDB, model/gqe.py), for a
    like-with-like comparison with it: an anchor is its entity row, a projection adds the
    relation row, and an intersection or a union is a DeepSets operator: a two-layer MLP
    (``d → d/2 → d``, ReLU) on every branch, their mean, then a linear map without bias
    (one set of weights for ∩, another for ∪); unions are nodes of the tree, not DNF
    alternatives. An entity scores ``q·e`` (the decoder is the entity table). Tables start
    at N(0, 1), as that code's embeddings do. A state is ``[B, 1, d]``."""

    def __init__(self, num_entities: int, num_relations: int, dim: int) -> None:
        super().__init__()
        self.entity_emb = nn.Parameter(torch.empty(num_entities, dim).normal_(0, 1))
        self.relation_emb = nn.Parameter(torch.empty(num_relations, dim).normal_(0, 1))
        # the uniform with N(0, 1)'s variance (a server draws uniform rows)
        self.table_inits = {n: InitSpec("uniform", (-3.0 ** 0.5, 3.0 ** 0.5)) for n in ("entity_emb", "relation_emb")}
        self.intersect_mlp = nn.Sequential(nn.Linear(dim, dim // 2), nn.ReLU(), nn.Linear(dim // 2, dim))
        self.intersect_out = nn.Linear(dim, dim, bias=False)
        self.union_mlp = nn.Sequential(nn.Linear(dim, dim // 2), nn.ReLU(), nn.Linear(dim // 2, dim))
        self.union_out = nn.Linear(dim, dim, bias=False)

    def combine(self, branches: list[Tensor], kind: str) -> Tensor:
        """Branch states ``[B, 1, d]`` each -> ``[B, 1, d]`` (``kind`` ``"i"`` or ``"u"``)."""
        mlp, out = (self.union_mlp, self.union_out) if kind == "u" else (self.intersect_mlp, self.intersect_out)
        return out(mlp(torch.cat(branches, 1)).mean(1, keepdim=True))

    def _encode(self, node, rows: Tensor, pos: int) -> tuple[Tensor, int]:
        return fold_tree(node, rows, pos, self.anchor_state, self.project_state,
                         lambda children, union: self.combine(children, "u" if union else "i"))

    def embed(self, structure: str, queries: Tensor) -> Tensor:
        """``[B, 1, d]``: the root's state."""
        return self._encode(STRUCTURES[structure], queries, 0)[0]

    @classmethod
    def plan(cls, structure: str) -> tuple:
        """The query's tree (:func:`tree_plan`): unions are nodes, not DNF alternatives."""
        return tree_plan(STRUCTURES[structure])[0]

    def anchor_state(self, entities: Tensor) -> Tensor:
        return self.entity_emb[entities][:, None, :]

    def project_state(self, state: Tensor, relations: Tensor) -> Tensor:
        return state + self.relation_emb[relations][:, None, :]

    def combine_state(self, states: list[Tensor], kind: str) -> Tensor:
        return self.combine(states, kind)

    def output(self, state: Tensor) -> Tensor:
        return state

    def score(self, embeddings: Tensor, entities: Tensor | None = None) -> Tensor:
        """``[B, n]``: ``q·e`` for every entity (or the ``entities`` given)."""
        table = self.entity_emb if entities is None else self.entity_emb[entities]
        return (embeddings @ table.T).max(1).values

    def score_candidates(self, embeddings: Tensor, candidates: Tensor) -> Tensor:
        return torch.einsum("bkd,bmd->bkm", embeddings, self.entity_emb[candidates]).max(1).values
