"""Knowledge graphs with integer ids, and loaders for the common on-disk formats.

A :class:`KnowledgeGraph` holds named splits (``train``, ``valid``, ``test``, optionally
``unlearn``) as ``LongTensor[E, 3]`` (head, relation, tail) with optional vocabularies, and
each split as a PyG ``Data``. Entry point: :func:`load_kg`. Every loader applies
:func:`clean_splits` (malformed lines are errors naming ``file:line``, duplicates and
unseen evaluation triples are dropped with a logged count); formats and the input policy
are in docs/datasets.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_fedkg.keys import pack_keys

logger = logging.getLogger("lightning_fedkg")

SPLITS: tuple[str, ...] = ("train", "valid", "test")
BUNDLED_DATASETS: tuple[str, ...] = ("umls", "nations", "kinship")
BUNDLED_ROOT = Path(__file__).resolve().parent / "bundled"
PYG_DATASETS: tuple[str, ...] = ("FB15k_237", "WordNet18RR")
#: spellings used by ``config.DataConfig.format``
FORMAT_ALIASES = {"triples": "named", "pyg_fb15k237": "FB15k_237", "pyg_wn18rr": "WordNet18RR"}


class KGFormatError(ValueError):
    """A knowledge-graph file that cannot be read: the message names ``file:line``."""


# --------------------------------------------------------------------------------------
# Triple utilities (vectorized; shared with the federated layer and the datamodule)
# --------------------------------------------------------------------------------------


def triple_keys(triples: Tensor, num_entities: int, num_relations: int) -> Tensor:
    """Injective int64 key ``(h * R + r) * N + t`` of each triple (``LongTensor[E]``).

    Raises :class:`lightning_fedkg.keys.KeyOverflowError` (a ``ValueError``) when ``N * R * N``
    exceeds the int64 range.
    """
    t = triples.long()
    return pack_keys((t[:, 0], t[:, 1], t[:, 2]), (num_entities, num_relations, num_entities), "triples")


def first_occurrence(keys: Tensor) -> Tensor:
    """Indices of the first occurrence of every distinct key, in original order."""
    # numpy's unique reports first occurrences directly (torch's does not)
    _, first = np.unique(keys.numpy(), return_index=True)
    return torch.from_numpy(np.sort(first)).long()


def unique_triples(triples: Tensor, num_entities: int, num_relations: int) -> Tensor:
    """Triples with duplicates removed, first occurrences kept in their original order."""
    return triples[first_occurrence(triple_keys(triples, num_entities, num_relations))]


#: Splits whose triples a client trained on: the reference of the input policy and of a
#: client's vocabulary. ``unlearn`` is FedLU's forgetting set, a subset of ``train`` in
#: FedLU's own files; in an unlearning's retrain folder it holds the triples removed from
#: ``train``, so the retrained federation keeps the source's entities, ids and test sets.
TRAINING_SPLITS = ("train", "unlearn")


def training_triples(splits: dict[str, Tensor]) -> Tensor:
    """The triples of the :data:`TRAINING_SPLITS` present in ``splits`` (``train`` first)."""
    return torch.cat([splits[s] for s in TRAINING_SPLITS if s in splits])


def clean_splits(
    splits: dict[str, Tensor], num_entities: int, num_relations: int, source: str = "kg"
) -> tuple[dict[str, Tensor], dict[str, dict[str, int]]]:
    """Apply the input policy to id splits (``"train"``, with ``"unlearn"`` when present,
    is the reference: :data:`TRAINING_SPLITS`).

    Removes duplicates inside each split, then drops triples of every other split whose
    head, relation or tail does not occur in the reference. Non-zero counts are logged with
    ``source`` in the message. Returns the cleaned splits and
    ``{split: {"duplicates": d, "unseen": u}}``.
    """
    if "train" not in splits:
        raise KeyError("splits must contain 'train'")
    out: dict[str, Tensor] = {}
    removed: dict[str, dict[str, int]] = {}
    train = unique_triples(splits["train"], num_entities, num_relations)
    reference = training_triples({**splits, "train": train})
    seen_ent = torch.zeros(num_entities, dtype=torch.bool)
    seen_ent[reference[:, 0]] = True
    seen_ent[reference[:, 2]] = True
    seen_rel = torch.zeros(num_relations, dtype=torch.bool)
    seen_rel[reference[:, 1]] = True
    for name, triples in splits.items():
        unique = train if name == "train" else unique_triples(triples, num_entities, num_relations)
        dup = triples.shape[0] - unique.shape[0]
        unseen = 0
        if name not in TRAINING_SPLITS:
            keep = seen_ent[unique[:, 0]] & seen_rel[unique[:, 1]] & seen_ent[unique[:, 2]]
            unseen = int((~keep).sum())
            unique = unique[keep]
        out[name] = unique
        removed[name] = {"duplicates": dup, "unseen": unseen}
        if dup:
            logger.warning("%s: removed %d duplicate triples from split '%s'", source, dup, name)
        if unseen:
            logger.warning(
                "%s: dropped %d '%s' triples whose entity or relation does not occur in train",
                source, unseen, name,
            )
    return out, removed


# --------------------------------------------------------------------------------------
# KnowledgeGraph
# --------------------------------------------------------------------------------------


class KnowledgeGraph:
    """One KG with integer ids ``0..num_entities-1`` and ``0..num_relations-1``.

    Args:
        splits: ``{split: LongTensor[E, 3]}`` with columns (head, relation, tail); must
            contain ``"train"``, ``"valid"`` and ``"test"`` and may contain more.
        num_entities, num_relations: sizes of the id spaces (ids may be unused).
        entity_names, relation_names: optional id -> name lists.
        name: a label used in logs and stats.

    The constructor only validates; loaders apply the input policy (:func:`clean_splits`).
    """

    def __init__(
        self,
        splits: dict[str, Tensor],
        num_entities: int,
        num_relations: int,
        entity_names: list[str] | None = None,
        relation_names: list[str] | None = None,
        name: str = "kg",
    ) -> None:
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise ValueError(f"splits must contain {SPLITS}; missing {missing}")
        self.name = name
        self.num_entities = int(num_entities)
        self.num_relations = int(num_relations)
        self._splits: dict[str, Tensor] = {}
        for split, triples in splits.items():
            t = torch.as_tensor(triples)
            if t.dim() != 2 or t.shape[1] != 3:
                raise ValueError(f"split '{split}' must have shape [E, 3], got {tuple(t.shape)}")
            t = t.long().contiguous()
            if t.numel():
                ent = t[:, [0, 2]]
                if int(ent.min()) < 0 or int(ent.max()) >= self.num_entities:
                    raise ValueError(f"split '{split}': entity id outside [0, {self.num_entities})")
                if int(t[:, 1].min()) < 0 or int(t[:, 1].max()) >= self.num_relations:
                    raise ValueError(f"split '{split}': relation id outside [0, {self.num_relations})")
            self._splits[split] = t
        for label, names, size in (("entity", entity_names, self.num_entities),
                                   ("relation", relation_names, self.num_relations)):
            if names is not None and len(names) != size:
                raise ValueError(f"{len(names)} {label} names for {size} ids")
        self.entity_names = list(entity_names) if entity_names is not None else None
        self.relation_names = list(relation_names) if relation_names is not None else None
        #: what the loader's input policy removed: ``{split: {"duplicates", "unseen"}}``
        self.removed: dict[str, dict[str, int]] = {}

    # Built on first use: a federation makes a KnowledgeGraph per client, and training never
    # looks a name up (a 300k-entity vocabulary is a 0.2 s dict per graph).
    @functools.cached_property
    def entity_to_id(self) -> dict[str, int]:
        """Entity name -> id (empty without names)."""
        return {n: i for i, n in enumerate(self.entity_names)} if self.entity_names else {}

    @functools.cached_property
    def relation_to_id(self) -> dict[str, int]:
        """Relation name -> id (empty without names)."""
        return {n: i for i, n in enumerate(self.relation_names)} if self.relation_names else {}

    @property
    def split_names(self) -> list[str]:
        """Names of the splits, ``train``, ``valid``, ``test`` first."""
        return list(self._splits)

    def triples(self, split: str = "train") -> Tensor:
        """``LongTensor[E, 3]`` (head, relation, tail) of one split."""
        try:
            return self._splits[split]
        except KeyError:
            raise KeyError(f"unknown split '{split}'; have {self.split_names}") from None

    def data(self, split: str = "train") -> Data:
        """One split as ``Data(edge_index=[2, E] (heads, tails), edge_type=[E], num_nodes=N)``."""
        t = self.triples(split)
        return Data(edge_index=t[:, [0, 2]].t().contiguous(), edge_type=t[:, 1].clone(),
                    num_nodes=self.num_entities)

    @property
    def train(self) -> Data:
        return self.data("train")

    @property
    def valid(self) -> Data:
        return self.data("valid")

    @property
    def test(self) -> Data:
        return self.data("test")

    def all_true_triples(self) -> Tensor:
        """Distinct triples of train ∪ valid ∪ test."""
        cat = torch.cat([self._splits[s] for s in SPLITS])
        return unique_triples(cat, self.num_entities, self.num_relations)

    def stats(self) -> dict:
        """``{"name", "entities", "relations", "train", "valid", "test", <other splits>}``."""
        out: dict = {"name": self.name, "entities": self.num_entities,
                     "relations": self.num_relations}
        out.update({s: int(t.shape[0]) for s, t in self._splits.items()})
        return out

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={t.shape[0]}" for s, t in self._splits.items())
        return (f"KnowledgeGraph(name={self.name!r}, entities={self.num_entities}, "
                f"relations={self.num_relations}, {sizes})")


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


def default_cache_dir() -> Path:
    """``~/.cache/lightning_fedkg/pyg``: where :func:`load_pyg` builds its PyG roots."""
    return Path.home() / ".cache" / "lightning_fedkg" / "pyg"


def _pyg_class(dataset: str):
    from torch_geometric.datasets import FB15k_237, WordNet18RR

    base = {"FB15k_237": FB15k_237, "WordNet18RR": WordNet18RR}[dataset]

    class Offline(base):  # the cached root always has raw/; a download would be a bug
        def download(self) -> None:
            raise RuntimeError(f"lightning_fedkg never downloads; raw files missing in {self.raw_dir}")

    Offline.__name__ = base.__name__
    return Offline


def load_pyg(path: str | Path, dataset: str = "FB15k_237", cache_dir: str | Path | None = None) -> KnowledgeGraph:
    """Load ``FB15k_237`` or ``WordNet18RR`` through PyG's dataset classes, offline.

    ``path`` is a folder holding ``raw/{train,valid,test}.txt`` (or those files directly).
    The files are validated, normalised (blank lines removed, a final newline added: PyG's
    ``FB15k_237`` silently loses a last line without one) and written to a writable root
    ``<cache_dir>/<dataset>-<hash of path>/raw``; PyG processes them there, never in
    ``path`` and never downloading. The cache is rebuilt when the source files change.

    Ids are PyG's: first appearance for ``FB15k_237``; for ``WordNet18RR`` its own node
    order and the class's hard-coded ``edge2id`` relation ids. Names are reconstructed by
    replaying that order and checked against PyG's tensors.
    """
    if dataset not in PYG_DATASETS:
        raise ValueError(f"dataset must be one of {PYG_DATASETS}, got {dataset!r}")
    src = Path(path).resolve()
    raw_src = src / "raw" if (src / "raw").is_dir() else src
    files = {s: raw_src / f"{s}.txt" for s in SPLITS}
    for f in files.values():
        if not f.is_file():
            raise FileNotFoundError(f"missing {f}")
    sep = "tab" if dataset == "FB15k_237" else "whitespace"
    named = {}
    for s, f in files.items():
        named[s] = read_named_triples(f, sep)[:3]
        if not named[s][0]:
            raise KGFormatError(f"{f}: split '{s}' has no triples")
    cls = _pyg_class(dataset)
    if dataset == "WordNet18RR":
        unknown = [(s, k) for s in SPLITS for k, r in enumerate(named[s][1]) if r not in cls.edge2id]
        if unknown:
            s, k = unknown[0]
            line = read_named_triples(files[s], sep)[3][k]
            raise KGFormatError(f"{files[s]}:{line}: relation {named[s][1][k]!r} is not a "
                                f"WordNet18RR relation {sorted(cls.edge2id)}")

    manifest = {"source": str(raw_src),
                "files": {s: [f.stat().st_size, f.stat().st_mtime_ns] for s, f in files.items()}}
    digest = hashlib.sha1(str(raw_src).encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = root / f"{dataset}-{digest}"
    stamp = root / "source.json"
    fresh = stamp.is_file() and json.loads(stamp.read_text()) == manifest
    if not fresh:
        shutil.rmtree(root, ignore_errors=True)
        (root / "raw").mkdir(parents=True)
        for s in SPLITS:
            h, r, t = named[s]
            sep_out = "\t" if dataset == "FB15k_237" else " "
            text = "".join(f"{a}{sep_out}{b}{sep_out}{c}\n" for a, b, c in zip(h, r, t))
            (root / "raw" / f"{s}.txt").write_text(text, encoding="utf-8")
        stamp.write_text(json.dumps(manifest))

    if dataset == "FB15k_237":
        raw = {}
        num_nodes = 0
        for s, pyg_split in zip(SPLITS, ("train", "val", "test")):
            d = cls(str(root), split=pyg_split)[0]
            raw[s] = torch.stack([d.edge_index[0], d.edge_type, d.edge_index[1]], 1)
            num_nodes = int(d.num_nodes)
        e2id, r2id = _first_appearance_vocab(named[s] for s in SPLITS)
        ours = {s: _to_ids(*named[s], e2id, r2id) for s in SPLITS}
        same = num_nodes == len(e2id) and all(torch.equal(ours[s], raw[s]) for s in SPLITS)
        num_relations = len(r2id)
        ent_names, rel_names = list(e2id), list(r2id)
    else:
        d = cls(str(root))[0]
        num_nodes = int(d.num_nodes)
        full = torch.stack([d.edge_index[0], d.edge_type, d.edge_index[1]], 1)
        raw = {s: full[m] for s, m in zip(SPLITS, (d.train_mask, d.val_mask, d.test_mask))}
        # PyG's WordNet18RR numbers nodes file by file: all heads of a file, then its tails.
        order: dict[str, None] = {}
        for s in SPLITS:
            order.update(dict.fromkeys(named[s][0]))
            order.update(dict.fromkeys(named[s][2]))
        e2id = {n: i for i, n in enumerate(order)}
        r2id = dict(cls.edge2id)
        num_relations = len(r2id)
        ours = {s: _to_ids(*named[s], e2id, r2id) for s in SPLITS}

        def sorted_keys(t: Tensor) -> Tensor:
            return triple_keys(t, max(num_nodes, len(e2id)), num_relations).sort().values

        same = num_nodes == len(e2id) and all(
            torch.equal(sorted_keys(ours[s]), sorted_keys(raw[s])) for s in SPLITS)
        ent_names = list(e2id)
        rel_names = sorted(r2id, key=r2id.__getitem__)
    if not same:
        raise RuntimeError(f"PyG's {dataset} ids disagree with the raw files in {raw_src}; "
                           f"delete {root} and retry")
    name = _dataset_name(raw_src)
    splits, removed = clean_splits(raw, num_nodes, num_relations, source=name)
    kg = KnowledgeGraph(splits, num_nodes, num_relations, ent_names, rel_names, name=name)
    kg.removed = removed
    return kg


def bundled_format_error(name: str, fmt: str) -> str:
    """The message for ``data.format`` naming another format than a bundled dataset's files
    have: they are named triples, so ``openke`` or a PyG format cannot be honoured, and
    quietly reading them as triples would hide a mistake in the config."""
    return (f"data.format={fmt}: the bundled dataset {name!r} is stored as named triples; use "
            f"data.format=auto or triples with it, or set data.name to a folder in the {fmt} format")


def load_kg(name_or_path: str | Path, fmt: str = "auto", **kwargs) -> KnowledgeGraph:
    """Load a bundled dataset (``"umls"``, ``"nations"``, ``"kinship"``) or a folder.

    ``fmt``: ``"auto"`` (OpenKE if ``entity2id.txt`` exists, else named triples),
    ``"named"``, ``"openke"``, ``"FB15k_237"`` or ``"WordNet18RR"`` (through
    :func:`load_pyg`; ``kwargs`` go to it, e.g. ``cache_dir``). The config spellings
    ``"triples"``, ``"pyg_fb15k237"``, ``"pyg_wn18rr"`` are accepted as aliases.
    """
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    if isinstance(name_or_path, str) and name_or_path.lower() in BUNDLED_DATASETS:
        if fmt not in ("auto", "named"):
            raise KGFormatError(bundled_format_error(name_or_path, fmt))
        folder = BUNDLED_ROOT / name_or_path.lower()
        kg = _from_named_files({s: folder / f"{s}.txt" for s in SPLITS}, name_or_path.lower())
        return kg
    folder = Path(name_or_path)
    if not folder.exists():
        raise FileNotFoundError(f"{name_or_path!r} is neither a bundled dataset "
                                f"{BUNDLED_DATASETS} nor an existing folder")
    if fmt in PYG_DATASETS:
        return load_pyg(folder, fmt, **kwargs)
    if fmt == "openke" or (fmt == "auto" and (folder / "entity2id.txt").is_file()):
        return load_openke(folder)
    if fmt in ("auto", "named"):
        return load_triples_folder(folder)
    raise ValueError(f"unknown fmt {fmt!r}; use 'auto', 'named', 'openke' or one of {PYG_DATASETS}")


def names_to_ids(kg: KnowledgeGraph, triples: Sequence[tuple[str, str, str]]) -> Tensor:
    """Map named triples to a ``LongTensor[E, 3]`` with ``kg``'s vocabularies."""
    if not triples:
        return torch.zeros(0, 3, dtype=torch.long)
    h, r, t = zip(*triples)
    return _to_ids(list(h), list(r), list(t), kg.entity_to_id, kg.relation_to_id)
