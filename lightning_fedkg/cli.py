"""The ``fedkg`` command line.

    fedkg fit  -c CONFIG [key=value ...] [--out DIR]    train what the config describes
    fedkg test -c CONFIG --ckpt PATH [key=value ...]     evaluate a saved checkpoint
    fedkg data stats NAME_OR_PATH                        print dataset statistics

Overrides are omegaconf dotlist entries (``model.dim=64 federated.rounds=10``); a
misspelled key is an error listing the valid keys.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Sequence

from lightning_fedkg.config import ConfigError, ExperimentConfig, load_config
from lightning_fedkg.rundir import RunDirectory
from lightning_fedkg.data.kg import KGFormatError

log = logging.getLogger("lightning_fedkg")

TABLE_KEYS = ("mrr", "mr", "hits@1", "hits@3", "hits@5", "hits@10")


def format_metrics_table(metrics: dict) -> str:
    """A readable table of a ``metrics.json`` dict (FedE-Table-3 style when federated)."""
    if "clients" in metrics:
        from lightning_fedkg.federated.orchestrator import format_table

        return format_table(metrics)
    header = f"{'':<10}" + "".join(f"{k:>10}" for k in TABLE_KEYS)
    lines = [header, "-" * len(header)]

    def row(label: str, values: dict) -> str:
        cells = []
        for k in TABLE_KEYS:
            v = values.get(k)
            cells.append(f"{v:>10.1f}" if k == "mr" and v is not None else f"{v:>10.4f}" if v is not None else f"{'-':>10}")
        return f"{label:<10}" + "".join(cells)

    lines.append(row("test", metrics["test"]))
    return "\n".join(lines)


def quiet_known_warnings() -> None:
    """Silence Lightning warnings that are expected for our data loaders."""
    # Our loaders are in-process IterableDatasets with an exact __len__ (no workers), and
    # tiny KGs have fewer batches than the logging interval.
    warnings.filterwarnings("ignore", message=".*IterableDataset.*__len__.*")
    warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def resolve_run_dir(cfg: ExperimentConfig, out: str | None) -> Path:
    return Path(out) if out else Path(cfg.out_dir) / cfg.name


def cmd_fit(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    run_dir = resolve_run_dir(cfg, args.out)
    # Locked and checked against the run it may hold before anything in it is written.
    with RunDirectory.open(run_dir, cfg):
        print(f"run directory: {run_dir}")
        if cfg.federated.strategy == "none":
            from lightning_fedkg.training import run_kge

            metrics = run_kge(cfg, run_dir)
        else:
            from lightning_fedkg.federated.orchestrator import run_federated

            metrics = run_federated(cfg, run_dir)
    print(format_metrics_table(metrics))
    print(f"metrics written to {run_dir / 'metrics.json'}")
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    if cfg.federated.strategy == "none":
        from lightning_fedkg.training import evaluate_kge_checkpoint

        metrics = evaluate_kge_checkpoint(cfg, args.ckpt)
    else:
        from lightning_fedkg.federated.orchestrator import evaluate_federated_checkpoint

        metrics = evaluate_federated_checkpoint(cfg, args.ckpt)
    print(format_metrics_table(metrics))
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_data_stats(args: argparse.Namespace) -> int:
    from lightning_fedkg.data import load_federated, load_kg

    target = args.target
    path = Path(target)
    if path.is_dir() and ((path / "client_0").is_dir() or (path / "0").is_dir()):
        fkg = load_federated(target)
        rows = fkg.stats()
        print(f"{fkg.name}: {fkg.num_clients} clients, {fkg.num_entities} entities, {fkg.num_relations} relations")
        keys = ["entities", "relations", "train", "valid", "test"]
        extra = sorted({k for r in rows for k in r if k not in keys and isinstance(r[k], int)})
        keys += extra
        print(f"{'client':<8}" + "".join(f"{k:>11}" for k in keys))
        for i, r in enumerate(rows):
            print(f"{i:<8}" + "".join(f"{r.get(k, ''):>11}" for k in keys))
        return 0
    kg = load_kg(target)
    stats = kg.stats()
    width = max(len(k) for k in stats)
    for k, v in stats.items():
        print(f"{k:<{width}}  {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedkg", description="Federated knowledge-graph embedding.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    fit = sub.add_parser("fit", help="train what a config describes (resumes a run directory)")
    fit.add_argument("-c", "--config", help="YAML config file")
    fit.add_argument("--out", help="run directory (default: <out_dir>/<name>)")
    fit.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.dim=64")
    fit.set_defaults(func=cmd_fit)

    test = sub.add_parser("test", help="evaluate a checkpoint on the test split")
    test.add_argument("-c", "--config", help="YAML config file (the run's config.yaml works)")
    test.add_argument("--ckpt", required=True, help="checkpoint file")
    test.add_argument("overrides", nargs="*", help="key=value overrides")
    test.set_defaults(func=cmd_test)

    data = sub.add_parser("data", help="dataset utilities")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    stats = data_sub.add_parser("stats", help="print statistics of a dataset")
    stats.add_argument("target", help="bundled name (umls, nations, kinship) or folder")
    stats.set_defaults(func=cmd_data_stats)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Only our logger gets a handler (once): Lightning already prints its own messages.
    if not any(getattr(h, "_fedkg_cli", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._fedkg_cli = True
        log.addHandler(handler)
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    quiet_known_warnings()
    try:
        return args.func(args)
    except (ConfigError, KGFormatError, FileNotFoundError) as err:
        print(f"fedkg: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
