""":func:`load_kg`, the one entry point to a KG: a bundled name, a folder in any supported
format, a PyG dataset named as ``pyg:<Class>@<root>``, or PyG data in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch_geometric.data import Data, Dataset

from .kg import KGFormatError, KnowledgeGraph
from .kg_io import BUNDLED_DATASETS, load_bundled, load_openke, load_triples_folder
from .pyg import PYG_DATASETS, kg_from_pyg, load_pyg, load_pyg_root, parse_pyg_name

#: spellings used by ``config.DataConfig.format``
FORMAT_ALIASES = {"triples": "named", "pyg_fb15k237": "FB15k_237", "pyg_wn18rr": "WordNet18RR"}


def bundled_format_error(name: str, fmt: str) -> str:
    """The message for ``data.format`` naming another format than a bundled dataset's files
    have: they are named triples, so ``openke`` or a PyG format cannot be honoured, and
    quietly reading them as triples would hide a mistake in the config."""
    return (f"data.format={fmt}: the bundled dataset {name!r} is stored as named triples; use "
            f"data.format=auto or triples with it, or set data.name to a folder in the {fmt} format")


def is_pyg_source(source: Any) -> bool:
    """Whether ``source`` is PyG data :func:`load_kg` converts: a ``Data``, a dataset, or a
    mapping of splits to them."""
    if isinstance(source, (Data, Dataset)):
        return True
    return isinstance(source, dict) and bool(source) and all(isinstance(v, (Data, Dataset)) for v in source.values())


def load_kg(source: Any, fmt: str = "auto", **kwargs) -> KnowledgeGraph:
    """Load a KG, with ids ``0..N-1`` and the input policy applied.

    ``source`` is one of:

    * a bundled dataset: ``"umls"``, ``"nations"``, ``"kinship"``;
    * a folder; ``fmt``: ``"auto"`` (OpenKE if ``entity2id.txt`` exists, else named
      triples), ``"named"``, ``"openke"``, ``"FB15k_237"`` or ``"WordNet18RR"`` (raw files
      through PyG's class: :func:`~.pyg.load_pyg`; ``kwargs`` go to it, e.g. ``cache_dir``);
      the config spellings ``"triples"``, ``"pyg_fb15k237"``, ``"pyg_wn18rr"`` are aliases;
    * ``"pyg:<Class>@<root>"``: a PyG dataset class on its root, offline
      (:func:`~.pyg.load_pyg_root`; ``pyg:FB15k_237@data/FB15k_237``, ``pyg:UMLS@/tmp/umls``);
    * PyG data: a ``Data`` with split masks, a one-graph dataset, or ``{"train", "val",
      "test"}`` of ``Data`` or datasets (:func:`~.pyg.kg_from_pyg`; ``kwargs`` go to it).
    """
    if is_pyg_source(source):
        return kg_from_pyg(source, **kwargs)
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    if isinstance(source, str) and source.startswith("pyg:"):
        if fmt != "auto":
            raise KGFormatError(f"data.format={fmt}: {source!r} names a PyG dataset class; use data.format=auto")
        return load_pyg_root(*parse_pyg_name(source))
    if isinstance(source, str) and source.lower() in BUNDLED_DATASETS:
        if fmt not in ("auto", "named"):
            raise KGFormatError(bundled_format_error(source, fmt))
        return load_bundled(source)
    folder = Path(source)
    if not folder.exists():
        raise FileNotFoundError(f"{source!r} is neither a bundled dataset "
                                f"{BUNDLED_DATASETS} nor an existing folder")
    if fmt in PYG_DATASETS:
        return load_pyg(folder, fmt, **kwargs)
    if fmt == "openke" or (fmt == "auto" and (folder / "entity2id.txt").is_file()):
        return load_openke(folder)
    if fmt in ("auto", "named"):
        return load_triples_folder(folder)
    raise ValueError(f"unknown fmt {fmt!r}; use 'auto', 'named', 'openke' or one of {PYG_DATASETS}")
