"""Queries typed by a person, answered by a finished federation (``fedkg query``).

KGReasoning's structures written with names: a chain ``(e:aspirin, (r:treats, r-:causes))``
(2p), ``i`` before the sub-queries of an intersection, ``u`` before those of a union (the
grammar and one example per structure: :func:`parse_query`). The query must have one of the
known structures (:data:`~lightning_fedkg.methods.fedcqa.queries.STRUCTURES`); negation is
not supported. An unknown name is an error listing the closest names; a malformed query says
where it breaks. See docs/methods/fedcqa.md.
"""

from __future__ import annotations

import difflib
import re

import torch

from lightning_fedkg.methods.fedcqa.queries import STRUCTURES

__all__ = ["QuerySyntaxError", "parse_query", "answer_query"]


#: The forms a query takes, as errors name them.
QUERY_FORMS = "'(e:NAME, (r:REL, ...))', 'i(Q, Q, ...)' or 'u(Q, Q, ...)'"


#: What a negation attempt starts with where a query, a chain's start or a relation is expected:
#: BetaE's ``n`` (``(e:a, (r:x, n))``, ``n(Q)``), ``not``/``neg``, or a sign (``-``, ``!``, ``~``, ``¬``).
_NEGATION = re.compile(r"(?:not|neg|n)\b|[-!~\u00ac]", re.IGNORECASE)


class QuerySyntaxError(ValueError):
    """A malformed query or an unknown name; the message points at the place."""


def _fail(text: str, pos: int, what: str) -> QuerySyntaxError:
    return QuerySyntaxError(f"{what} at character {pos + 1}:\n  {text}\n  {' ' * pos}^")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def found(self) -> str:
        """What stands at the current position (for an error), or "the end"."""
        self.skip()
        return self.text[self.pos:self.pos + 8] or "the end"

    def refuse_negation(self) -> None:
        """Raise the negation error if a negation starts here (checked where the parser would
        otherwise give a generic error, so a name like ``notes`` after ``e:`` is never one)."""
        self.skip()
        if _NEGATION.match(self.text, self.pos):
            raise _fail(self.text, self.pos, f"negation is not supported (types: {', '.join(STRUCTURES)})")

    def expect(self, token: str) -> None:
        if not self.peek(token):
            raise _fail(self.text, self.pos, f"expected {token!r}, found {self.found()!r}")
        self.pos += len(token)

    def name(self) -> str:
        self.skip()
        if self.peek('"'):
            end = self.text.find('"', self.pos + 1)
            if end < 0:
                raise _fail(self.text, self.pos, "unterminated quoted name")
            value, self.pos = self.text[self.pos + 1:end], end + 1
            return value
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ',()" \t\n':
            self.pos += 1
        if self.pos == start:
            raise _fail(self.text, start, "expected a name")
        return self.text[start:self.pos]

    def query(self):
        """``(shape, anchors, relations)``: the structure tuple and the names in slot order."""
        for op in ("i(", "u("):
            if self.peek(op):
                self.pos += 2
                parts = [self.query()]
                while self.peek(","):
                    self.pos += 1
                    parts.append(self.query())
                self.expect(")")
                if len(parts) < 2:
                    raise _fail(self.text, self.pos - 1, f"{op[0]}(...) needs two sub-queries at least")
                slots = [s for _, part in parts for s in part]
                shape = tuple(p for p, _ in parts)
                return (shape + (("u",),), slots + [None]) if op == "u(" else (shape, slots)
        if not self.peek("("):
            self.refuse_negation()
            raise _fail(self.text, self.pos, f"expected a query ({QUERY_FORMS}), found {self.found()!r}")
        self.pos += 1
        if self.peek("e:"):
            self.pos += 2
            source, slots = "e", [("e", self.name())]
        elif self.peek("(") or self.peek("i(") or self.peek("u("):
            source, slots = self.query()
        else:
            self.refuse_negation()
            # A bare name here is the usual slip ("(aspirin, (r:treats))"): say what a chain starts with.
            raise _fail(self.text, self.pos, f"expected an entity 'e:NAME' or a sub-query ({QUERY_FORMS}) "
                                             f"as the chain's start, found {self.found()!r}")
        self.expect(",")
        self.expect("(")
        rels = []
        while True:
            if self.peek("r-:"):
                self.pos += 3
                rels.append(("r-", self.name()))
            elif self.peek("r:"):
                self.pos += 2
                rels.append(("r", self.name()))
            else:
                self.refuse_negation()
                raise _fail(self.text, self.pos, "expected a relation 'r:name' or 'r-:name'")
            if not self.peek(","):
                break
            self.pos += 1
            if self.peek(")"):  # a trailing comma, as in Python's one-tuple (r:x,)
                break
        self.expect(")")
        self.expect(")")
        return (source, tuple("r" for _ in rels)), slots + rels


def parse_query(text: str) -> tuple[str, list]:
    """``(structure name, slots)``: each slot ``("e", name)``, ``("r", name)``, ``("r-", name)``
    or None (a union marker), in the order of the structure's instances.

    Grammar (whitespace is free; a comma may follow the last relation, as in ``(r:x,)``)::

        query  := "(" source "," "(" rel { "," rel } ")" ")"     a chain of projections
                | "i(" query "," query { "," query } ")"         an intersection
                | "u(" query "," query { "," query } ")"         a union
        source := "e:" name | query
        rel    := "r:" name | "r-:" name                         forward / inverse
        name   := characters other than ,()" and spaces, or a "double-quoted string"

    One example per structure: ``(e:aspirin, (r:treats))`` (1p),
    ``(e:aspirin, (r:treats, r-:causes))`` (2p), ``(e:aspirin, (r:treats, r:causes, r:part_of))``
    (3p), ``i((e:a, (r:x)), (e:b, (r:y)))`` (2i), ``i((e:a, (r:x)), (e:b, (r:y)), (e:c, (r:z)))``
    (3i), ``(i((e:a, (r:x)), (e:b, (r:y))), (r:z))`` (ip), ``i((e:a, (r:x, r:y)), (e:b, (r:z)))``
    (pi), ``u((e:a, (r:x)), (e:b, (r:y)))`` (2u), ``(u((e:a, (r:x)), (e:b, (r:y))), (r:z))`` (up).
    A negation (BetaE's ``n``, ``not``, ``-``) raises "negation is not supported (types: ...)".
    """
    parser = _Parser(text)
    shape, slots = parser.query()
    parser.skip()
    if parser.pos != len(text):
        raise _fail(text, parser.pos, "unexpected text after the query")
    for name, structure in STRUCTURES.items():
        if structure == shape:
            return name, slots
    raise QuerySyntaxError(f"the query's structure {shape} is not one the encoders answer; "
                           f"known: {', '.join(STRUCTURES)}")


def _index(names: list[str], name: str, kind: str) -> int:
    lookup = {n: i for i, n in enumerate(names)}
    if name not in lookup:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise QuerySyntaxError(f"unknown {kind} {name!r}{hint}")
    return lookup[name]


def answer_query(cfg, run, text: str, top: int = 10) -> tuple[str, list[tuple[str, float]]]:
    """Answer ``text`` with a restored federation ``run`` by distributed retrieval:
    ``(structure, [(entity name, score)] best first)``. Whoever calls this holds the
    federation key (it hashes the names); the server sees only keys."""
    from lightning_fedkg.federated.alignment import federation_key, hash_names

    from .retrieval import CrossQueries, digest_keys, global_names

    structure, slots = parse_query(text)
    entities, relations = global_names(run.fkg, "entity"), global_names(run.fkg, "relation")
    key = federation_key(cfg.federated.federation_key, cfg.seed)
    row, inverse = [], []
    for slot in slots:
        if slot is None:
            row.append(0), inverse.append(0)
        elif slot[0] == "e":
            row.append(int(digest_keys(hash_names([entities[_index(entities, slot[1], "entity")]], key))[0]))
            inverse.append(0)
        else:
            row.append(int(digest_keys(hash_names([relations[_index(relations, slot[1], "relation")]], key))[0]))
            inverse.append(1 if slot[0] == "r-" else 0)
    empty = torch.zeros(2, dtype=torch.long)
    query = CrossQueries(structure, torch.tensor([row]), torch.tensor([inverse]), empty[:2], empty[:0], empty[:2],
                         empty[:0])
    scores, union_keys = run.server.retrieve(run.exchange, query)
    best = scores[0].topk(min(top, scores.shape[1]))
    names_by_key = dict(zip(digest_keys(hash_names(entities, key)).tolist(), entities))
    return structure, [(names_by_key[int(union_keys[i])], float(s)) for s, i in zip(best.values, best.indices)]
