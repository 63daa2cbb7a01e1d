"""Federated folder layouts: reading and writing clients' named triples.

:func:`load_federated_folder` (FedE's ``client_<k>/``), :func:`load_fedlu_folder` (FedLU's
``<k>/``), :func:`write_fedlu_folder`, and :func:`load_federated`, which picks a layout or a
partitioner. The layouts are described in docs/datasets.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .federated import FederatedKG, _select, present_ids
from .kg import SPLITS, KGFormatError, clean_splits, training_triples
from .kg_io import _to_ids, read_named_triples, write_named_client
from .loading import load_kg
from .partition import PARTITIONERS


def _load_named_clients(
    files: list[dict[str, Path]], name: str
) -> FederatedKG:
    """Clients given as named-triple files; global ids = names sorted (entities, relations)."""
    named = []
    for client_files in files:
        parsed = {}
        for s, path in client_files.items():
            h, r, t, _ = read_named_triples(path)
            if not h:
                raise KGFormatError(f"{path}: split '{s}' has no triples")
            parsed[s] = (h, r, t)
        named.append(parsed)
    # provisional ids (first appearance) so the policy can run on tensors
    ent: dict[str, None] = {}
    rel: dict[str, None] = {}
    for parsed in named:
        for h, r, t in parsed.values():
            ent.update(dict.fromkeys(h))
            ent.update(dict.fromkeys(t))
            rel.update(dict.fromkeys(r))
    e2p = {n: i for i, n in enumerate(ent)}
    r2p = {n: i for i, n in enumerate(rel)}
    ent_names, rel_names = list(ent), list(rel)
    cleaned = []
    for c, parsed in enumerate(named):
        prov = {s: _to_ids(h, r, t, e2p, r2p) for s, (h, r, t) in parsed.items()}
        splits, _ = clean_splits(prov, len(e2p), len(r2p), source=f"{name}/client_{c}")
        cleaned.append(splits)
    # global vocabulary: every entity / relation of some client's training triples, sorted by name
    trained = [training_triples(s) for s in cleaned]
    used_e = present_ids(torch.cat([t[:, [0, 2]].reshape(-1) for t in trained]), len(e2p))
    used_r = present_ids(torch.cat([t[:, 1] for t in trained]), len(r2p))
    e_sorted = sorted(_select(ent_names, used_e))
    r_sorted = sorted(_select(rel_names, used_r))
    e_map = torch.full((len(e2p),), -1, dtype=torch.long)
    e_map[torch.tensor([e2p[n] for n in e_sorted], dtype=torch.long)] = torch.arange(len(e_sorted))
    r_map = torch.full((len(r2p),), -1, dtype=torch.long)
    r_map[torch.tensor([r2p[n] for n in r_sorted], dtype=torch.long)] = torch.arange(len(r_sorted))
    client_splits = [{s: torch.stack([e_map[t[:, 0]], r_map[t[:, 1]], e_map[t[:, 2]]], 1)
                      for s, t in splits.items()} for splits in cleaned]
    return FederatedKG.from_global_splits(client_splits, len(e_sorted), len(r_sorted),
                                          e_sorted, r_sorted, name=name, clean=False)


def _numbered_dirs(folder: Path, pattern: str) -> list[Path]:
    found = []
    for d in folder.iterdir():
        m = re.fullmatch(pattern, d.name)
        if d.is_dir() and m:
            found.append((int(m.group(1)), d))
    found.sort()
    if not found:
        raise FileNotFoundError(f"no client folders matching {pattern!r} in {folder}")
    ids = [k for k, _ in found]
    if ids != list(range(len(ids))):
        raise KGFormatError(f"{folder}: client folders must be numbered 0..C-1, found {ids}")
    return [d for _, d in found]


def _find(folder: Path, stem: str, exts: tuple[str, ...]) -> Path:
    for ext in exts:
        if (folder / f"{stem}{ext}").is_file():
            return folder / f"{stem}{ext}"
    raise FileNotFoundError(f"no {stem}{'|'.join(exts)} in {folder}")


def load_federated_folder(path: str | Path) -> FederatedKG:
    """Load FedE-style client splits ``client_<k>/{train,valid,test}.tsv`` (``.txt`` accepted).

    Global entity / relation ids are the names of all clients' train entities / relations
    in sorted order; the input policy is applied per client.
    """
    folder = Path(path)
    dirs = _numbered_dirs(folder, r"client_(\d+)")
    files = [{s: _find(d, s, (".tsv", ".txt")) for s in SPLITS} for d in dirs]
    return _load_named_clients(files, folder.resolve().name)


def load_fedlu_folder(path: str | Path) -> FederatedKG:
    """Load FedLU's layout: client splits ``<k>/{train,valid,test}.txt`` (``.tsv`` accepted).

    Every other ``<name>.txt`` / ``.tsv`` of a client folder is an extra split of that client
    (FedLU's own files have ``unlearn.txt``, its forgetting set), whose triples count among
    its training triples (:func:`~.kg.training_triples`): ids as in
    :func:`load_federated_folder` over them, so a folder whose ``train`` lacks some triples
    that an extra split holds loads with the same vocabulary, ids and evaluation splits.
    """
    folder = Path(path)
    dirs = _numbered_dirs(folder, r"(\d+)")
    files = []
    for d in dirs:
        f = {s: _find(d, s, (".txt", ".tsv")) for s in SPLITS}
        extra = sorted({p.stem for p in d.iterdir() if p.is_file() and p.suffix in (".txt", ".tsv")} - set(SPLITS))
        f.update({s: _find(d, s, (".txt", ".tsv")) for s in extra})
        files.append(f)
    return _load_named_clients(files, folder.resolve().name)


def write_fedlu_folder(fed: FederatedKG, path: str | Path,
                       extra: dict[str, list[Tensor]] | None = None) -> Path:
    """Write ``fed`` in FedLU's layout, the one the official FedLU code reads.

    Per client ``k``: ``<path>/<k>/entities.dict`` and ``relations.dict`` (``local id<TAB>name``,
    local ids in increasing global id) and ``<split>.txt`` (``head<TAB>relation<TAB>tail``
    names) for every split the client has, plus one file per entry of ``extra`` (split name
    -> one local-id triple tensor per client, e.g. FedLU's ``{"unlearn": forget_sets}``).
    :func:`load_fedlu_folder` reads it back. Existing files are overwritten.

    Raises:
        ValueError: ``fed`` has no names, a name contains whitespace (FedLU's reader splits
            lines on any whitespace), or ``extra`` has the wrong number of clients.
    """
    if fed.entity_names is None or fed.relation_names is None:
        raise ValueError("cannot write a federation without entity and relation names")
    for kind, names in (("entity", fed.entity_names), ("relation", fed.relation_names)):
        bad = next((n for n in names if not n or len(n.split()) != 1), None)
        if bad is not None:
            raise ValueError(f"{kind} name {bad!r} is empty or has whitespace; FedLU's files cannot hold it")
    extra = extra or {}
    for split, per_client in extra.items():
        if len(per_client) != fed.num_clients:
            raise ValueError(f"extra split {split!r} has {len(per_client)} clients, the federation {fed.num_clients}")
    root = Path(path)
    ent_all = np.asarray(fed.entity_names, dtype=object)
    rel_all = np.asarray(fed.relation_names, dtype=object)
    for c, kg in enumerate(fed.clients):
        out = root / str(c)
        out.mkdir(parents=True, exist_ok=True)
        splits = {s: kg.triples(s) for s in kg.split_names}
        splits.update({s: per_client[c] for s, per_client in extra.items()})
        write_named_client(out, ent_all[fed.entity_index[c].numpy()], rel_all[fed.relation_index[c].numpy()], splits)
    return root


def load_federated(name_or_path: str | Path, num_clients: int = 3, seed: int = 12345,
                   partition: str = "relation", **kwargs) -> FederatedKG:
    """Dispatch: a folder with ``client_0/`` -> :func:`load_federated_folder`; with ``0/``
    -> :func:`load_fedlu_folder`; otherwise one KG split by ``partition`` (``"relation"``:
    :func:`partition_by_relation`, ``"random"``: :func:`partition_randomly`, ``"clustered"``:
    :func:`partition_by_clusters`; ``kwargs`` go to the partitioner)."""
    folder = Path(name_or_path)
    if folder.is_dir() and (folder / "client_0").is_dir():
        return load_federated_folder(folder)
    if folder.is_dir() and (folder / "0").is_dir():
        return load_fedlu_folder(folder)
    if partition not in PARTITIONERS:
        raise ValueError(f"unknown partition {partition!r}; valid: {', '.join(PARTITIONERS)}")
    return PARTITIONERS[partition](load_kg(name_or_path), num_clients, seed=seed, **kwargs)
