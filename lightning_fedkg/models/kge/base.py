"""The base of every KGE score function: a PyG ``KGEModel`` with our parameter layout and
fast 1-vs-many scoring.

Every model scores a triple ``(h, r, t)`` with "higher = more plausible". Parameter names are
part of the federated contract: ``entity_emb`` ``[N, w_e]``, ``relation_emb`` ``[R, w_r]`` and
model-specific tables named ``entity_*`` (first dimension ``N``) or ``relation_*`` (``R``);
:meth:`KGEModel.shareable_groups` declares them as the ``"entity"`` and ``"relation"`` groups
(:mod:`lightning_fedkg.models.shareable`), all that a federated strategy can move.

1-vs-many scoring (:meth:`KGEModel.score_tails`, :meth:`KGEModel.score_heads`) is
``compare(query, candidate)``: the query folds the known entity and the relation into one
vector, the candidate is the (possibly relation-projected) entity. No model clamps or
renormalises embeddings; the papers' soft constraints are :meth:`KGEModel.regularization_loss`.
Rows are read through :meth:`KGEModel.lookup` (row-sparse gradients for ``sparse_adam``).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn.kge import KGEModel as PyGKGEModel

from lightning_fedkg.models.kge.scoring import CandidateScoring
from lightning_fedkg.models.shareable import InitSpec, SharedGroup

__all__ = ["KGEModel", "gather_rows", "model_options"]


class KGEModel(CandidateScoring, PyGKGEModel):
    """Base class of all score functions, a :class:`torch_geometric.nn.kge.KGEModel`.

    PyG's API works as PyG defines it: ``model(head_index, rel_type, tail_index)`` scores
    triples, :meth:`loss` is a training objective, and PyG's ``loader``, ``random_sample``
    and ``test`` (which read ``num_nodes``) come from the PyG base. Our training and ranking
    use the fast 1-vs-many :meth:`score_tails` / :meth:`score_heads` instead of PyG's
    one-triple-at-a-time ``test``. Every table is drawn from ``U(-rho, rho)`` with
    ``rho = (gamma + epsilon) / dim``, as in the FedE, FedLU and RotatE code.

    Args:
        num_entities: ``N``, rows of the entity tables.
        num_relations: ``R``, rows of the relation tables.
        dim: the hidden dimension ``d``; the init range is ``rho = (gamma + epsilon) / d``.
        gamma: margin of the distance models (``gamma - distance``); bilinear models use it
            only through ``rho``.
        epsilon: the init-range offset (2.0 in the reference code).
        entity_width, relation_width: widths of ``entity_emb`` / ``relation_emb``
            (default ``dim``); set by subclasses, not by users.
        extra_tables: ``{name: width}`` of model-specific tables; each name must start with
            ``entity_`` or ``relation_``. Set by subclasses.

    Subclasses implement :meth:`forward`, :meth:`_tail_query`, :meth:`_head_query` and
    :meth:`_compare`, and for relation-dependent projections also :meth:`_candidates`.
    """

    #: True when the candidate representation depends on the query's relation (TransH/R/D
    #: project entities per relation): shared candidates are then projected per relation.
    relation_dependent_candidates: bool = False
    #: Rows read through :meth:`lookup` / :func:`gather_rows` get row-sparse gradients
    #: (``train.optimizer: sparse_adam``); False (the default) keeps dense ones.
    sparse_gradients: bool = False

    def __init__(
        self,
        num_entities: int,
        num_relations: int,
        dim: int,
        gamma: float = 10.0,
        epsilon: float = 2.0,
        *,
        entity_width: int | None = None,
        relation_width: int | None = None,
        extra_tables: dict[str, int] | None = None,
    ):
        # PyG's KGEModel.__init__ is skipped on purpose: it would register two nn.Embedding
        # tables, node_emb and rel_emb, whose normal_ init draws N*d + R*d numbers from the
        # global RNG before our tables (every seeded result shifts) and whose state-dict keys
        # (node_emb.weight, rel_emb.weight) would sit next to the entity_*/relation_* tables
        # that checkpoints and federated payloads name. What PyG's base methods read of it
        # (num_nodes, num_relations, hidden_channels) is provided below instead.
        nn.Module.__init__(self)
        if num_entities < 1 or num_relations < 1 or dim < 1:
            raise ValueError(
                f"num_entities, num_relations and dim must be positive, got "
                f"{num_entities}, {num_relations}, {dim}"
            )
        self.num_entities = int(num_entities)
        self.num_relations = int(num_relations)
        self.dim = int(dim)
        self.gamma = float(gamma)
        self.epsilon = float(epsilon)
        self.embedding_range = (self.gamma + self.epsilon) / self.dim
        #: Upper bound on the elements of one broadcast chunk (B x chunk x width) in
        #: 1-vs-many scoring; lower it to save memory, raise it for speed.
        self.max_chunk_elements: int = 2**24
        self.entity_emb = nn.Parameter(torch.empty(num_entities, entity_width or dim))
        self.relation_emb = nn.Parameter(torch.empty(num_relations, relation_width or dim))
        for name, width in (extra_tables or {}).items():
            if name.startswith("entity_"):
                rows = num_entities
            elif name.startswith("relation_"):
                rows = num_relations
            else:
                raise ValueError(f"extra table '{name}' must start with 'entity_' or 'relation_'")
            self.register_parameter(name, nn.Parameter(torch.empty(rows, width)))
        self.reset_parameters()

    # ------------------------------------------------------------------ parameters
    @classmethod
    def option_names(cls) -> tuple[str, ...] | None:
        """The keyword options this model takes beyond the common ones (:func:`model_options`)."""
        return model_options(cls)

    def reset_parameters(self) -> None:
        """Draw every table from ``U(-rho, rho)`` (subclasses may override single tables)."""
        with torch.no_grad():
            for param in self.parameters(recurse=False):
                param.uniform_(-self.embedding_range, self.embedding_range)

    def init_spec(self, name: str) -> InitSpec:
        """How :meth:`reset_parameters` draws one row of table ``name`` (as data)."""
        return InitSpec("uniform", (-self.embedding_range, self.embedding_range))

    def shareable_groups(self) -> dict[str, SharedGroup]:
        """``{"entity": every entity_* table, "relation": every relation_* table}``, row-indexed."""
        params = dict(self.named_parameters(recurse=False))

        def group(names: list[str], index: str) -> SharedGroup:
            return SharedGroup({n: params[n] for n in names}, index, {n: self.init_spec(n) for n in names})

        return {
            "entity": group(self.entity_parameter_names(), "entity"),
            "relation": group(self.relation_parameter_names(), "relation"),
        }

    @torch.no_grad()
    def resize_rows(self, index: str, count: int, values: dict[str, Tensor] | None = None,
                    generator: torch.Generator | None = None) -> None:
        """Grow or shrink every ``entity_*`` (``index="entity"``) or ``relation_*`` table to
        ``count`` rows, in place: the ``Parameter`` objects stay, so shareable groups and
        references remain valid (FKGE's virtual entities are appended for an update and
        dropped after it). Rows kept keep their values exactly; appended rows take
        ``values[name]`` (``[count - old, ...]``) or a fresh draw of :meth:`init_spec`.
        An optimizer built before a resize holds state of the old shape: build a new one.
        """
        if index not in ("entity", "relation"):
            raise ValueError(f"index must be 'entity' or 'relation', got {index!r}")
        if count < 1:
            raise ValueError(f"a model needs at least one {index}, got count={count}")
        names = self.entity_parameter_names() if index == "entity" else self.relation_parameter_names()
        params = dict(self.named_parameters(recurse=False))
        old = params[names[0]].shape[0]
        for name in names:
            p = params[name]
            if count <= old:
                p.data = p.data[:count].clone()
                continue
            extra = count - old
            if values is not None and name in values:
                new = values[name].to(device=p.device, dtype=p.dtype)
                if new.shape != (extra, *p.shape[1:]):
                    raise ValueError(f"{name}: {extra} new rows need shape {(extra, *p.shape[1:])}, got {tuple(new.shape)}")
            else:
                u = torch.rand((extra, *p.shape[1:]), generator=generator, dtype=torch.float64)
                new = self.init_spec(name).draw(u.reshape(extra, -1)).reshape(u.shape).to(device=p.device, dtype=p.dtype)
            p.data = torch.cat([p.data, new])
        if index == "entity":
            self.num_entities = int(count)
        else:
            self.num_relations = int(count)

    def entity_parameter_names(self) -> list[str]:
        """Names of the per-entity tables (first dim ``N``), ``entity_emb`` first."""
        return [n for n, _ in self.named_parameters(recurse=False) if n.startswith("entity_")]

    def relation_parameter_names(self) -> list[str]:
        """Names of the per-relation tables (first dim ``R``), ``relation_emb`` first."""
        return [n for n, _ in self.named_parameters(recurse=False) if n.startswith("relation_")]

    @property
    def entity_width(self) -> int:
        return self.entity_emb.shape[1]

    @property
    def relation_width(self) -> int:
        return self.relation_emb.shape[1]

    @property
    def num_nodes(self) -> int:
        """PyG's name of :attr:`num_entities` (read by PyG's ``test`` and ``random_sample``)."""
        return self.num_entities

    @property
    def hidden_channels(self) -> int:
        """PyG's name of :attr:`dim`."""
        return self.dim

    # PyG's KGEModel replaces nn.Module's repr with a one-liner that leaves out gamma, p_norm
    # and the tables; ours keeps the nn.Module form.
    __repr__ = nn.Module.__repr__

    def extra_repr(self) -> str:
        return (
            f"num_entities={self.num_entities}, num_relations={self.num_relations}, "
            f"dim={self.dim}, gamma={self.gamma}, epsilon={self.epsilon}"
        )

    def lookup(self, table: Tensor, ids: Tensor) -> Tensor:
        """``table[ids]`` (``[*ids.shape, width]``): how models read rows of their tables.

        With :attr:`sparse_gradients` the rows come from
        ``torch.nn.functional.embedding(ids, table, sparse=True)``, the same values, whose
        gradient for ``table`` is a sparse COO tensor of the rows read (what a row-sparse
        optimizer updates) instead of a dense ``[rows, width]`` one. A model that indexes a
        table directly gives it a dense gradient, which the row-sparse optimizer refuses.
        """
        if self.sparse_gradients:
            return F.embedding(ids, table, sparse=True)
        return table[ids]

    # ------------------------------------------------------------------ scoring API
    def forward(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        """Score each triple: the ids are LongTensors ``[B]``; returns ``[B]``."""
        raise NotImplementedError

    def loss(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        """PyG's training objective: binary cross-entropy with logits of the triples (target 1)
        and of one :meth:`random_sample` corruption of each (target 0), as PyG's DistMult,
        ComplEx and RotatE define it. Our Lightning module trains with its own losses."""
        pos_score = self(head_index, rel_type, tail_index)
        neg_score = self(*self.random_sample(head_index, rel_type, tail_index))
        scores = torch.cat([pos_score, neg_score])
        target = torch.cat([torch.ones_like(pos_score), torch.zeros_like(neg_score)])
        return F.binary_cross_entropy_with_logits(scores, target)

    def score_tails(self, h: Tensor, r: Tensor, candidates: Tensor | None = None) -> Tensor:
        """Score ``(h, r, ?)`` against candidate tails.

        Args:
            h, r: LongTensors ``[B]``.
            candidates: ``None`` (all ``N`` entities), a LongTensor ``[n]`` shared by the
                batch, or a LongTensor ``[B, n]`` with one candidate list per query.

        Returns:
            ``[B, n]`` scores; entry ``[i, j]`` equals ``forward(h[i], r[i], cand_ij)``.
        """
        return self._score_candidates(self._tail_query(h, r), r, candidates)

    def score_heads(self, r: Tensor, t: Tensor, candidates: Tensor | None = None) -> Tensor:
        """Score ``(?, r, t)`` against candidate heads; ``candidates`` as in :meth:`score_tails`."""
        return self._score_candidates(self._head_query(r, t), r, candidates)

    def regularization_loss(self, triples: Tensor | None = None) -> Tensor:
        """Scalar regulariser the training module may add with its own weight.

        Default: the N3 penalty of the RotatE/FedE codebases' ``--regularization`` option,
        ``sum |x|^3`` over the rows of ``entity_emb`` and ``relation_emb``. With
        ``triples`` (LongTensor ``[B, 3]``) only the batch's rows are penalised, counted per
        occurrence; without, the whole tables.
        """
        ent, rel = self._regularized_rows(triples)
        return ent.abs().pow(3).sum() + rel.abs().pow(3).sum()

    # ------------------------------------------------------------------ hooks
    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        """``[B, w]`` query vector of ``(h, r, ?)``."""
        raise NotImplementedError

    def _head_query(self, r: Tensor, t: Tensor) -> Tensor:
        """``[B, w]`` query vector of ``(?, r, t)``."""
        raise NotImplementedError

    def _candidates(self, ids: Tensor, r: Tensor) -> Tensor:
        """Candidate vectors for entity ids ``[c]`` or ``[B, c]``.

        Relation-independent models return ``entity_emb[ids]`` (``[c, w]`` / ``[B, c, w]``);
        relation-dependent ones always return ``[B, c, w]``.
        """
        return gather_rows(self.entity_emb, ids, sparse=self.sparse_gradients)

    def _compare(self, query: Tensor, cand: Tensor) -> Tensor:
        """Scores ``[B, c]`` of queries ``[B, w]`` against ``cand`` ``[c, w]`` or ``[B, c, w]``."""
        raise NotImplementedError

    def _regularized_rows(self, triples: Tensor | None) -> tuple[Tensor, Tensor]:
        if triples is None:
            return self.entity_emb, self.relation_emb
        ents = torch.cat([triples[:, 0], triples[:, 2]])
        return self.lookup(self.entity_emb, ents), self.lookup(self.relation_emb, triples[:, 1])


def gather_rows(table: Tensor, ids: Tensor, sparse: bool = False) -> Tensor:
    """``table[ids]`` for an index tensor of any shape.

    ``index_select`` on the flattened ids has a cheaper backward (``index_add_``) than
    advanced indexing (``index_put_`` with accumulation): about 15% less time per training
    batch with 512 x 256 per-triple negatives on CPU. ``sparse``: the same rows through
    ``F.embedding(..., sparse=True)``, whose gradient is row-sparse (:meth:`KGEModel.lookup`).
    """
    if sparse:
        return F.embedding(ids, table, sparse=True)
    return table.index_select(0, ids.reshape(-1)).view(*ids.shape, table.shape[-1])


# Every model takes these; model_options lists what a model takes beyond them.
_COMMON_ARGUMENTS = ("self", "num_entities", "num_relations", "dim", "gamma", "epsilon")


def model_options(cls: type[KGEModel]) -> tuple[str, ...] | None:
    """The model-specific keyword options of ``cls`` (e.g. ``("p_norm", "relation_dim")``
    for TransR), read from its ``__init__``; None when it takes ``**kwargs`` (any option)."""
    options = []
    for param in inspect.signature(cls.__init__).parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if param.kind is not inspect.Parameter.VAR_POSITIONAL and param.name not in _COMMON_ARGUMENTS:
            options.append(param.name)
    return tuple(options)
