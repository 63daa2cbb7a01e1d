"""One organisation's data folder: what a SuperNode is given, and nothing of the others'.

A client folder holds ``client.json`` (its name), ``entities.dict`` / ``relations.dict``
(local id<TAB>name) and ``train.txt``, ``valid.txt``, ``test.txt`` of named triples.
:func:`write_client_folders` writes them in the in-process id order, so a Flower run can
match an in-process one number for number. :func:`data_digest` is the folder's keyed hash,
the client's registration. See docs/deployment.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a folder is loaded, not by a ClientApp that forwards
    from lightning_fedkg.data.kg import KnowledgeGraph

__all__ = ["CLIENT_FILE", "write_client_folders", "load_client_folder", "data_digest", "read_key_file"]

CLIENT_FILE = "client.json"


def write_client_folders(cfg, root: str | Path) -> list[Path]:
    """One folder per client of the federation ``cfg.data`` describes, ``root/client_<k>``.

    Reused when complete (a ``COMPLETE`` marker with the data settings it was written for).
    """
    from lightning_fedkg.data.kg_io import write_named_client
    from lightning_fedkg.config import ConfigError
    from lightning_fedkg.federated.party import _item_names, load_federated_kg
    from lightning_fedkg.federated.strategy import client_name

    if cfg.data.client_entities != "own":
        raise ConfigError("data.client_entities=all runs in process or on Ray: a Flower client loads the "
                          "entities of its own folder; leave data.client_entities=own")
    root = Path(root)
    stamp = json.dumps({"name": cfg.data.name, "format": cfg.data.format, "num_clients": cfg.data.num_clients,
                        "partition": cfg.data.partition, "partition_seed": cfg.data.partition_seed}, sort_keys=True)
    done = root / "COMPLETE"
    if done.is_file() and done.read_text() == stamp:
        return sorted((d for d in root.iterdir() if (d / CLIENT_FILE).is_file()), key=lambda d: int(d.name.split("_")[-1]))
    fkg = load_federated_kg(cfg)
    folders = []
    for k, kg in enumerate(fkg.clients):
        folder = root / client_name(k)
        names = _item_names(kg, fkg, k)
        write_named_client(folder, names["entity"], names["relation"], {s: kg.triples(s) for s in kg.split_names})
        (folder / CLIENT_FILE).write_text(json.dumps({"name": client_name(k)}))
        folders.append(folder)
    done.write_text(stamp)
    return folders


def _read_dict(path: Path) -> list[str]:
    from lightning_fedkg.data.kg import KGFormatError

    names = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip().isdigit() or int(fields[0]) != len(names):
            raise KGFormatError(f"{path}:{line_no}: expected '<id><TAB><name>' with ids 0, 1, 2, ... in order, "
                                f"got {line[:120]!r}")
        names.append(fields[1])
    return names


def load_client_folder(folder: str | Path) -> tuple[str, "KnowledgeGraph", dict[str, list[str]]]:
    """``(client name, KG, {"entity": names, "relation": names})`` of a client folder.

    Ids follow ``entities.dict`` / ``relations.dict``; a triple naming something they lack is
    an error with its file and line.
    """
    from lightning_fedkg.data.kg import KGFormatError, KnowledgeGraph
    from lightning_fedkg.data.kg_io import _to_ids, read_named_triples

    folder = Path(folder)
    if not (folder / CLIENT_FILE).is_file():
        raise FileNotFoundError(f"{folder} is not a client data folder (no {CLIENT_FILE}); "
                                f"write one with `fedkg flower split`")
    name = json.loads((folder / CLIENT_FILE).read_text())["name"]
    entities, relations = _read_dict(folder / "entities.dict"), _read_dict(folder / "relations.dict")
    e2i = {n: i for i, n in enumerate(entities)}
    r2i = {n: i for i, n in enumerate(relations)}
    splits = {}
    for path in sorted(folder.glob("*.txt")):
        heads, rels, tails, lines = read_named_triples(path)
        try:
            splits[path.stem] = _to_ids(heads, rels, tails, e2i, r2i)
        except KeyError:  # name the first unknown entry's file and line
            for column, vocab, kind in ((heads, e2i, "entity"), (rels, r2i, "relation"), (tails, e2i, "entity")):
                missing = next((k for k, n in enumerate(column) if n not in vocab), None)
                if missing is not None:
                    raise KGFormatError(f"{path}:{lines[missing]}: {kind} {column[missing]!r} is not in "
                                        f"{'entities' if kind == 'entity' else 'relations'}.dict") from None
            raise
    kg = KnowledgeGraph(splits, len(entities), len(relations), entities, relations, name=name)
    return name, kg, {"entity": entities, "relation": relations}


def data_digest(folder: str | Path, key: bytes) -> str:
    """Keyed hash (hex) of every file of a client folder, names and contents, in name order."""
    mac = hmac.new(key, b"lightning_fedkg-client-data", hashlib.sha256)
    for path in sorted(Path(folder).iterdir()):
        if path.is_file():
            mac.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return mac.hexdigest()


def read_key_file(path: str | Path) -> str:
    """The federation secret in ``path`` (one line; never passed on a command line, where
    ``ps`` shows it). Raises ``ValueError`` for a missing or empty file, and a ConfigError
    (a ValueError) for one with any group or other permission bit."""
    from lightning_fedkg.private_files import check_private_file

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"federation key file {path} does not exist")
    check_private_file(path, "the federation key file")
    secret = path.read_text().strip()
    if not secret:
        raise ValueError(f"federation key file {path} is empty")
    return secret
