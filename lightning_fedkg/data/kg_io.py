"""Readers of the on-disk KG formats: named triples, OpenKE folders and the bundled KGs.

Each returns a :class:`~.kg.KnowledgeGraph` after the input policy
(:func:`~.kg.clean_splits`); a malformed line is a :class:`KGFormatError` naming
``file:line``. Formats: docs/datasets.md.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from .kg import SPLITS, KGFormatError, KnowledgeGraph, clean_splits

logger = logging.getLogger("lightning_fedkg")

BUNDLED_DATASETS: tuple[str, ...] = ("umls", "nations", "kinship")
BUNDLED_ROOT = Path(__file__).resolve().parent / "bundled"

# --------------------------------------------------------------------------------------
# Parsing helpers
# --------------------------------------------------------------------------------------


def _read_lines(path: Path) -> list[str]:
    # Text mode turns \r\n into \n (the FB15k-237 files use \r\n).
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


def read_named_triples(path: str | Path, sep: str | None = "auto") -> tuple[list[str], list[str], list[str], list[int]]:
    """Parse ``head<SEP>relation<SEP>tail`` lines; blank lines are skipped.

    ``sep="auto"`` splits on tabs if the file contains a tab, else on runs of whitespace;
    ``"tab"`` / ``"whitespace"`` force one. Returns heads, relations, tails and the 1-based
    line number of each triple. Raises :class:`KGFormatError` (``file:line``) on a line
    that does not have exactly three non-empty fields.
    """
    path = Path(path)
    lines = _read_lines(path)
    if sep == "auto":
        splitter = "\t" if any("\t" in ln for ln in lines) else None
    elif sep in ("tab", "\t"):
        splitter = "\t"
    elif sep in ("whitespace", None):
        splitter = None
    else:
        raise ValueError(f"sep must be 'auto', 'tab' or 'whitespace', got {sep!r}")
    # Only flat lists of strings are built: a list of 300k small lists would trigger the
    # cyclic garbage collector over and over and cost ~10x more.
    stripped = [ln.strip() for ln in lines]
    numbers = [i + 1 for i, ln in enumerate(stripped) if ln]
    kept = [stripped[i - 1] for i in numbers] if len(numbers) < len(stripped) else stripped
    if splitter == "\t":
        bad = [k for k, ln in enumerate(kept) if ln.count("\t") != 2 or "\t\t" in ln]
    else:
        bad = [k for k, ln in enumerate(kept) if len(ln.split()) != 3]
    if bad:
        k = bad[0]
        kind = "tab" if splitter else "whitespace"
        got = len(kept[k].split(splitter))
        raise KGFormatError(
            f"{path}:{numbers[k]}: expected 3 non-empty {kind}-separated fields "
            f"(head, relation, tail), got {got}: {kept[k][:120]!r}"
        )
    tokens = ("\t".join(kept).split("\t") if splitter == "\t" else " ".join(kept).split())
    return tokens[0::3], tokens[1::3], tokens[2::3], numbers


def _first_appearance_vocab(named: Iterable[tuple[list[str], list[str], list[str]]]) -> tuple[dict[str, int], dict[str, int]]:
    """Entity / relation ids in order of first appearance (head before tail, file by file)."""
    ent: dict[str, None] = {}
    rel: dict[str, None] = {}
    for heads, rels, tails in named:
        inter: list[str] = [""] * (2 * len(heads))
        inter[0::2] = heads
        inter[1::2] = tails
        ent.update(dict.fromkeys(inter))
        rel.update(dict.fromkeys(rels))
    return {n: i for i, n in enumerate(ent)}, {n: i for i, n in enumerate(rel)}


def _to_ids(heads: list[str], rels: list[str], tails: list[str],
            e2id: dict[str, int], r2id: dict[str, int]) -> Tensor:
    # Ids go straight into an int64 array: no list of Python ints per column, and no
    # torch.tensor over nested lists (2 s of a 3M-triple load).
    out = np.empty((len(heads), 3), dtype=np.int64)
    for column, (names, vocab) in enumerate(((heads, e2id), (rels, r2id), (tails, e2id))):
        out[:, column] = np.fromiter(map(vocab.__getitem__, names), dtype=np.int64, count=len(names))
    return torch.from_numpy(out)


def _split_file(folder: Path, split: str) -> Path:
    tried = []
    for sub in (folder, folder / "raw"):
        for ext in (".txt", ".tsv"):
            p = sub / f"{split}{ext}"
            tried.append(str(p))
            if p.is_file():
                return p
    raise FileNotFoundError(f"no '{split}' split file; tried {tried}")


def _dataset_name(folder: Path) -> str:
    folder = folder.resolve()
    return folder.parent.name if folder.name == "raw" else folder.name


def _from_named_files(files: dict[str, Path], name: str, sep: str | None = "auto") -> KnowledgeGraph:
    named = {}
    for split, path in files.items():
        named[split] = read_named_triples(path, sep)[:3]
        if not named[split][0]:
            raise KGFormatError(f"{path}: split '{split}' has no triples")
    e2id, r2id = _first_appearance_vocab(named.values())
    raw = {s: _to_ids(*named[s], e2id, r2id) for s in named}
    splits, removed = clean_splits(raw, len(e2id), len(r2id), source=name)
    kg = KnowledgeGraph(splits, len(e2id), len(r2id), list(e2id), list(r2id), name=name)
    kg.removed = removed
    return kg


# --------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------


def load_triples_folder(path: str | Path, fmt: str = "auto") -> KnowledgeGraph:
    """Load named triples from ``{train,valid,test}.{txt,tsv}`` in ``path`` or ``path/raw``.

    Each line is ``head relation tail``; ``fmt`` picks the field separator (``"auto"``:
    tabs if the file has any, else whitespace; ``"tab"``; ``"whitespace"``). Ids follow the
    order of first appearance, train -> valid -> test, head before tail (the order PyG's
    ``FB15k_237`` uses), so ids agree with :func:`load_pyg` on the same files.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a directory")
    files = {s: _split_file(folder, s) for s in SPLITS}
    return _from_named_files(files, _dataset_name(folder), sep=fmt)


def _read_counted(path: Path, ncols: int) -> tuple[list, list[int]]:
    """Rows of an OpenKE file whose first line is the row count.

    ``ncols=2``: ``(names, id strings)``; ``ncols=3``: the flat list of id tokens.
    """
    lines = _read_lines(path)
    header = lines[0].strip() if lines else ""
    if not header.isdigit():
        raise KGFormatError(f"{path}:1: expected the number of rows, got {header[:80]!r}")
    numbers = [i + 1 for i, ln in enumerate(lines) if i > 0 and ln.strip()]
    kept = [lines[i - 1].strip() for i in numbers]
    if ncols == 2:  # "name<TAB>id": the name may contain spaces, the id is the last token
        bad = [k for k, ln in enumerate(kept)
               if len(parts := ln.rsplit(None, 1)) != 2 or not parts[1].isdigit()]
    else:
        bad = [k for k, ln in enumerate(kept)
               if len(parts := ln.split()) != 3 or not all(x.isdigit() for x in parts)]
    if bad:
        k = bad[0]
        raise KGFormatError(f"{path}:{numbers[k]}: expected {ncols} fields"
                            f"{' (integer ids)' if ncols == 3 else ' (name, integer id)'}: "
                            f"{kept[k][:120]!r}")
    if ncols == 2:
        rows = ([ln.rsplit(None, 1)[0] for ln in kept], [ln.rsplit(None, 1)[1] for ln in kept])
    else:
        rows = " ".join(kept).split()
    if len(kept) != int(header):
        raise KGFormatError(f"{path}:1: header says {int(header)} rows, found {len(kept)}")
    return rows, numbers


def _read_openke_vocab(path: Path) -> list[str]:
    (names_in, id_tokens), _ = _read_counted(path, 2)
    ids = np.array(list(map(int, id_tokens)), dtype=np.int64)
    if not np.array_equal(np.sort(ids), np.arange(len(ids))):
        raise KGFormatError(f"{path}:1: ids are not a permutation of 0..{len(ids) - 1}")
    names = [""] * len(ids)
    for name, i in zip(names_in, ids.tolist()):
        names[i] = name
    if len(set(names)) != len(names):
        raise KGFormatError(f"{path}:1: duplicate names")
    return names


def load_openke(path: str | Path) -> KnowledgeGraph:
    """Load an OpenKE benchmark folder.

    Files: ``entity2id.txt`` and ``relation2id.txt`` (first line a count, then
    ``name<TAB>id``) and ``{train,valid,test}2id.txt`` (first line a count, then
    ``head tail relation`` — note OpenKE's column order). The ids are kept as given.
    """
    folder = Path(path)
    ents = _read_openke_vocab(folder / "entity2id.txt")
    rels = _read_openke_vocab(folder / "relation2id.txt")
    raw = {}
    for split in SPLITS:
        file = folder / f"{split}2id.txt"
        rows, numbers = _read_counted(file, 3)
        if not rows:
            raise KGFormatError(f"{file}: split '{split}' has no triples")
        ids = torch.tensor(list(map(int, rows)), dtype=torch.long).view(-1, 3)
        arr = ids[:, [0, 2, 1]]  # OpenKE (h, t, r) -> (h, r, t)
        bad = (arr[:, [0, 2]] >= len(ents)).any(1) | (arr[:, 1] >= len(rels))
        if bad.any():
            k = int(bad.nonzero()[0])
            raise KGFormatError(f"{file}:{numbers[k]}: id out of range "
                                f"({len(ents)} entities, {len(rels)} relations)")
        raw[split] = arr.contiguous()
    name = folder.resolve().name
    splits, removed = clean_splits(raw, len(ents), len(rels), source=name)
    kg = KnowledgeGraph(splits, len(ents), len(rels), ents, rels, name=name)
    kg.removed = removed
    return kg


def load_bundled(name: str) -> KnowledgeGraph:
    """One of the :data:`BUNDLED_DATASETS` (case-insensitive), read from the package's files."""
    key = name.lower()
    if key not in BUNDLED_DATASETS:
        raise ValueError(f"{name!r} is not a bundled dataset {BUNDLED_DATASETS}")
    folder = BUNDLED_ROOT / key
    return _from_named_files({s: folder / f"{s}.txt" for s in SPLITS}, key)


def names_to_ids(kg: KnowledgeGraph, triples: Sequence[tuple[str, str, str]]) -> Tensor:
    """Map named triples to a ``LongTensor[E, 3]`` with ``kg``'s vocabularies."""
    if not triples:
        return torch.zeros(0, 3, dtype=torch.long)
    h, r, t = zip(*triples)
    return _to_ids(list(h), list(r), list(t), kg.entity_to_id, kg.relation_to_id)


def write_named_client(folder: str | Path, entity_names, relation_names, splits: dict[str, Tensor]) -> None:
    """One client's ``entities.dict`` and ``relations.dict`` (``local id<TAB>name``) and its
    named splits (:func:`write_named_splits`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in (("entities.dict", entity_names), ("relations.dict", relation_names)):
        (folder / name).write_text("".join(f"{i}\t{n}\n" for i, n in enumerate(table)), encoding="utf-8")
    write_named_splits(folder, entity_names, relation_names, splits)


def write_named_splits(folder: str | Path, entity_names, relation_names, splits: dict[str, Tensor]) -> None:
    """``<folder>/<split>.txt`` of ``head<TAB>relation<TAB>tail`` names for each id-triple
    tensor of ``splits``; ``entity_names[i]`` / ``relation_names[i]`` name local id ``i``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ent = np.asarray(entity_names, dtype=object)
    rel = np.asarray(relation_names, dtype=object)
    for s, t in splits.items():
        t = torch.as_tensor(t).reshape(-1, 3).numpy()
        lines = [f"{h}\t{r}\t{o}\n" for h, r, o in zip(ent[t[:, 0]], rel[t[:, 1]], ent[t[:, 2]])]
        (folder / f"{s}.txt").write_text("".join(lines), encoding="utf-8")
