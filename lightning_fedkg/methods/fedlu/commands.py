"""``fedkg unlearn``: FedLU's unlearning of a finished run, as a ``fedkg`` sub-command.

Light at import (``fedkg`` imports it to build its parser): the work is imported in
:meth:`Unlearn.run`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_fedkg.commands import Command
from lightning_fedkg.config import load_config, resolve_auto_settings
from lightning_fedkg.rundir import read_run_config
from lightning_fedkg.runtime import config_table_elements, configure_torch

from .report import format_unlearning_table

__all__ = ["Unlearn"]


class Unlearn(Command):
    """``fedkg unlearn``: forget triples from a finished run into a new run directory."""

    help = "forget triples from a finished federated run (FedLU)"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-c", "--config", help="YAML config of the source run with an unlearn section "
                                                   "(default: the source run's config.yaml)")
        parser.add_argument("--from", dest="from_run", metavar="RUN_DIR", required=True,
                            help="the finished run to unlearn from (only read)")
        parser.add_argument("--out", help="new run directory (default: RUN_DIR-unlearn)")
        parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. unlearn.forget=sample")

    @classmethod
    def run(cls, args: argparse.Namespace) -> int:
        from .phase import run_unlearn

        source = Path(args.from_run)
        read_run_config(source)  # a run directory, or an error that says so
        # Without -c the source run's own config is the base; overrides apply either way.
        cfg = load_config(args.config or source / "config.yaml", args.overrides, sections=("unlearn",))
        configure_torch(cfg.trainer, config_table_elements(cfg))
        out = Path(args.out) if args.out else source.with_name(source.name + "-unlearn")
        print(f"unlearning run directory: {out}")
        metrics = run_unlearn(resolve_auto_settings(cfg), source, out)
        print(format_unlearning_table(metrics))
        print(f"metrics written to {out / 'metrics.json'}")
        return 0
