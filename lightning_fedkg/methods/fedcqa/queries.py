"""Complex logical queries on a KG: sampling and enumerating instances of a structure, and
the query sets of a split with their hard and easy answers (FedCQA's data).

The structures, :class:`QueryGraph` and batched answering are :mod:`.structures` (their
names are importable from here too). See docs/methods/fedcqa.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from .structures import E, STRUCTURES, QueryGraph, anchors_and_relations, answer, is_branch, is_union, num_slots

__all__ = ["STRUCTURES", "QueryGraph", "QuerySet", "num_slots", "anchors_and_relations", "answer", "sample_queries",
           "enumerate_queries",
           "build_query_set", "SPLITS", "is_branch", "is_union", "split_graphs", "union_split_graphs",
           "relation_owners", "spans_owners"]

log = logging.getLogger("lightning_fedkg")


def _walk_back(nodes: Tensor, previous: Tensor | None, index, generator: torch.Generator,
               tries: int = 40) -> tuple[Tensor, Tensor, Tensor]:
    """One step back from each node: a random incoming relation (avoiding the inverse of
    ``previous``, the relation chosen just before, within ``tries`` draws), then a random
    predecessor through it. Returns ``(relations, predecessors, ok)``."""
    pair_rel, pair_start, pair_count, node_start, node_count, heads = index
    count = node_count[nodes]
    ok = count > 0
    safe = count.clamp(min=1)
    pick = node_start[nodes] + (torch.rand(nodes.shape[0], generator=generator) * safe).long().clamp(max=safe - 1)
    if previous is not None:
        for _ in range(tries):
            bad = ok & (pair_rel[pick] == (previous ^ 1))
            if not bool(bad.any()):
                break
            redraw = node_start[nodes] + (torch.rand(nodes.shape[0], generator=generator) * safe).long() \
                .clamp(max=safe - 1)
            pick = torch.where(bad, redraw, pick)
    pick = torch.where(ok, pick, torch.zeros_like(pick))
    rels = pair_rel[pick]
    within = (torch.rand(nodes.shape[0], generator=generator) * pair_count[pick]).long().clamp(max=pair_count[pick] - 1)
    preds = heads[pair_start[pick] + within]
    return rels, preds, ok


def _fill(structure, targets: Tensor, index, generator: torch.Generator) -> tuple[list[Tensor], Tensor]:
    """Instances of ``structure`` whose answers include ``targets`` (one per target), as a
    list of slot columns in depth-first order, and which rows succeeded."""
    if is_branch(structure):
        rels, node, ok, previous = [], targets, torch.ones_like(targets, dtype=torch.bool), None
        for _ in structure[1]:
            r, node, step_ok = _walk_back(node, previous, index, generator)
            rels.append(r)
            ok &= step_ok
            previous = r
        rels.reverse()  # chosen from the answer backwards
        if structure[0] == E:
            return [node, *rels], ok
        cols, sub_ok = _fill(structure[0], node, index, generator)
        return [*cols, *rels], ok & sub_ok
    union = is_union(structure)
    parts = structure[:-1] if union else structure
    cols, ok, branches = [], torch.ones_like(targets, dtype=torch.bool), []
    for part in parts:
        part_cols, part_ok = _fill(part, targets, index, generator)
        branches.append((part, torch.stack(part_cols, 1)))
        cols += part_cols
        ok &= part_ok
    for i in range(len(branches)):  # two branches of one shape must differ
        for j in range(i + 1, len(branches)):
            if branches[i][0] == branches[j][0]:
                ok &= (branches[i][1] != branches[j][1]).any(1)
    if union:
        cols.append(torch.full_like(targets, -1))
    return cols, ok


def sample_queries(structure, graph: QueryGraph, count: int, generator: torch.Generator,
                   batch: int = 4096, max_batches: int = 1000) -> Tensor:
    """``[≤ count, slots]`` distinct instances of ``structure`` sampled on ``graph`` by
    walking back from answers drawn uniformly among the entities with an incoming edge
    (KGReasoning's procedure, create_queries.py), a batch of walks at a time. Stops at
    ``count``, or when three batches in a row bring fewer than 1% new instances (the walks
    stall long before a small graph is exhausted: :func:`build_query_set` completes a
    short set with :func:`enumerate_queries`), or after ``max_batches``."""
    index = graph.incoming()
    has_incoming = (index[4] > 0).nonzero().squeeze(1)
    found = torch.zeros(0, num_slots(structure), dtype=torch.long)
    stale = 0
    for _ in range(max_batches):
        if found.shape[0] >= count or has_incoming.numel() == 0 or stale >= 3:
            break
        targets = has_incoming[torch.randint(has_incoming.numel(), (batch,), generator=generator)]
        cols, ok = _fill(structure, targets, index, generator)
        fresh = torch.stack(cols, 1)[ok]
        before = found.shape[0]
        found = torch.unique(torch.cat([found, fresh]), dim=0)
        # a graph with fewer distinct queries than asked: stop once batches bring almost nothing
        stale = stale + 1 if found.shape[0] - before < max(1, batch // 100) else 0
    # unique() sorts rows; a seeded permutation keeps the sample unbiased when it is cut
    keep = torch.randperm(found.shape[0], generator=generator)[:count]
    return found[keep]


class _TooMany(Exception):
    """An enumeration would exceed its row budget."""


def _edges_into(nodes: Tensor, back: tuple[Tensor, Tensor, Tensor, Tensor],
                max_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """Every edge into each of ``nodes``: ``(row of nodes, relation, head)``; counted before
    anything is built, so a step past ``max_rows`` costs no memory."""
    rels, heads, start, counts = back
    owner, offset = _expand(counts[nodes], max_rows)
    edge = start[nodes][owner] + offset
    return owner, rels[edge], heads[edge]


def _expand(counts: Tensor, max_rows: int) -> tuple[Tensor, Tensor]:
    """``(row, offset)``: row ``i`` repeated ``counts[i]`` times, with ``0 .. counts[i] - 1``
    beside it; :class:`_TooMany` before anything is built if the total passes ``max_rows``."""
    total = int(counts.sum())
    if total > max_rows:
        raise _TooMany
    row = torch.repeat_interleave(torch.arange(counts.shape[0]), counts)
    return row, torch.arange(total) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)


def _pair_up(a: tuple[list[Tensor], Tensor], b: tuple[list[Tensor], Tensor], targets: int,
             max_rows: int) -> tuple[list[Tensor], Tensor]:
    """Every row of ``a`` with every row of ``b`` that has the same target (a join on owner)."""
    (a_cols, a_owner), (b_cols, b_owner) = a, b
    order = torch.argsort(b_owner, stable=True)
    b_cols, b_owner = [c[order] for c in b_cols], b_owner[order]
    counts = torch.bincount(b_owner, minlength=targets)
    start = torch.cumsum(counts, 0) - counts
    row, offset = _expand(counts[a_owner], max_rows)
    other = start[a_owner][row] + offset
    return [x[row] for x in a_cols] + [x[other] for x in b_cols], a_owner[row]


def _walk_all(node, targets: Tensor, back, single: Tensor, max_rows: int) -> tuple[list[Tensor], Tensor]:
    """:func:`_fill` with every choice taken instead of a random one: all instances of
    ``node`` a walk back from ``targets`` can draw, as slot columns, and the index of the
    target each row came from. ``single[v]``: ``v`` has one incoming relation, so a walk
    there may take the inverse of the relation it just took (it has no other way back)."""
    if is_branch(node):
        owner, nodes, rels = torch.arange(targets.shape[0]), targets, []
        for _ in node[1]:
            row, rel, nodes_next = _edges_into(nodes, back, max_rows)
            if rels:  # never straight back along the relation just taken, unless forced
                fine = (rel != (rels[-1][row] ^ 1)) | single[nodes[row]]
                row, rel, nodes_next = row[fine], rel[fine], nodes_next[fine]
            owner, rels, nodes = owner[row], [r[row] for r in rels] + [rel], nodes_next
        rels.reverse()  # chosen from the answer backwards
        if node[0] == E:
            return [nodes, *rels], owner
        cols, sub = _walk_all(node[0], nodes, back, single, max_rows)
        return [*cols, *(r[sub] for r in rels)], owner[sub]
    union = is_union(node)
    parts = node[:-1] if union else node
    joined, widths = None, []
    for part in parts:  # a union's branches, like an intersection's, walk back from one target
        found = _walk_all(part, targets, back, single, max_rows)
        joined = found if joined is None else _pair_up(joined, found, targets.shape[0], max_rows)
        widths.append(len(found[0]))
    cols, owner = joined
    ok = torch.ones_like(owner, dtype=torch.bool)
    bounds = torch.cumsum(torch.tensor([0, *widths]), 0).tolist()
    for i in range(len(parts)):  # two branches of one shape must differ, as _fill requires
        for j in range(i + 1, len(parts)):
            if parts[i] == parts[j]:
                a = torch.stack(cols[bounds[i]:bounds[i + 1]], 1)
                ok &= (a != torch.stack(cols[bounds[j]:bounds[j + 1]], 1)).any(1)
    cols, owner = [c[ok] for c in cols], owner[ok]
    if union:
        cols.append(torch.full_like(owner, -1))
    return cols, owner


def enumerate_queries(structure, graph: QueryGraph, max_rows: int = 1 << 22, chunk: int = 64) -> Tensor | None:
    """``[M, slots]``: every distinct instance of ``structure`` that :func:`sample_queries`
    can draw on ``graph`` (sorted rows), or None if there are more than ``max_rows`` (or an
    intermediate step would hold more). The walks' rules, taken exhaustively: from any
    entity with an incoming edge, back along every edge, never straight back along the
    inverse of the relation just taken unless it is the node's only incoming relation; the
    branches of an intersection or a union all walk back from one entity (KGReasoning
    samples unions so); two branches of one shape differ."""
    order = torch.argsort(graph.tails, stable=True)
    counts = torch.bincount(graph.tails, minlength=graph.num_entities)
    back = (graph.rels[order], graph.heads[order], torch.cumsum(counts, 0) - counts, counts)
    single = graph.incoming()[4] == 1
    targets = (counts > 0).nonzero().squeeze(1)
    found, pending, held = torch.zeros(0, num_slots(structure), dtype=torch.long), [], 0
    try:
        for start in range(0, targets.shape[0], chunk):
            cols, _ = _walk_all(structure, targets[start:start + chunk], back, single, max_rows)
            pending.append(torch.stack(cols, 1))
            held += pending[-1].shape[0]
            last = start + chunk >= targets.shape[0]
            if held > max_rows or last:  # a query answered by several targets is found once per target
                found = torch.unique(torch.cat([found, *pending]), dim=0)
                pending, held = [], found.shape[0]
                if found.shape[0] > max_rows:
                    return None
    except _TooMany:
        return None
    return found


#: Which graph a split's queries are sampled on, and which earlier graph's answers are easy:
#: ``split -> (graph index, easy graph index or None)`` over ``(G_train, G_valid, G_test)``.
SPLITS = {"train": (0, None), "valid": (1, 0), "test": (2, 1)}


@dataclass
class QuerySet:
    """Instances of one structure and their answers, as CSR lists (``offsets [B + 1]``,
    ``ids``): ``hard`` are ranked, ``easy`` are filtered out of the ranking (empty for
    training queries, whose answers are all ``hard``)."""

    structure: str
    queries: Tensor
    hard_offsets: Tensor
    hard_ids: Tensor
    easy_offsets: Tensor
    easy_ids: Tensor

    def __len__(self) -> int:
        return int(self.queries.shape[0])

    def hard(self, i: int) -> Tensor:
        return self.hard_ids[self.hard_offsets[i]:self.hard_offsets[i + 1]]

    def easy(self, i: int) -> Tensor:
        return self.easy_ids[self.easy_offsets[i]:self.easy_offsets[i + 1]]


def _csr(sets: Tensor) -> tuple[Tensor, Tensor]:
    offsets = torch.zeros(sets.shape[0] + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(sets.sum(1), 0)
    return offsets, sets.nonzero()[:, 1]


def _cat_csr(parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    offsets, ids, total = [torch.zeros(1, dtype=torch.long)], [], 0
    for off, idx in parts:
        offsets.append(off[1:] + total)
        ids.append(idx)
        total += int(off[-1])
    return torch.cat(offsets), torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long)


def build_query_set(name: str, graphs: tuple[QueryGraph, QueryGraph, QueryGraph], split: str, count: int,
                    generator: torch.Generator, chunk: int = 1024, keep=None,
                    require_train_answer: bool = False) -> QuerySet:
    """``count`` queries of structure ``name`` for ``split``, or all there are, with
    KGReasoning's answer sets (create_queries.py): sampled on the split's graph; for valid
    and test, ``easy`` = the answers on the previous graph, ``hard`` = the rest, and only
    queries with a hard answer are kept. ``keep(queries) -> bool [B]`` filters further
    (cross-graph queries: relations of two owners at least). ``require_train_answer``: a
    valid or test query must also have an answer on the training graph (the FedCQA authors'
    sampler rejects the others; for a valid query that is an easy answer).

    Sampling runs until ``count`` or exhaustion: random walks first (:func:`sample_queries`,
    never the same query twice); if they stall short of ``count``, every instance they could
    still draw (:func:`enumerate_queries`) is taken in a seeded random order until ``count``.
    A graph with too many instances to enumerate keeps what the walks found (logged)."""
    structure = STRUCTURES[name]
    on, easy_on = SPLITS[split]
    if name == "1p" and keep is None:  # few enough to enumerate: every (anchor, relation) of the graph
        g = graphs[on]
        pairs = torch.unique(torch.stack([g.heads, g.rels], 1), dim=0)
        return _answered(name, pairs[torch.randperm(pairs.shape[0], generator=generator)], graphs, split, count,
                         chunk, require_train_answer)
    parts: list[QuerySet] = []
    have = 0
    seen = torch.zeros(0, num_slots(structure), dtype=torch.long)
    for _ in range(20):
        want = max(2 * (count - have), 64)
        fresh = sample_queries(structure, graphs[on], want, generator)
        exhausted = fresh.shape[0] < want  # the walks stalled: few or no distinct queries left to draw
        if seen.numel():  # never the same query twice (exact: rows compared whole)
            fresh = fresh[~_rows_in(fresh, seen)]
        if keep is not None and fresh.numel():
            fresh = fresh[keep(fresh)]
        seen = torch.cat([seen, fresh])
        part = _answered(name, fresh, graphs, split, count - have, chunk, require_train_answer)
        if len(part):
            parts.append(part)
            have += len(part)
        if have >= count or exhausted:
            break
    if have < count:  # the walks gave up: the rest of what they could draw, exhaustively
        rest = enumerate_queries(structure, graphs[on])
        if rest is None:
            log.warning("queries: %s %s: %d of %d after the walks stalled; too many instances to enumerate "
                        "the rest", split, name, have, count)
        else:
            rest = rest[~_rows_in(rest, seen)] if seen.numel() else rest
            if keep is not None and rest.numel():
                rest = rest[keep(rest)]
            rest = rest[torch.randperm(rest.shape[0], generator=generator)]
            part = _answered(name, rest, graphs, split, count - have, chunk, require_train_answer)
            if len(part):
                parts.append(part)
    return _concat(name, parts, num_slots(structure))


def _rows_in(rows: Tensor, among: Tensor) -> Tensor:
    """``bool [len(rows)]``: whether each row of ``rows`` is also a row of ``among``."""
    _, inverse = torch.unique(torch.cat([among, rows]), dim=0, return_inverse=True)
    return torch.isin(inverse[among.shape[0]:], inverse[: among.shape[0]])


def _answered(name: str, candidates: Tensor, graphs, split: str, count: int, chunk: int,
              require_train_answer: bool = False) -> QuerySet:
    """The first ``count`` of ``candidates`` (in order) that have a hard answer (and, with
    ``require_train_answer`` outside training, an answer on the training graph), answered."""
    structure = STRUCTURES[name]
    on, easy_on = SPLITS[split]
    chosen, hard_parts, easy_parts, have = [], [], [], 0
    for start in range(0, candidates.shape[0], chunk):
        if have >= count:
            break
        batch = candidates[start:start + chunk]
        full = answer(structure, batch, graphs[on])
        easy = answer(structure, batch, graphs[easy_on]) if easy_on is not None else torch.zeros_like(full)
        hard = full & ~easy
        wanted = hard.any(1)
        if require_train_answer and easy_on is not None:
            wanted &= (easy if easy_on == 0 else answer(structure, batch, graphs[0])).any(1)
        take = wanted.nonzero().squeeze(1)[: count - have]
        if take.numel():
            chosen.append(batch[take])
            hard_parts.append(_csr(hard[take]))
            easy_parts.append(_csr(easy[take]))
            have += take.numel()
    queries = torch.cat(chosen) if chosen else torch.zeros(0, num_slots(structure), dtype=torch.long)
    return QuerySet(name, queries, *_cat_csr(hard_parts), *_cat_csr(easy_parts))


def _concat(name: str, parts: list[QuerySet], slots: int) -> QuerySet:
    if not parts:
        empty = torch.zeros(0, dtype=torch.long)
        return QuerySet(name, torch.zeros(0, slots, dtype=torch.long), torch.zeros(1, dtype=torch.long), empty,
                        torch.zeros(1, dtype=torch.long), empty)
    hard = _cat_csr([(p.hard_offsets, p.hard_ids) for p in parts])
    easy = _cat_csr([(p.easy_offsets, p.easy_ids) for p in parts])
    return QuerySet(name, torch.cat([p.queries for p in parts]), *hard, *easy)


def split_graphs(triples: dict[str, Tensor], num_entities: int, num_relations: int) \
        -> tuple[QueryGraph, QueryGraph, QueryGraph]:
    """``(G_train, G_valid, G_test)``: train, train ∪ valid, train ∪ valid ∪ test."""
    train = triples["train"]
    valid = torch.cat([train, triples["valid"]])
    test = torch.cat([valid, triples["test"]])
    return tuple(QueryGraph.from_triples(t, num_entities, num_relations) for t in (train, valid, test))


def union_split_graphs(fkg) -> tuple[QueryGraph, QueryGraph, QueryGraph]:
    """The three graphs of the union of a federation's clients, in global ids (the graphs
    cross-graph queries are sampled and answered on, FedCQA §5.1.2)."""
    parts = {split: [] for split in ("train", "valid", "test")}
    for kg, ent, rel in zip(fkg.clients, fkg.entity_index, fkg.relation_index):
        for split in parts:
            t = kg.triples(split)
            parts[split].append(torch.stack([ent[t[:, 0]], rel[t[:, 1]], ent[t[:, 2]]], 1))
    return split_graphs({k: torch.cat(v) for k, v in parts.items()}, fkg.num_entities, fkg.num_relations)


def relation_owners(fkg) -> Tensor:
    """``LongTensor [R]``: the client that holds each global relation (-1: none). FedCQA's
    clients hold disjoint relation sets; a relation two clients hold is an error here."""
    owners = torch.full((fkg.num_relations,), -1, dtype=torch.long)
    for k, rel in enumerate(fkg.relation_index):
        if bool((owners[rel] >= 0).any()):
            raise ValueError("cross-graph queries need disjoint relation sets, but two clients share a relation")
        owners[rel] = k
    return owners


def spans_owners(structure, owners: Tensor, at_least: int = 2):
    """``keep(queries) -> bool [B]``: whether a query's relations (forward or inverse ids)
    belong to at least ``at_least`` distinct clients. Checked on the query itself, not on a
    variable of the sampler (the official sampler's cross-graph check is on a stale one)."""
    _, slots = anchors_and_relations(structure)

    def keep(queries: Tensor) -> Tensor:
        who = owners[queries[:, slots] // 2].sort(1).values  # [B, relations]
        distinct = 1 + (who[:, 1:] != who[:, :-1]).sum(1)
        return distinct >= at_least

    return keep
