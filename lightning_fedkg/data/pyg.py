"""PyG datasets in and out: a KG is a ``torch_geometric`` dataset on both sides.

In: :func:`kg_from_pyg` turns PyG's two KG layouts into a :class:`~.kg.KnowledgeGraph`
(ids kept, input policy applied): one ``Data(edge_index [2, E], edge_type [E], num_nodes)``
per split, as ``torch_geometric.datasets.FB15k_237(root, split=...)`` gives (a mapping
``{"train", "val" | "valid", "test"}`` of ``Data`` or datasets), or one ``Data`` with
``train_mask`` / ``val_mask`` / ``test_mask`` over its edges, as ``WordNet18RR(root)[0]``
gives (any other ``<name>_mask`` becomes an extra split). :func:`load_pyg_root` instantiates
a dataset class on a root, offline (``data.name: pyg:<Class>@<root>``), and :func:`load_pyg`
reads FB15k-237 / WN18RR files through PyG's own classes.

Out: :func:`kg_to_pyg` (per split ``Data``, or one ``Data`` with masks), and :class:`KGDataset`
(``InMemoryDataset``, FB15k_237's layout), whose subclasses :class:`UMLS`, :class:`Nations`, :class:`Kinship`
are the bundled KGs; :func:`save_kg_dataset` writes any KG as such a root. docs/datasets.md.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset

from .kg import SPLITS, KGFormatError, KnowledgeGraph, clean_splits, triple_keys
from .kg_io import (BUNDLED_ROOT, _dataset_name, _first_appearance_vocab, _to_ids, load_triples_folder,
                    read_named_triples, write_named_client)

PYG_DATASETS: tuple[str, ...] = ("FB15k_237", "WordNet18RR")
#: PyG's split names (``FB15k_237(root, split=...)``, ``val_mask``) -> ours.
PYG_SPLITS = {"train": "train", "val": "valid", "test": "test"}


# --------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------


def _triples(data: Data) -> Tensor:
    """``[E, 3]`` (head, relation, tail) of a PyG KG ``Data``."""
    if getattr(data, "edge_index", None) is None or getattr(data, "edge_type", None) is None:
        raise KGFormatError(f"a PyG KG needs edge_index [2, E] and edge_type [E]; got keys {sorted(data.keys())}")
    ei, et = data.edge_index.long(), data.edge_type.long().reshape(-1)
    if ei.dim() != 2 or ei.shape[0] != 2 or ei.shape[1] != et.numel():
        raise KGFormatError(f"edge_index {tuple(ei.shape)} and edge_type {tuple(et.shape)} do not "
                            "describe the same edges ([2, E] and [E])")
    return torch.stack([ei[0], et, ei[1]], 1)


def _first_data(source: Any) -> Data:
    """A ``Data`` itself, or the only graph of a dataset (PyG's KG datasets hold one)."""
    if isinstance(source, Data):
        return source
    if len(source) != 1:
        raise KGFormatError(f"a PyG KG dataset holds one graph per split; this one holds {len(source)}")
    return source[0]


def _split_data(source: Any) -> dict[str, Data]:
    """``{our split name: Data}`` of either layout (masks cut into per-split ``Data``)."""
    if isinstance(source, Mapping):
        out = {PYG_SPLITS.get(s, s): _first_data(d) for s, d in source.items()}
    else:
        data = _first_data(source)
        masks = [k for k in data.keys() if k.endswith("_mask")]
        if not masks:
            raise KGFormatError("one PyG Data without train_mask/val_mask/test_mask holds no splits; pass "
                                "{'train': Data, 'val': Data, 'test': Data} (FB15k_237's layout) instead")
        out = {}
        for key in masks:
            mask = data[key].bool()
            out[PYG_SPLITS.get(key[:-5], key[:-5])] = Data(edge_index=data.edge_index[:, mask],
                                                           edge_type=data.edge_type[mask], num_nodes=data.num_nodes)
        for key in ("num_relations", "entity_names", "relation_names"):
            if key in data:
                out["train"][key] = data[key]
    missing = [s for s in SPLITS if s not in out]
    if missing:
        raise KGFormatError(f"a PyG KG needs the splits train, val and test; missing {missing}")
    return {s: out[s] for s in (*SPLITS, *(s for s in out if s not in SPLITS))}  # train, valid, test first


def kg_from_pyg(source: Any, name: str = "pyg", num_relations: int | None = None,
                entity_names: list[str] | None = None, relation_names: list[str] | None = None,
                clean: bool = True) -> KnowledgeGraph:
    """A :class:`~.kg.KnowledgeGraph` of a PyG KG, its ids kept.

    ``source``: ``{"train": ..., "val": ..., "test": ...}`` (``"valid"`` too) of ``Data`` or
    one-graph datasets (FB15k_237's layout), or one ``Data`` / one-graph dataset with
    ``train_mask``, ``val_mask``, ``test_mask`` (WordNet18RR's; any other ``<split>_mask`` is
    an extra split). Entities are ``0..max(num_nodes)-1``; relations ``0..num_relations-1``,
    by default a ``num_relations`` attribute of the train ``Data`` or of a dataset, else the
    largest ``edge_type`` plus one. Names likewise from arguments, then ``entity_names`` /
    ``relation_names`` attributes. With ``clean`` the input policy (:func:`~.kg.clean_splits`)
    applies, as in every loader.
    """
    datas = _split_data(source)
    train = datas["train"]

    def attribute(key: str):
        for holder in (train, source if not isinstance(source, Mapping) else source.get("train")):
            value = getattr(holder, key, None)
            if value is not None and not callable(value):
                return value
        return None

    splits = {s: _triples(d) for s, d in datas.items()}
    num_entities = max(int(d.num_nodes) for d in datas.values())
    if num_relations is None:
        num_relations = attribute("num_relations")
    if num_relations is None:
        num_relations = max((int(t[:, 1].max()) + 1 for t in splits.values() if t.numel()), default=0)
    entity_names = entity_names if entity_names is not None else attribute("entity_names")
    relation_names = relation_names if relation_names is not None else attribute("relation_names")
    removed: dict = {}
    if clean:
        splits, removed = clean_splits(splits, num_entities, int(num_relations), source=name)
    kg = KnowledgeGraph(splits, num_entities, int(num_relations), entity_names, relation_names, name=name)
    kg.removed = removed
    return kg


def kg_to_pyg(kg: KnowledgeGraph, masks: bool = False) -> dict[str, Data] | Data:
    """``kg`` as PyG data: ``{"train", "val", "test", <extra>: Data}`` (FB15k_237's layout:
    :meth:`~.kg.KnowledgeGraph.data` per split), or with ``masks`` one ``Data`` over all
    splits' edges with a ``<split>_mask`` each (``val_mask`` for ``valid``: WordNet18RR's
    layout). Each ``Data`` also carries ``num_relations`` and, when ``kg`` has them, the
    ``entity_names`` / ``relation_names``, so :func:`kg_from_pyg` gives ``kg`` back."""
    pyg_name = {ours: theirs for theirs, ours in PYG_SPLITS.items()}
    extra = {"num_relations": kg.num_relations}
    if kg.entity_names is not None:
        extra["entity_names"] = kg.entity_names
    if kg.relation_names is not None:
        extra["relation_names"] = kg.relation_names
    if not masks:
        return {pyg_name.get(s, s): Data(**kg.data(s).to_dict(), **extra) for s in kg.split_names}
    parts = [kg.triples(s) for s in kg.split_names]
    every = torch.cat(parts)
    owner = torch.repeat_interleave(torch.arange(len(parts)), torch.tensor([p.shape[0] for p in parts]))
    data = Data(edge_index=every[:, [0, 2]].t().contiguous(), edge_type=every[:, 1].clone(),
                num_nodes=kg.num_entities, **extra)
    for k, s in enumerate(kg.split_names):
        data[f"{pyg_name.get(s, s)}_mask"] = owner == k
    return data


# --------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------


def _read_dict(path: Path) -> list[str]:
    """``id<TAB>name`` lines (FedLU's ``entities.dict``), ids ``0..n-1`` in any order."""
    rows = [ln.split("\t") for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    names = [""] * len(rows)
    for k, row in enumerate(rows):
        if len(row) != 2 or not row[0].isdigit() or int(row[0]) >= len(rows):
            raise KGFormatError(f"{path}:{k + 1}: expected 'id<TAB>name' with ids 0..{len(rows) - 1}")
        names[int(row[0])] = row[1]
    return names


class KGDataset(InMemoryDataset):
    """A KG as a PyG ``InMemoryDataset`` in FB15k_237's layout: ``KGDataset(root,
    split="train" | "val" | "test")[0]`` is ``Data(edge_index, edge_type, num_nodes)`` with
    ids shared by the three splits, which PyG's KGE models (``torch_geometric.nn.kge``) and
    examples take as they take ``FB15k_237``.

    ``root/raw`` holds ``{train,valid,test}.txt`` of named triples and optionally
    ``entities.dict`` / ``relations.dict`` (``id<TAB>name``: the ids to keep; without them
    ids follow first appearance, as in PyG's ``FB15k_237``). :attr:`entity_names`,
    :attr:`relation_names` and :attr:`num_relations` come with it. Nothing is downloaded: a
    root without raw files is an error (:func:`save_kg_dataset` writes one from any KG).
    Why one dataset per split rather than masks: it is the layout of PyG's KGE example and of
    ``FB15k_237``, and a split stays one graph a loader can take as it is.
    """

    split_names = tuple(PYG_SPLITS)

    def __init__(self, root: str | Path, split: str = "train", transform=None, pre_transform=None,
                 force_reload: bool = False) -> None:
        if split not in self.split_names:
            raise ValueError(f"split must be one of {self.split_names}, got {split!r}")
        super().__init__(str(root), transform, pre_transform, force_reload=force_reload)
        self.load(self.processed_paths[self.split_names.index(split)])
        vocab = json.loads(Path(self.processed_dir, "vocab.json").read_text(encoding="utf-8"))
        self.entity_names: list[str] = vocab["entities"]
        self.relation_names: list[str] = vocab["relations"]
        self.num_relations: int = len(self.relation_names)

    @property
    def raw_file_names(self) -> list[str]:
        return ["train.txt", "valid.txt", "test.txt"]

    @property
    def processed_file_names(self) -> list[str]:
        return ["train_data.pt", "val_data.pt", "test_data.pt", "vocab.json"]

    def download(self) -> None:
        raise FileNotFoundError(f"{self.raw_dir}: no {'/'.join(self.raw_file_names)}; lightning_fedkg never "
                                "downloads (write a root with lightning_fedkg.data.pyg.save_kg_dataset)")

    def read_kg(self) -> KnowledgeGraph:
        """The raw files as a :class:`~.kg.KnowledgeGraph` (the ids :meth:`process` saves)."""
        raw = Path(self.raw_dir)
        if not (raw / "entities.dict").is_file():
            kg = load_triples_folder(raw)
            kg.name = _dataset_name(Path(self.root))
            return kg
        ents, rels = _read_dict(raw / "entities.dict"), _read_dict(raw / "relations.dict")
        e2id, r2id = {n: i for i, n in enumerate(ents)}, {n: i for i, n in enumerate(rels)}
        splits = {}
        for s in SPLITS:
            h, r, t, lines = read_named_triples(raw / f"{s}.txt")
            unknown = [k for k, (a, b, c) in enumerate(zip(h, r, t)) if a not in e2id or b not in r2id or c not in e2id]
            if unknown:
                raise KGFormatError(f"{raw / f'{s}.txt'}:{lines[unknown[0]]}: a name that entities.dict or "
                                    "relations.dict lacks")
            splits[s] = _to_ids(h, r, t, e2id, r2id)
        name = _dataset_name(Path(self.root))
        cleaned, removed = clean_splits(splits, len(ents), len(rels), source=name)
        kg = KnowledgeGraph(cleaned, len(ents), len(rels), ents, rels, name=name)
        kg.removed = removed
        return kg

    def process(self) -> None:
        kg = self.read_kg()
        for path, split in zip(self.processed_paths, SPLITS):
            data = kg.data(split)
            if self.pre_transform is not None:
                data = self.pre_transform(data)
            self.save([data], path)
        vocab = {"entities": kg.entity_names, "relations": kg.relation_names}
        Path(self.processed_paths[3]).write_text(json.dumps(vocab), encoding="utf-8")


class BundledKG(KGDataset):
    """A KG shipped in the package as a :class:`KGDataset`: its raw files are copied from the
    package into ``root/raw`` (the dataset's "download", offline). Ids are those of
    ``load_kg(<name>)``."""

    bundled = ""

    def download(self) -> None:
        for f in self.raw_file_names:
            shutil.copyfile(BUNDLED_ROOT / self.bundled / f, Path(self.raw_dir) / f)

    def read_kg(self) -> KnowledgeGraph:
        kg = super().read_kg()
        kg.name = self.bundled
        return kg


class UMLS(BundledKG):
    """The bundled UMLS KG (135 entities, 46 relations) as a PyG dataset."""

    bundled = "umls"


class Nations(BundledKG):
    """The bundled Nations KG as a PyG dataset."""

    bundled = "nations"


class Kinship(BundledKG):
    """The bundled Kinship KG as a PyG dataset."""

    bundled = "kinship"


#: Dataset classes ``pyg:<name>@<root>`` finds by short name before ``torch_geometric.datasets``.
DATASET_CLASSES = {c.__name__: c for c in (KGDataset, UMLS, Nations, Kinship)}


def save_kg_dataset(source: Any, root: str | Path) -> Path:
    """Write ``source`` (a :class:`~.kg.KnowledgeGraph` or anything :func:`kg_from_pyg`
    takes) as a :class:`KGDataset` root: ``raw/`` with its named splits and its
    ``entities.dict`` / ``relations.dict``, so the dataset keeps its ids. A KG without names
    is named by its ids. Returns ``root``; ``KGDataset(root, split=...)`` then loads it."""
    kg = source if isinstance(source, KnowledgeGraph) else kg_from_pyg(source)
    ents = kg.entity_names or [str(i) for i in range(kg.num_entities)]
    rels = kg.relation_names or [str(i) for i in range(kg.num_relations)]
    write_named_client(Path(root) / "raw", ents, rels, {s: kg.triples(s) for s in SPLITS})
    return Path(root)


def _dataset_class(name: str):
    """``KGDataset`` / ``UMLS`` / ..., a ``torch_geometric.datasets`` class, or ``pkg.module:Class``."""
    if ":" in name:
        module, _, attr = name.partition(":")
        return getattr(importlib.import_module(module), attr)
    if name in DATASET_CLASSES:
        return DATASET_CLASSES[name]
    import torch_geometric.datasets as pyg_datasets

    cls = getattr(pyg_datasets, name, None)
    if not (isinstance(cls, type) and issubclass(cls, InMemoryDataset)):
        raise ValueError(f"pyg:{name}: not a dataset class of torch_geometric.datasets nor one of "
                         f"{sorted(DATASET_CLASSES)}; name another as pyg:package.module:Class@root")
    return cls


def parse_pyg_name(name: str) -> tuple[str, str]:
    """``"pyg:<Class>@<root>"`` -> ``(Class, root)`` (``data.name`` naming a PyG dataset)."""
    body = name[len("pyg:"):] if name.startswith("pyg:") else name
    cls, sep, root = body.partition("@")
    if not cls or not sep or not root:
        raise ValueError(f"{name!r}: name a PyG dataset as pyg:<Class>@<root>, e.g. pyg:FB15k_237@data/FB15k_237")
    return cls, root


def load_pyg_root(dataset: str, root: str | Path) -> KnowledgeGraph:
    """Instantiate the PyG dataset class ``dataset`` on ``root`` and return its KG.

    ``dataset``: as in :func:`parse_pyg_name` (our :class:`KGDataset` and bundled classes,
    ``torch_geometric.datasets`` names such as ``FB15k_237`` or ``WordNet18RR``, or
    ``package.module:Class``). A class whose constructor takes ``split`` is built once per
    split (FB15k_237's layout), any other once, its graph cut by masks. Never downloads:
    a class of PyG's own, or one of the caller's, on a root with neither ``raw/`` nor
    ``processed/`` files is an error; PyG processes ``raw/`` into ``root/processed`` as usual.
    """
    cls = _dataset_class(dataset)
    root = Path(root)
    if not issubclass(cls, BundledKG):
        held = [p for sub in ("raw", "processed") if (root / sub).is_dir() for p in (root / sub).iterdir()]
        if not held:
            raise FileNotFoundError(f"pyg:{dataset}@{root}: the root holds nothing (no files in {root / 'raw'} or "
                                    f"{root / 'processed'}); lightning_fedkg never downloads: put the dataset's raw "
                                    "files in <root>/raw (or its processed files in <root>/processed)")
        if not issubclass(cls, KGDataset):
            cls = type(cls.__name__, (cls,), {"download": _no_download})
    if "split" in inspect.signature(cls.__init__).parameters:
        source = {s: cls(str(root), split=s) for s in PYG_SPLITS}
    else:
        source = cls(str(root))
    relations = getattr(cls, "edge2id", None)  # WordNet18RR's fixed relation ids, all 11 of them
    if isinstance(relations, dict):
        names = sorted(relations, key=relations.__getitem__)
        return kg_from_pyg(source, name=_dataset_name(root), num_relations=len(names), relation_names=names)
    return kg_from_pyg(source, name=_dataset_name(root))


def _no_download(self) -> None:
    raise FileNotFoundError(f"lightning_fedkg never downloads; raw files missing in {self.raw_dir}")


# --------------------------------------------------------------------------------------
# FB15k-237 / WN18RR files through PyG's classes
# --------------------------------------------------------------------------------------


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
