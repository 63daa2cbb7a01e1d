"""FKGE's host-side KGEmb-Update with virtual entities and backtracking.

Peng et al., CIKM 2021, §3.3 and Alg. 1: the host writes the translated aligned rows into
its table (``mode="replace"``, the paper, or ``"average"``, the official code), appends the
translated neighbours as virtual rows with their joining triples (:func:`add_virtual_rows`),
trains, removes them (:func:`remove_virtual_rows`) and keeps the result only if its
``backtrack_on`` score improved, else restores the exact previous state
(:func:`kgemb_update`). See docs/methods/fkge.md.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lightning_fedkg.data.datamodule import KGDataModule
from lightning_fedkg.data.kg import KnowledgeGraph

__all__ = ["VirtualRows", "add_virtual_rows", "remove_virtual_rows", "kgemb_update", "MODES", "BACKTRACK_ON"]

MODES = ("replace", "average")
BACKTRACK_ON = ("valid", "test")


@dataclass
class VirtualRows:
    """What :func:`remove_virtual_rows` needs to undo :func:`add_virtual_rows`'s growth.

    Attributes:
        num_entities, num_relations: the host's original table sizes (``N``, ``R``).
        num_virtual_entities, num_virtual_relations: rows appended after them.
        aligned_ids: the aligned host rows that were overwritten (replace/average).
        aligned_before: their ``entity_emb`` rows before the overwrite (for inspection;
            the aligned rows are *meant* to change, so removal leaves them as updated).
    """

    num_entities: int
    num_relations: int
    num_virtual_entities: int
    num_virtual_relations: int
    aligned_ids: Tensor
    aligned_before: Tensor = field(repr=False)


def _virtual_relation_values(module, virtual_relations) -> tuple[int, dict[str, Tensor] | None]:
    if virtual_relations is None:
        return 0, None
    if isinstance(virtual_relations, int):
        if virtual_relations < 0:
            raise ValueError(f"virtual_relations must be >= 0, got {virtual_relations}")
        return virtual_relations, None
    values = torch.as_tensor(virtual_relations)
    width = module.model.relation_emb.shape[1]
    if values.dim() != 2 or values.shape[1] != width:
        raise ValueError(f"virtual_relations must have shape [r, {width}], got {tuple(values.shape)}")
    return int(values.shape[0]), {"relation_emb": values}


def _aligned_relations(model, num_relations: int, ids, values) -> tuple[Tensor, Tensor]:
    if ids is None and values is None:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, model.relation_emb.shape[1])
    if ids is None or values is None:
        raise ValueError("aligned_relation_ids and translated_relations go together")
    ids = torch.as_tensor(ids).long().reshape(-1)
    values = torch.as_tensor(values)
    width = model.relation_emb.shape[1]
    if values.shape != (ids.numel(), width):
        raise ValueError(f"translated_relations must have shape {(ids.numel(), width)}, got {tuple(values.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_relations
                        or torch.unique(ids).numel() != ids.numel()):
        raise ValueError(f"aligned relation ids must be distinct and lie in [0, {num_relations})")
    return ids, values


def _overwrite(table: Tensor, ids: Tensor, new: Tensor, mode: str) -> None:
    """``table[ids] <- new`` (replace, the paper) or ``(table[ids] + new) / 2`` (average, the code)."""
    new = new.to(device=table.device, dtype=table.dtype)
    table.data[ids] = new if mode == "replace" else (table.data[ids] + new) / 2


@torch.no_grad()
def add_virtual_rows(
    kg: KnowledgeGraph,
    module,
    aligned_local_ids: Tensor,
    translated_aligned: Tensor,
    virtual_entities: Tensor | None = None,
    virtual_triples: Tensor | None = None,
    mode: str = "replace",
    virtual_relations: Tensor | int | None = None,
    generator: torch.Generator | None = None,
    aligned_relation_ids: Tensor | None = None,
    translated_relations: Tensor | None = None,
) -> tuple[KnowledgeGraph, VirtualRows]:
    """Write the client's translated embeddings into ``module`` and build the augmented KG.

    FKGE §3.3 (KGEmb-Update): ``G(X)`` goes into the aligned rows, ``G(N(X))`` becomes
    virtual entities ``N .. N+v-1`` of the host.

    Args:
        kg: the host's graph (not modified).
        module: the host's :class:`~lightning_fedkg.models.kge_module.KGEModule`; its
            ``entity_*`` (and, with ``virtual_relations``, ``relation_*``) tables grow in
            place through ``KGEModel.resize_rows``.
        aligned_local_ids: ``LongTensor[k]``, distinct host ids of the aligned entities.
        translated_aligned: ``Tensor[k, d]``, ``G(x)`` in the same order.
        virtual_entities: ``Tensor[v, d]``, translated neighbours; they become the
            ``entity_emb`` rows of ids ``N..N+v-1`` (other ``entity_*`` tables, e.g.
            TransD's ``entity_proj``, get fresh initial rows drawn with ``generator``).
        virtual_triples: ``LongTensor[t, 3]`` (head, relation, tail); entity ids ``>= N``
            name virtual entities, relation ids ``>= R`` name virtual relations.
        mode: ``"replace"`` (paper) or ``"average"`` (official code, Config.py
            ``make_embedding``).
        virtual_relations: None, a count of fresh relation rows, or ``Tensor[r, d_r]``
            values for ``relation_emb`` (other ``relation_*`` tables get fresh rows).
        aligned_relation_ids, translated_relations: ``LongTensor[k_r]`` distinct host ids of
            aligned relations and ``Tensor[k_r, d_r]``, their translated ``relation_emb``
            rows (FKGE with relation alignment), written with the same ``mode``.

    Returns:
        ``(augmented_kg, restore_info)``: ``augmented_kg`` has ``N+v`` entities, ``R+r``
        relations and train = ``kg`` train + ``virtual_triples``; valid/test unchanged.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    model = module.model
    n, r = int(kg.num_entities), int(kg.num_relations)
    if model.num_entities != n or model.num_relations != r:
        raise ValueError(f"module has {model.num_entities} entities / {model.num_relations} relations, "
                         f"kg has {n} / {r}: remove earlier virtual rows first")
    table = model.entity_emb
    width = table.shape[1]
    ids = torch.as_tensor(aligned_local_ids).long().reshape(-1)
    trans = torch.as_tensor(translated_aligned)
    if trans.shape != (ids.numel(), width):
        raise ValueError(f"translated_aligned must have shape {(ids.numel(), width)}, got {tuple(trans.shape)}")
    if ids.numel():
        if int(ids.min()) < 0 or int(ids.max()) >= n:
            raise ValueError(f"aligned ids must lie in [0, {n})")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("aligned_local_ids must be distinct")
    if virtual_entities is None:
        virtual_entities = table.new_zeros(0, width)
    virtual_entities = torch.as_tensor(virtual_entities)
    if virtual_entities.dim() != 2 or virtual_entities.shape[1] != width:
        raise ValueError(f"virtual_entities must have shape [v, {width}], got {tuple(virtual_entities.shape)}")
    v = int(virtual_entities.shape[0])
    num_vrel, rel_values = _virtual_relation_values(module, virtual_relations)
    if virtual_triples is None:
        virtual_triples = torch.zeros(0, 3, dtype=torch.long)
    virtual_triples = torch.as_tensor(virtual_triples).long()
    if virtual_triples.dim() != 2 or virtual_triples.shape[1] != 3:
        raise ValueError(f"virtual_triples must have shape [t, 3], got {tuple(virtual_triples.shape)}")
    if virtual_triples.numel():
        ent = virtual_triples[:, [0, 2]]
        if int(ent.min()) < 0 or int(ent.max()) >= n + v:
            raise ValueError(f"virtual_triples: entity id outside [0, {n + v})")
        rel = virtual_triples[:, 1]
        if int(rel.min()) < 0 or int(rel.max()) >= r + num_vrel:
            raise ValueError(f"virtual_triples: relation id outside [0, {r + num_vrel})")

    rel_ids, rel_trans = _aligned_relations(model, r, aligned_relation_ids, translated_relations)

    # 1. aligned rows: replace (paper) or average 50/50 (official code)
    before = table.data[ids].clone()
    _overwrite(table, ids, trans, mode)
    if rel_ids.numel():
        _overwrite(model.relation_emb, rel_ids, rel_trans, mode)
    # 2. virtual entities / relations appended after the real ones
    if v:
        model.resize_rows("entity", n + v, values={"entity_emb": virtual_entities}, generator=generator)
    if num_vrel:
        model.resize_rows("relation", r + num_vrel, values=rel_values, generator=generator)

    splits = {s: kg.triples(s) for s in kg.split_names}
    splits["train"] = torch.cat([splits["train"], virtual_triples])
    entity_names = (kg.entity_names + [f"virtual_entity:{i}" for i in range(v)]
                    if kg.entity_names is not None else None)
    relation_names = (kg.relation_names + [f"virtual_relation:{i}" for i in range(num_vrel)]
                      if kg.relation_names is not None else None)
    augmented = KnowledgeGraph(splits, n + v, r + num_vrel, entity_names=entity_names,
                               relation_names=relation_names, name=f"{kg.name}+virtual")
    info = VirtualRows(n, r, v, num_vrel, ids.clone(), before)
    return augmented, info


@torch.no_grad()
def remove_virtual_rows(module, restore_info: VirtualRows) -> None:
    """Shrink every ``entity_*`` / ``relation_*`` table back to the original ``N`` / ``R``
    rows (FKGE §3.3: the virtual items are dropped before the host answers anyone else).
    Rows ``< N`` keep their values; the aligned rows stay as updated."""
    model = module.model
    if restore_info.num_virtual_entities or model.num_entities != restore_info.num_entities:
        model.resize_rows("entity", restore_info.num_entities)
    if restore_info.num_virtual_relations or model.num_relations != restore_info.num_relations:
        model.resize_rows("relation", restore_info.num_relations)


def _trim_optimizer_state(module) -> None:
    """Cut the update's optimizer moments back to the tables' original row counts (the
    Parameter objects are the same, only their rows shrank), so a persistent optimizer
    (``reset_optimizer=False``) can go on after an accepted update."""
    opt = getattr(module, "_optimizer", None)
    if opt is None:
        return
    for p, state in opt.state.items():
        for key, value in state.items():
            if (torch.is_tensor(value) and value.dim() == p.dim() and value.dim() > 0
                    and value.shape[0] > p.shape[0] and value.shape[1:] == p.shape[1:]):
                state[key] = value[: p.shape[0]].clone()


def _score(trainer: L.Trainer, module, dm: KGDataModule, split: str) -> float:
    if split == "valid":
        trainer.validate(module, dataloaders=dm.val_dataloader(), verbose=False)
        return float(module.last_metrics["val"]["mrr"])
    trainer.test(module, dataloaders=dm.test_dataloader(), verbose=False)
    return float(module.last_metrics["test"]["mrr"])


def _trainer(epochs: int, trainer_kwargs: dict | None) -> L.Trainer:
    kwargs: dict[str, Any] = dict(accelerator="cpu", devices=1, enable_model_summary=False)
    kwargs.update(trainer_kwargs or {})
    return L.Trainer(logger=False, max_epochs=int(epochs), enable_progress_bar=False,
                     enable_checkpointing=False, num_sanity_val_steps=0, **kwargs)


def kgemb_update(
    kg: KnowledgeGraph,
    module,
    aligned_local_ids: Tensor,
    translated_aligned: Tensor,
    virtual_entities: Tensor | None = None,
    virtual_triples: Tensor | None = None,
    *,
    mode: str = "replace",
    virtual_relations: Tensor | int | None = None,
    epochs: int = 1,
    trainer_kwargs: dict | None = None,
    datamodule_kwargs: dict | None = None,
    eval_datamodule: KGDataModule | None = None,
    backtrack_on: str = "valid",
    valid_before: float | None = None,
    seed: int = 0,
    aligned_relation_ids: Tensor | None = None,
    translated_relations: Tensor | None = None,
) -> dict:
    """One FKGE KGEmb-Update on the host with backtracking (paper §3.3, Alg. 1).

    Snapshot ``module.state_dict()`` (and the persistent optimizer state, if any); add the
    virtual rows (:func:`add_virtual_rows`); train ``epochs`` epochs with a fresh
    ``lightning.Trainer`` on the augmented KG; remove the virtual rows; score the host's
    own ``backtrack_on`` split (MRR, filtered). The update is **accepted** iff that score is
    strictly greater than ``valid_before`` (the best score so far; evaluated on the
    pre-update state when None). Otherwise the snapshot is loaded back: every parameter
    is bit-identical to the pre-update state (after removal, so shapes match again).

    The update trains with a fresh Adam (an optimizer built before a resize holds state of
    the old shapes). On acceptance a persistent optimizer (``reset_optimizer=False``) goes
    on with that Adam, its moments cut back to the original rows; on rejection the previous
    optimizer state is restored too.

    Args:
        trainer_kwargs: extra ``lightning.Trainer`` arguments (default CPU, one device;
            e.g. ``lightning_fedkg.builders.trainer_kwargs(cfg.trainer)``).
        datamodule_kwargs: :class:`KGDataModule` arguments of the training (augmented)
            and, unless ``eval_datamodule`` is given, the evaluation datamodule.
        eval_datamodule: the host's own datamodule for scoring (must be for ``kg``).
        backtrack_on: ``"valid"`` (default) or ``"test"`` (official code, Config.py
            ``federated``).
        seed: seed of the augmented datamodule's sampler.
        aligned_relation_ids, translated_relations: see :func:`add_virtual_rows`.

    Returns:
        ``{"accepted", "valid_before", "valid_after", "seconds", "split"}`` (the scores are
        MRR on ``split``; ``"valid_*"`` keep their names for ``backtrack_on="test"`` too).
    """
    if backtrack_on not in BACKTRACK_ON:
        raise ValueError(f"backtrack_on must be one of {BACKTRACK_ON}, got {backtrack_on!r}")
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    from lightning_fedkg.federated.party import quiet_lightning

    start = time.perf_counter()
    dm_kwargs = dict(datamodule_kwargs or {})
    dm_kwargs.pop("seed", None)
    eval_dm = eval_datamodule if eval_datamodule is not None else KGDataModule(kg, seed=seed, **dm_kwargs)
    with quiet_lightning():
        if valid_before is None:
            valid_before = _score(_trainer(0, trainer_kwargs), module, eval_dm, backtrack_on)
        snapshot = {k: t.detach().clone() for k, t in module.state_dict().items()}
        opt_state = copy.deepcopy(module.optimizer_state_dict()) if hasattr(module, "optimizer_state_dict") else None
        augmented, info = add_virtual_rows(
            kg, module, aligned_local_ids, translated_aligned, virtual_entities, virtual_triples,
            mode=mode, virtual_relations=virtual_relations,
            generator=torch.Generator().manual_seed(int(seed)),
            aligned_relation_ids=aligned_relation_ids, translated_relations=translated_relations)
        if opt_state is not None or getattr(module, "_optimizer", None) is not None:
            module._optimizer = None  # its state has the old shapes (resize_rows docstring)
        try:
            trainer = _trainer(epochs, trainer_kwargs)
            if epochs:
                train_dm = KGDataModule(augmented, seed=seed, **dm_kwargs)
                trainer.fit(module, train_dataloaders=train_dm.train_dataloader())
        except BaseException:
            remove_virtual_rows(module, info)  # a failed update leaves the previous state
            module.load_state_dict(snapshot)
            module._optimizer = None
            if opt_state is not None:
                module.load_optimizer_state_dict(opt_state)
            raise
        remove_virtual_rows(module, info)
        _trim_optimizer_state(module)
        valid_after = _score(trainer, module, eval_dm, backtrack_on)
    accepted = bool(not math.isnan(valid_after) and valid_after > valid_before)
    if not accepted:
        module.load_state_dict(snapshot)
        if opt_state is not None and hasattr(module, "load_optimizer_state_dict"):
            module.load_optimizer_state_dict(opt_state)
    return {"accepted": accepted, "valid_before": float(valid_before), "valid_after": float(valid_after),
            "seconds": time.perf_counter() - start, "split": backtrack_on}
