"""What ``fedkg`` checks before it imports torch: the data name, the client count, the run folder.

A mistake there is reported in a fraction of a second instead of after the seconds torch,
Lightning and PyG take to import; the loaders raise the same errors later for callers that
skip these checks. Used by ``fedkg fit`` and by backends' commands (``fedkg flower up``).
"""

from __future__ import annotations

from pathlib import Path

from lightning_fedkg.config import RELATION_PARTITIONS, ConfigError, ExperimentConfig, too_many_clients

__all__ = ["BUNDLED_ROOT", "bundled_datasets", "check_data_name", "check_num_clients", "relations_up_to",
           "resolve_run_dir"]

#: One folder per bundled dataset (``lightning_fedkg.data.kg_io.BUNDLED_ROOT``, whose module
#: imports torch, so the folder is found from here instead).
BUNDLED_ROOT = Path(__file__).resolve().parent / "data" / "bundled"


def bundled_datasets() -> list[str]:
    """The names of the bundled datasets (``umls``, ...), read from their folders."""
    return sorted(p.name for p in BUNDLED_ROOT.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def check_data_name(cfg: ExperimentConfig) -> None:
    """Raise :class:`ConfigError` unless ``data.name`` is a bundled dataset, an existing path or a
    PyG dataset ``pyg:<Class>@<root>`` whose root holds files (:func:`check_pyg_name`).

    The loaders accept exactly these (the name case-insensitively); checked before the run
    directory is opened, so that a misspelled path leaves no directory behind.
    """
    name = cfg.data.name
    if name.startswith("pyg:"):
        check_pyg_name(name, cfg.data.format)
        return
    bundled = bundled_datasets()
    if name.lower() in bundled:
        # The bundled files are named triples: another data.format cannot be honoured (the
        # loader refuses it too; lightning_fedkg.data.loading.bundled_format_error, not imported:
        # it loads torch).
        if cfg.data.format not in ("auto", "triples"):
            raise ConfigError(f"data.format={cfg.data.format}: the bundled dataset {name!r} is stored as named "
                              f"triples; use data.format=auto or triples with it, or set data.name to a folder "
                              f"in the {cfg.data.format} format")
        return
    if Path(name).exists():
        return
    where = "" if Path(name).is_absolute() else f" (looked in {Path.cwd()})"
    raise ConfigError(f"data.name: {name} is neither a bundled dataset ({', '.join(bundled)}) "
                      f"nor an existing path{where}")


#: The dataset classes of ``lightning_fedkg.data.pyg`` that fill their own root (the bundled KGs).
SELF_FILLING_PYG = ("UMLS", "Nations", "Kinship")


def check_pyg_name(name: str, fmt: str) -> None:
    """Raise :class:`ConfigError` unless ``data.name`` ``pyg:<Class>@<root>`` names a root
    that holds files (``raw/`` or ``processed/``; nothing is downloaded), with
    ``data.format=auto``. Mirrors ``lightning_fedkg.data.pyg.load_pyg_root``, not imported:
    it loads torch."""
    cls, sep, root = name[len("pyg:"):].partition("@")
    if not cls or not sep or not root:
        raise ConfigError(f"data.name: {name}: name a PyG dataset as pyg:<Class>@<root>, "
                          "e.g. pyg:FB15k_237@data/FB15k_237")
    if fmt != "auto":
        raise ConfigError(f"data.format={fmt}: data.name {name} names a PyG dataset class; use data.format=auto")
    if cls in SELF_FILLING_PYG:
        return
    held = [p for sub in ("raw", "processed") if (Path(root) / sub).is_dir() for p in (Path(root) / sub).iterdir()]
    if not held:
        raise ConfigError(f"data.name: {name}: the root {root} holds nothing (no files in {root}/raw or "
                          f"{root}/processed); lightning_fedkg never downloads: put the dataset's raw files "
                          "in <root>/raw (or its processed files in <root>/processed)")


def check_num_clients(cfg: ExperimentConfig) -> None:
    """Raise :class:`ConfigError` where ``data.num_clients`` exceeds the relations a split by
    relation can deal out, if that can be read without loading the KG.

    The partitioners raise the same error, but only once torch is imported and the KG is
    loaded (tens of seconds on a busy machine); here the relation count is read cheaply:
    an OpenKE folder's ``relation2id.txt`` header, or the train file of named triples (the
    bundled KGs), read only until as many relations as clients are seen. Anything else (a
    PyG format, a folder of pre-split clients, an unreadable file) is left to the loaders.
    """
    d = cfg.data
    if cfg.federated.strategy == "none" or d.partition not in RELATION_PARTITIONS:
        return
    relations = relations_up_to(d.name, d.format, d.num_clients)
    if relations is not None and relations < d.num_clients:
        raise too_many_clients(d.name, relations, d.num_clients, d.partition)


def relations_up_to(name: str, fmt: str, limit: int) -> int | None:
    """How many relations the KG ``name`` has, counted up to ``limit``; None where that is not
    cheap to read (see :func:`check_num_clients`). Mirrors the loaders' file lookup
    (``lightning_fedkg.data.loading.load_kg``, not imported: it loads torch)."""
    folder = BUNDLED_ROOT / name.lower() if name.lower() in bundled_datasets() else Path(name)
    if not folder.is_dir() or (folder / "client_0").is_dir() or (folder / "0").is_dir():
        return None
    if fmt == "openke" or (fmt == "auto" and (folder / "entity2id.txt").is_file()):
        # the vocabulary's count: at least the relations that occur, so fewer is conclusive
        vocabulary = folder / "relation2id.txt"
        if not vocabulary.is_file():
            return None
        with open(vocabulary, encoding="utf-8") as f:
            header = f.readline().strip()
        return int(header) if header.isdigit() else None
    if fmt not in ("auto", "triples"):
        return None
    train = next((p for sub in (folder, folder / "raw") for p in (sub / "train.txt", sub / "train.tsv")
                  if p.is_file()), None)
    if train is None:
        return None
    # Evaluation triples with a relation train lacks are dropped on loading: the train
    # file's relations are those a split deals out.
    relations: set[str] = set()
    with open(train, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            fields = line.strip().split("\t" if "\t" in line else None)
            if len(fields) != 3:
                return None  # a malformed line: the loader names it
            relations.add(fields[1])
            if len(relations) >= limit:
                break
    return len(relations)


def resolve_run_dir(cfg: ExperimentConfig, out: str | None) -> Path:
    """``--out`` if given, else ``<out_dir>/<name>`` of the config."""
    return Path(out) if out else Path(cfg.out_dir) / cfg.name

