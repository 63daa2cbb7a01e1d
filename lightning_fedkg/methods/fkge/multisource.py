"""Multi-source KGs: several standalone KGs whose entities partly overlap (FKGE's setting).

Every source is a plain :class:`~lightning_fedkg.data.kg.KnowledgeGraph` with its own ids
and names; two sources share an entity exactly when they share its name (the alignment key;
there is no global id table). :func:`split_into_sources` cuts one KG by relation (90/5/5
per source), :func:`load_multisource_folder` reads one sub-folder per KG,
:func:`write_multisource_folder` writes them and :func:`aligned_pairs` intersects names.
See docs/methods/fkge.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lightning_fedkg.data.partition import _federate, _pooled_triples
from lightning_fedkg.data.kg import SPLITS, KnowledgeGraph, first_occurrence
from lightning_fedkg.data.kg_io import BUNDLED_DATASETS, load_openke, load_triples_folder
from lightning_fedkg.data.loading import load_kg

__all__ = [
    "split_into_sources",
    "aligned_pairs",
    "load_multisource_folder",
    "write_multisource_folder",
    "load_multisource",
    "multisource_stats",
]


def split_into_sources(
    kg: KnowledgeGraph,
    num_sources: int,
    seed: int = 12345,
    valid_frac: float = 0.05,
    test_frac: float = 0.05,
    shared_relations: float = 0.0,
) -> list[KnowledgeGraph]:
    """Cut one named KG into ``num_sources`` standalone KGs with overlapping entities.

    Procedure (FedE's relation partition, Chen et al. 2021 §3.1, with FKGE's per-KG split
    90:5:5, Peng et al. 2021 §4.1 = OpenKE's default):

    1. pool ``kg``'s train + valid + test triples (as loaded, i.e. after the loader's input
       policy; a triple in several splits is used once), as ``partition_by_relation`` does;
    2. shuffle the relations that occur; with ``shared_relations = f > 0`` the first
       ``round(f * R)`` of them are *shared*: their triples are permuted and dealt to the
       sources in near-equal contiguous parts, so their names occur in several sources (for
       FKGE's relation-alignment ablation); the other relations are cut into ``num_sources``
       contiguous groups of near-equal size and each source gets all triples of its group;
    3. per source, permute its ``n`` triples and take ``round(valid_frac * n)`` valid and
       ``round(test_frac * n)`` test triples with
       :func:`~lightning_fedkg.data.partition.resample_split` (the FedE/FedLU rejection rule:
       a triple goes to valid/test only if its head, tail and relation still occur in the
       remaining triples), the rest is train.

    Input policy: the rejection rule of step 3 is used, not :func:`clean_splits`'s dropping,
    so no triple is lost: every pooled triple is in exactly one split of exactly one source,
    and every valid/test entity and relation occurs in that source's train split (each
    source's ``removed`` is all zeros). What ``kg``'s own loader dropped (``kg.removed``) is
    not in the pool.

    Randomness: one ``torch.Generator().manual_seed(seed)``, drawn in a fixed order
    (relation permutation, the shared triples' permutation if any, then one triple
    permutation per source), so the output is a function of the arguments. With
    ``shared_relations=0`` the sources hold exactly the triples of
    ``partition_by_relation(kg, num_sources, seed, valid_frac, test_frac)``'s clients.

    Each source is named ``f"{kg.name}-src{k}"``; its local ids number its train entities
    (relations) in order of first appearance in train, head before tail — the ids
    :func:`~lightning_fedkg.data.kg_io.load_triples_folder` assigns to the same files, so
    :func:`write_multisource_folder` + :func:`load_multisource_folder` round-trip exactly.

    Raises:
        ValueError: ``kg`` has no entity or relation names; ``num_sources < 1``; fewer
            (unshared) relations than sources; bad fractions; too few eligible valid/test
            triples in a source.
    """
    if kg.entity_names is None or kg.relation_names is None:
        raise ValueError(f"{kg.name}: split_into_sources needs entity and relation names "
                         "(they are the alignment key)")
    if not 0.0 <= shared_relations < 1.0:
        raise ValueError(f"shared_relations must be in [0, 1), got {shared_relations}")
    if valid_frac < 0 or test_frac < 0 or valid_frac + test_frac >= 1:
        raise ValueError(f"need valid_frac, test_frac >= 0 and valid_frac + test_frac < 1, "
                         f"got {valid_frac}, {test_frac}")
    pool = _pooled_triples(kg, num_sources)  # checks num_sources >= 1
    relations = torch.unique(pool[:, 1])
    num_shared = int(round(shared_relations * relations.numel()))
    if relations.numel() - num_shared < num_sources:
        raise ValueError(f"{kg.name}: {relations.numel()} relations ({num_shared} shared) cannot be "
                         f"split among {num_sources} sources; use fewer sources")
    gen = torch.Generator().manual_seed(seed)
    rel_perm = relations[torch.randperm(relations.numel(), generator=gen)]
    shared, own = rel_perm[:num_shared], rel_perm[num_shared:]
    groups = [pool[torch.isin(pool[:, 1], group)] for group in torch.tensor_split(own, num_sources)]
    if num_shared:
        rows = pool[torch.isin(pool[:, 1], shared)]
        parts = torch.tensor_split(rows[torch.randperm(rows.shape[0], generator=gen)], num_sources)
        groups = [torch.cat([g, p]) for g, p in zip(groups, parts)]
    fed = _federate(kg, groups, gen, valid_frac, test_frac, kg.name)
    return [_first_appearance_ids(client, f"{kg.name}-src{k}") for k, client in enumerate(fed.clients)]


def _first_appearance_ids(kg: KnowledgeGraph, name: str) -> KnowledgeGraph:
    """``kg`` renumbered: entities / relations in order of first appearance in train.

    Requires every entity and relation of every split to occur in train (true for
    :func:`split_into_sources`'s clients).
    """
    train = kg.triples("train")
    flat = train[:, [0, 2]].reshape(-1)
    ent_order = flat[first_occurrence(flat)]
    rel_order = train[first_occurrence(train[:, 1]), 1]
    if ent_order.numel() != kg.num_entities or rel_order.numel() != kg.num_relations:
        raise ValueError(f"{name}: some entity or relation does not occur in train")
    e_new = torch.empty(kg.num_entities, dtype=torch.long)
    e_new[ent_order] = torch.arange(kg.num_entities)
    r_new = torch.empty(kg.num_relations, dtype=torch.long)
    r_new[rel_order] = torch.arange(kg.num_relations)
    splits = {s: torch.stack([e_new[t[:, 0]], r_new[t[:, 1]], e_new[t[:, 2]]], 1)
              for s in kg.split_names for t in (kg.triples(s),)}
    out = KnowledgeGraph(splits, kg.num_entities, kg.num_relations,
                         [kg.entity_names[i] for i in ent_order.tolist()],
                         [kg.relation_names[i] for i in rel_order.tolist()], name=name)
    out.removed = {s: {"duplicates": 0, "unseen": 0} for s in out.split_names}
    return out


def aligned_pairs(a: KnowledgeGraph, b: KnowledgeGraph, kind: str = "entity") -> Tensor:
    """``LongTensor[k, 2]``: (local id in ``a``, local id in ``b``) of every shared name.

    ``kind`` is ``"entity"`` or ``"relation"``. Rows are sorted by the id in ``a``. The plain
    name intersection, for tests and statistics; a federation aligns by keyed hashes
    (:mod:`lightning_fedkg.federated.alignment`), never by exchanging names.
    """
    if kind not in ("entity", "relation"):
        raise ValueError(f"kind must be 'entity' or 'relation', got {kind!r}")
    names_a = a.entity_names if kind == "entity" else a.relation_names
    names_b = b.entity_names if kind == "entity" else b.relation_names
    if names_a is None or names_b is None:
        raise ValueError(f"aligned_pairs needs {kind} names in both {a.name!r} and {b.name!r}")
    if not names_a or not names_b:
        return torch.zeros(0, 2, dtype=torch.long)
    _, ia, ib = np.intersect1d(np.asarray(names_a, dtype=str), np.asarray(names_b, dtype=str),
                               assume_unique=True, return_indices=True)
    order = np.argsort(ia, kind="stable")
    return torch.from_numpy(np.stack([ia[order], ib[order]], 1).astype(np.int64))


# --------------------------------------------------------------------------------------
# Folders of aligned KGs
# --------------------------------------------------------------------------------------


def _is_kg_folder(folder: Path) -> bool:
    """A folder :func:`load_kg` reads: OpenKE ids, or named train triples (also in ``raw/``)."""
    if (folder / "entity2id.txt").is_file():
        return True
    return any((sub / f"train{ext}").is_file() for sub in (folder, folder / "raw")
               for ext in (".txt", ".tsv"))


def load_multisource_folder(path: str | Path) -> list[KnowledgeGraph]:
    """Load a folder of aligned KGs, one sub-folder per KG, in sorted sub-folder order.

    Layout::

        <path>/<kg name>/train.txt     head<TAB>relation<TAB>tail, names (also .tsv, or raw/)
        <path>/<kg name>/valid.txt
        <path>/<kg name>/test.txt
        <path>/<kg name>/              or an OpenKE folder: entity2id.txt, relation2id.txt,
                                       {train,valid,test}2id.txt

    Each sub-folder is read by :func:`~lightning_fedkg.data.kg_io.load_triples_folder` (named
    triples) or :func:`~lightning_fedkg.data.kg_io.load_openke` (when it has ``entity2id.txt``),
    with the project's input policy (malformed line -> ``KGFormatError`` naming file:line;
    eval triples with entities / relations unseen in that KG's train dropped and counted in
    ``kg.removed``). A KG's name is its folder name. Entities (relations) of two KGs are
    aligned exactly when their names are equal: the name strings of the triple files, or for
    OpenKE the strings of ``entity2id.txt`` / ``relation2id.txt`` (OpenKE's integer ids are
    local to each KG and never compared). To align the paper's LOD KGs, write each with the
    shared entities under one common name (e.g. the URI). Files and other entries directly
    in ``path`` (``README.md``, ``stats.json``) and hidden folders are ignored.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a directory")
    subdirs = sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not subdirs:
        raise FileNotFoundError(f"no KG sub-folders in {folder} (expected <name>/train.txt, ...)")
    sources = []
    for d in subdirs:
        if (d / "entity2id.txt").is_file():
            sources.append(load_openke(d))
        elif _is_kg_folder(d):
            sources.append(load_triples_folder(d))
        else:
            raise FileNotFoundError(f"{d}: not a KG folder (no train.txt, train.tsv, raw/train.txt "
                                    "or entity2id.txt)")
    for kg, d in zip(sources, subdirs):
        kg.name = d.name
    return sources


def _check_name(name: str, what: str) -> None:
    if not name or any(c in name for c in "\t\n\r") or name != name.strip():
        raise ValueError(f"{what} {name!r} cannot be written as a named triple field "
                         "(empty, surrounding whitespace, tab or newline)")


def write_multisource_folder(sources: list[KnowledgeGraph], path: str | Path) -> Path:
    """Write sources as ``<path>/<kg.name>/{train,valid,test}.txt`` (tab-separated names).

    The layout :func:`load_multisource_folder` reads. Only ``train``, ``valid`` and ``test``
    are written, one triple a line in split order. Existing files are overwritten.

    Raises:
        ValueError: a KG without names; duplicate, empty or path-like KG names; a name with a
            tab, newline or surrounding whitespace (it would not read back).
    """
    root = Path(path)
    names = [kg.name for kg in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"source names must be distinct, got {names}")
    for kg in sources:
        if not kg.name or kg.name.startswith(".") or "/" in kg.name or "\\" in kg.name:
            raise ValueError(f"source name {kg.name!r} is not a folder name")
        if kg.entity_names is None or kg.relation_names is None:
            raise ValueError(f"{kg.name}: cannot write a KG without entity and relation names")
        for n in kg.entity_names:
            _check_name(n, f"{kg.name}: entity")
        for n in kg.relation_names:
            _check_name(n, f"{kg.name}: relation")
    for kg in sources:
        out = root / kg.name
        out.mkdir(parents=True, exist_ok=True)
        ent = np.asarray(kg.entity_names, dtype=object)
        rel = np.asarray(kg.relation_names, dtype=object)
        for s in SPLITS:
            t = kg.triples(s).numpy()
            lines = [f"{h}\t{r}\t{o}\n" for h, r, o in zip(ent[t[:, 0]], rel[t[:, 1]], ent[t[:, 2]])]
            (out / f"{s}.txt").write_text("".join(lines), encoding="utf-8")
    return root


def load_multisource(name_or_path: str | Path, num_sources: int = 3, seed: int = 12345,
                     fmt: str = "auto", **kwargs) -> list[KnowledgeGraph]:
    """Dispatch: a folder of KG sub-folders -> :func:`load_multisource_folder`; otherwise
    ``split_into_sources(load_kg(name_or_path, fmt), num_sources, seed, **kwargs)``.

    So ``load_multisource("umls", 3, seed)`` is the quick-start federation of three UMLS
    sources (a bundled KG), and ``load_multisource("runs/fb3")`` reads what
    ``scripts/tools/make_multisource.py`` wrote.
    """
    folder = Path(name_or_path)
    bundled = isinstance(name_or_path, str) and name_or_path.lower() in BUNDLED_DATASETS
    if not bundled and folder.is_dir() and not _is_kg_folder(folder):
        return load_multisource_folder(folder)
    return split_into_sources(load_kg(name_or_path, fmt=fmt), num_sources, seed=seed, **kwargs)


def multisource_stats(sources: list[KnowledgeGraph]) -> dict:
    """``{"sources": [kg.stats(), ...], "shared_entities": [[k_ij]], "shared_relations": [[..]]}``.

    ``shared_*[i][j]`` = number of names sources ``i`` and ``j`` share (the diagonal is the
    source's own count).
    """
    n = len(sources)
    shared = {kind: [[0] * n for _ in range(n)] for kind in ("entity", "relation")}
    for i in range(n):
        for j in range(i, n):
            for kind in shared:
                k = int(aligned_pairs(sources[i], sources[j], kind).shape[0])
                shared[kind][i][j] = shared[kind][j][i] = k
    return {"sources": [kg.stats() for kg in sources],
            "shared_entities": shared["entity"], "shared_relations": shared["relation"]}
