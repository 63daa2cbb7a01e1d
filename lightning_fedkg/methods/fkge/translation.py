"""The end of an FKGE handshake, whatever the alignment: the translated rows a client sends
(``fkge_translated``), how the host scores the translation, and the host's KGEmb-Update with
them (kept only if its validation improved).

The functions act on an :class:`~.federation.FKGEPeer` (``peer``): the client's side of the
handshake (:func:`translated_message`) or the host's (:func:`translation_cosine`,
:func:`heldout_alignment`, :func:`update_with`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.federated.message import Message

from .handshake import ClientSide, Hosting, PPATClientSide, UpdateOutcome
from .update import kgemb_update

__all__ = ["neighbour_edges", "translated_message", "translation_cosine", "heldout_alignment", "update_with"]


def neighbour_edges(train: Tensor, anchors: Tensor, excluded: Tensor, per_anchor: int) -> Tensor:
    """The client's joining triples for ``G(N(X))``: ``LongTensor[v, 4]`` rows
    ``(anchor position, relation, neighbour, neighbour_is_head)``.

    A candidate is a train triple with one end an aligned entity (``anchors[p]`` for
    position ``p``) and the other end an entity not in ``excluded`` (everything the partner
    already holds). Each neighbour is used once, by its first candidate in train order;
    each anchor keeps its first ``per_anchor`` neighbours.
    """
    if per_anchor <= 0 or anchors.numel() == 0 or train.numel() == 0:
        return torch.zeros(0, 4, dtype=torch.long)
    size = int(max(train[:, [0, 2]].max(), anchors.max(), excluded.max() if excluded.numel() else 0)) + 1
    position = torch.full((size,), -1, dtype=torch.long)
    position[anchors] = torch.arange(anchors.numel())
    shut = torch.zeros(size, dtype=torch.bool)
    shut[excluded] = True
    shut[anchors] = True
    h, r, t = train[:, 0], train[:, 1], train[:, 2]
    tail_side = (position[h] >= 0) & ~shut[t]  # anchor is the head, the neighbour the tail
    head_side = (position[t] >= 0) & ~shut[h]
    order = torch.arange(train.shape[0])
    cand = torch.cat([
        torch.stack([position[h], r, t, torch.zeros_like(h), order], 1)[tail_side],
        torch.stack([position[t], r, h, torch.ones_like(h), order], 1)[head_side],
    ])
    if cand.numel() == 0:
        return torch.zeros(0, 4, dtype=torch.long)
    cand = cand[torch.argsort(cand[:, 4] * 2 + cand[:, 3], stable=True)]  # train order, tail side first
    # first candidate of each neighbour
    nb = cand[:, 2]
    first = torch.full((size,), cand.shape[0], dtype=torch.long).scatter_reduce(
        0, nb, torch.arange(cand.shape[0]), reduce="amin")
    cand = cand[first[nb] == torch.arange(cand.shape[0])]
    # rank within each anchor (stable: train order), keep the first per_anchor
    by_anchor = torch.argsort(cand[:, 0], stable=True)
    cand = cand[by_anchor]
    anchor = cand[:, 0].contiguous()
    starts = torch.searchsorted(anchor, anchor)
    keep = (torch.arange(cand.shape[0]) - starts) < per_anchor
    return cand[keep][:, :4]


# ---------------------------------------------------------------------- the client's side
def translated_message(peer, host: str, side: ClientSide) -> Message:
    """``G(X)`` (entity rows, then relation rows) and ``G(N(X))`` with their joining triples:
    what ``peer``, the client, sends ``host`` at the end of the handshake."""
    ents = side.entities
    if isinstance(side, PPATClientSide):  # how far PPAT moved the generator: a local record, never sent
        peer.served.append({"host": host, "generator_moved": side.generator_moved()})
    translated = side.translate(side.x)
    arrays = {"entities": translated[: ents.numel()].contiguous(),
              "relations": translated[ents.numel():].contiguous()}
    mine_all = peer.entity_pairs[host][0]
    edges = neighbour_edges(peer.party.kg.triples("train"), ents, mine_all, peer.fk.neighbours)
    rel_position = torch.full((peer.party.kg.num_relations,), -1, dtype=torch.long)
    if peer.uses_relations and host in peer.relation_pairs:
        aligned_rel = peer.relation_pairs[host][0]
        rel_position[aligned_rel] = torch.arange(aligned_rel.numel())
    model = peer.party.model
    arrays["neighbours"] = side.translate(model.entity_emb.detach()[edges[:, 2]].float().cpu())
    arrays["neighbour_anchor"] = edges[:, 0].contiguous()
    arrays["neighbour_relation"] = rel_position[edges[:, 1]].contiguous()
    arrays["neighbour_is_head"] = edges[:, 3].contiguous()
    # not noised: what the host receives as a client's rows is declared, not accounted
    peer.ledger.declare("translated_rows", translated.shape[0] + edges.shape[0])
    heldout = peer.heldout_ids(host)
    if heldout.numel():  # only to score the translation on pairs no alignment used
        arrays["heldout"] = side.translate(peer.rows(heldout, heldout[:0]))
        peer.ledger.declare("heldout_rows", heldout.numel())
    return Message(arrays=arrays, metrics={"seconds_client": float(side.seconds)})


# ---------------------------------------------------------------------- the host's side
def translation_cosine(host: Hosting, message: Message) -> dict:
    """How well the handshake aligned the two spaces, a local diagnostic of the host: the mean
    cosine between ``G(x_i)`` and its own ``y_i`` (``translation_cosine``) and between
    ``G(x_i)`` and another item's ``y_{i+1}`` (``mismatched_cosine``, the level any shared
    direction of the tables gives); the gap is what the translation matched."""
    translated = torch.cat([message.arrays["entities"], message.arrays["relations"]]).float()
    y = host.y
    if translated.shape != y.shape or translated.shape[0] < 2:
        return {"translation_cosine": None, "mismatched_cosine": None}
    cos = torch.nn.functional.cosine_similarity
    return {"translation_cosine": float(cos(translated, y, dim=1).mean()),
            "mismatched_cosine": float(cos(translated, y.roll(1, dims=0), dim=1).mean())}


def heldout_alignment(peer, host: Hosting, message: Message) -> dict:
    """The translation scored on the held-out pairs, a local diagnostic of the host: the
    mean cosine of ``G(x_i)`` and ``y_i`` and the share of translated rows whose own
    ``y_i`` ranks first / in the top 10 by cosine among all the host's entity rows."""
    ids = peer.heldout_ids(host.partner)
    if "heldout" not in message.arrays or ids.numel() == 0:
        return {"heldout_pairs": 0, "heldout_cosine": None, "heldout_hits1": None, "heldout_hits10": None}
    normalize = torch.nn.functional.normalize
    translated = normalize(message.arrays["heldout"].float(), dim=1)
    table = normalize(peer.party.model.entity_emb.detach().float().cpu(), dim=1)
    sims = translated @ table.T  # [h, n]
    own = sims.gather(1, ids.view(-1, 1))
    rank = (sims > own).sum(dim=1) + 1  # ties in the host's favour: an optimistic rank
    n = int(ids.numel())
    return {"heldout_pairs": n, "heldout_cosine": float(own.mean()),
            "heldout_hits1": int((rank <= 1).sum()) / n, "heldout_hits10": int((rank <= 10).sum()) / n}


def update_with(peer, host: Hosting, message: Message) -> UpdateOutcome:
    """The host's KGEmb-Update with what the client sent (``mode: none``: without it)."""
    fk = peer.fk
    if fk.mode == "none":  # the control: the same update, nothing received is used
        width = peer.party.model.entity_emb.shape[1]
        return _kgemb_update(peer, host, torch.zeros(0, dtype=torch.long), torch.zeros(0, width))
    a = message.arrays
    kg = peer.party.kg
    n, r = kg.num_entities, kg.num_relations
    anchors = host.entities[a["neighbour_anchor"]]
    virtual = torch.arange(n, n + anchors.numel())
    relation_ids = torch.full((anchors.numel(),), r, dtype=torch.long)  # the update's fresh relation
    known = a["neighbour_relation"] >= 0
    if known.any():
        relation_ids[known] = peer.relation_pairs[host.partner][0][a["neighbour_relation"][known]]
    is_head = a["neighbour_is_head"].bool()
    triples = torch.stack([torch.where(is_head, virtual, anchors), relation_ids,
                           torch.where(is_head, anchors, virtual)], 1)
    relations = host.relations.numel() > 0
    translated = a["entities"]
    if fk.shuffle_received:  # the diagnostic control: right values, wrong items
        order = torch.Generator().manual_seed(peer.handshake_seed(host.partner, host.number, "shuffle"))
        translated = translated[torch.randperm(translated.shape[0], generator=order)]
    return _kgemb_update(
        peer, host, host.entities, translated, a["neighbours"], triples,
        virtual_relations=1 if bool((~known).any()) else None,
        aligned_relation_ids=host.relations if relations else None,
        translated_relations=a["relations"] if relations else None)


def _kgemb_update(peer, host: Hosting, ids: Tensor, rows: Tensor, virtual_entities: Tensor | None = None,
                  virtual_triples: Tensor | None = None, **extra) -> UpdateOutcome:
    from lightning_fedkg.builders import datamodule_kwargs, trainer_kwargs

    fk = peer.fk
    out = kgemb_update(
        peer.party.kg, peer.party.module, ids, rows, virtual_entities, virtual_triples,
        mode="replace" if fk.mode == "none" else fk.mode, epochs=fk.update_epochs,
        trainer_kwargs=trainer_kwargs(peer.cfg.trainer), datamodule_kwargs=datamodule_kwargs(peer.cfg),
        eval_datamodule=peer.party.datamodule, backtrack_on=fk.backtrack_on, valid_before=peer.best,
        seed=peer.handshake_seed(host.partner, host.number, "update"), **extra)
    if out["accepted"]:
        peer.best = out["valid_after"]
    return UpdateOutcome(accepted=out["accepted"], seconds_update=out["seconds"],
                         virtual_entities=0 if virtual_entities is None else int(virtual_entities.shape[0]),
                         valid_before=out["valid_before"], valid_after=out["valid_after"])
