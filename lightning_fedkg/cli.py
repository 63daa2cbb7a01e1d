"""The ``fedkg`` command line.

    fedkg fit  -c CONFIG [--out DIR] [key=value ...]    train what the config describes
    fedkg test -c CONFIG --ckpt PATH [key=value ...]     evaluate a saved checkpoint (--json: as JSON)
    fedkg audit --from RUN_DIR                           attack a run's recorded payloads
    fedkg data stats NAME_OR_PATH | -c CONFIG            dataset or query-set statistics
    fedkg data synth --entities N ... --out DIR          write a synthetic power-law KG
    fedkg flower up | split | policy | worker            run on Flower across processes
    fedkg --version                                      print the installed version

``fedkg query`` / ``unlearn`` are the methods' commands and ``fedkg flower`` the Flower
backend's (:data:`~lightning_fedkg.registry.COMMANDS`: built-ins and ``lightning_fedkg.commands``
entry points). Overrides (``model.dim=64``) may come anywhere; a bad key lists the valid ones.
Reference: docs/usage.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Sequence

# Only light modules at import time: ``fedkg --help`` and argument errors must not pay for
# torch, Lightning and PyG (seconds); the commands import them when they run.
from lightning_fedkg.config import ConfigError, ExperimentConfig, load_config, resolve_auto_settings
from lightning_fedkg.preflight import check_data_name, check_num_clients, resolve_run_dir
from lightning_fedkg.reports import format_metrics_table
from lightning_fedkg.rundir import check_unlocked, read_run_config
from lightning_fedkg.runtime import EXPECTED_WARNINGS

log = logging.getLogger("lightning_fedkg")


class _StderrHandler(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a record is emitted.

    ``main`` may run several times in one process (tests, notebooks) while ``sys.stderr``
    is swapped; a handler bound to the stream of the first call would write to a closed one.
    """

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the property decides
        pass


class _DropTips(logging.Filter):
    """Drops Lightning's advertisements ("💡 Tip: ... try installing litlogger/litmodels")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡")


_DROP_TIPS = _DropTips()
#: The loggers Lightning's ``rank_zero_info`` writes to (PyTorch Lightning, then Fabric).
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


def quiet_known_warnings() -> None:
    """Silence Lightning warnings that are expected for our data loaders, and its tips."""
    for message in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if _DROP_TIPS not in logger.filters:
            logger.addFilter(_DROP_TIPS)


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (config, data files, paths): message, exit status 2.

    ``KGFormatError`` (the data layer) and ``CheckpointError`` (a damaged federated
    checkpoint; the message names the file and what to delete) live in modules that import
    torch; each can only have been raised if its module is loaded, so they are looked up
    instead of imported.
    """
    types: list[type[BaseException]] = [ConfigError, FileNotFoundError]
    for module, name in (("lightning_fedkg.data.kg", "KGFormatError"),
                         ("lightning_fedkg.federated.checkpoint", "CheckpointError")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            types.append(getattr(loaded, name))
    return tuple(types)


def cmd_fit(args: argparse.Namespace) -> int:
    """``fedkg fit``: train what the config describes in its run directory (or resume it)."""
    # What can be checked without importing torch comes first: the core sections, the data
    # path and the lock (a mistake there is reported in a fraction of a second).
    core = load_config(args.config, args.overrides, core_only=True)
    check_data_name(core)
    check_num_clients(core)
    run_dir = resolve_run_dir(core, args.out)
    check_unlocked(run_dir)
    # What an interrupt's message names: the run directory and the command that resumes it.
    args.run_dir, args.resume_words = run_dir, ["fedkg", "fit", "-c", args.config, "--out", str(run_dir),
                                                *args.overrides]
    cfg = load_config(args.config, args.overrides)
    print(f"run directory: {run_dir}")
    from lightning_fedkg.run import fit

    # fit locks the run directory, checks and saves the config, sets threads and seeds.
    metrics = fit(cfg, run_dir)
    print(format_metrics_table(metrics, cfg))
    print(f"metrics written to {run_dir / 'metrics.json'}")
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    """``fedkg test``: evaluate a checkpoint on the test split; print its table, or with
    ``--json`` the metrics as JSON (the ``metrics.json`` layout) instead."""
    if args.from_run:
        # A finished run evaluates itself: its config.yaml, its best state; nothing is written.
        # Overrides change how it is tested (e.g. larger query sets), not the state.
        from lightning_fedkg.run import best_state
        from lightning_fedkg.rundir import CONFIG_FILE

        cfg = read_run_config(args.from_run)  # refuses a folder that is not a run
        if args.overrides:
            tested = load_config(Path(args.from_run) / CONFIG_FILE, args.overrides)
            check_tested_as_trained(args.from_run, cfg, tested)
            cfg = tested
        ckpt = best_state(args.from_run, cfg)
        stopped = unfinished(Path(args.from_run), cfg)
    else:
        if not args.config or not args.ckpt:
            raise ConfigError("fedkg test needs -c CONFIG and --ckpt PATH, or --from RUN_DIR")
        cfg, ckpt = load_config(args.config, args.overrides), args.ckpt
        stopped = None
    cfg = resolve_auto_settings(cfg)
    from lightning_fedkg.run import evaluate

    metrics = evaluate(cfg, ckpt)
    if stopped is not None:
        # A killed run's best state so far is not its result: say so where the numbers go.
        metrics["unfinished"] = stopped
        print(stopped["message"], file=sys.stderr if args.json else sys.stdout)
    print(json.dumps(metrics, indent=2) if args.json else format_metrics_table(metrics, cfg))
    return 0


def check_tested_as_trained(run_dir: str, saved: ExperimentConfig, tested: ExperimentConfig) -> None:
    """Raise :class:`ConfigError` naming every override of ``test --from run_dir`` that
    changes what the run trained (:func:`~lightning_fedkg.config.trained_differences`):
    its state cannot be tested as another model (``model.dim=32`` would fail to load it,
    ``model.gamma`` would score with another function), so this is refused before the
    state is read."""
    from lightning_fedkg.config import trained_differences

    changed = trained_differences(saved, tested)
    if changed:
        raise ConfigError(f"test --from {run_dir}: {'; '.join(changed)}: this changes what the run trained "
                          f"(its data split, the model's shape or scores), and --from tests the run's own state; "
                          f"override only how it is tested (e.g. train.eval_batch_size, task.eval_per_type), or "
                          f"train a new run with these settings (fedkg fit -c {Path(run_dir) / 'config.yaml'} "
                          f"--out NEW_DIR ...)")


def unfinished(run_dir: Path, cfg: ExperimentConfig) -> dict | None:
    """None for a finished run (its ``metrics.json``, written last, exists); else where it
    stopped: ``{"unit", "stopped_after", "of", "best", "message"}`` (``best``: the round of
    the best state so far, None where there is no ``best.json``)."""
    import shlex

    if (run_dir / "metrics.json").is_file():
        return None
    ckpt_dir = run_dir / "checkpoints"
    if cfg.federated.strategy == "none":
        # Lightning's last.ckpt records the 0-based epoch it was saved in, at that epoch's end.
        import torch

        last = ckpt_dir / "last.ckpt"
        epoch = torch.load(last, map_location="cpu", weights_only=False)["epoch"] + 1 if last.is_file() else None
        unit, stopped, total, best = "epoch", epoch, cfg.train.max_epochs, None
    else:
        from lightning_fedkg.federated.checkpoint import latest_manifest, read_manifest
        from lightning_fedkg.federated.peer import is_peer_strategy

        manifest = latest_manifest(ckpt_dir)
        stopped = read_manifest(manifest)["round"] if manifest is not None else None
        best_path = ckpt_dir / "best.json"
        best = read_manifest(best_path).get("round") if best_path.is_file() else None
        unit = "event" if is_peer_strategy(cfg.federated.strategy) else "round"
        total = cfg.federated.rounds
    where = f"stopped after {unit} {stopped} of {total}" if stopped is not None else "stopped before its first commit"
    so_far = f" ({unit} {best})" if best is not None else ""
    message = (f"unfinished run: {run_dir} {where} (no metrics.json); these are its best state so far{so_far}; "
               f"resume it with: {shlex.join(['fedkg', 'fit', '-c', str(run_dir / 'config.yaml'), '--out', str(run_dir)])}")
    return {"unit": unit, "stopped_after": stopped, "of": total, "best": best, "message": message}


def cmd_audit(args: argparse.Namespace) -> int:
    """``fedkg audit``: a server-side reconstruction attack on a finished run's payloads."""
    from lightning_fedkg.privacy.audit import AuditSettings, format_audit_table, run_audit

    source = Path(args.from_run)
    read_run_config(source)  # a run directory, or an error that says so
    out = Path(args.out) if args.out else source.with_name(source.name + "-audit")
    settings = AuditSettings(known=args.known, seed=args.seed, epochs=args.epochs)
    result = run_audit(source, out, settings, victims=args.victim or None,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_audit_table(result))
    print(f"audit written to {out / 'audit.json'}")
    return 0


def _print_clients(fkg) -> None:
    """One line for the federation, one row per client: its graph's sizes and splits."""
    rows = fkg.stats()
    print(f"{fkg.name}: {fkg.num_clients} clients, {fkg.num_entities} entities, {fkg.num_relations} relations")
    keys = ["entities", "relations", "train", "valid", "test"]
    # Further integer columns are extra splits (FedLU's unlearn); "client" is the row label.
    keys += sorted({k for r in rows for k in r if k not in keys and k != "client" and isinstance(r[k], int)})
    print(f"{'client':<8}" + "".join(f"{k:>11}" for k in keys))
    for r in rows:
        print(f"{r['client']:<8}" + "".join(f"{r.get(k, ''):>11}" for k in keys))


def _task_data_stats(config: str, overrides: list[str], workers: int = 1) -> int:
    """Per client its graph, then the statistics of the data the config's task builds
    beyond the graphs (:meth:`~lightning_fedkg.federated.tasks.Task.data_stats`)."""
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.registry import TASKS

    cfg = load_config(config, overrides)
    task = TASKS.get(cfg.federated.task)
    if not task.has_data_stats:
        raise ConfigError(f"{config} is a {cfg.federated.task!r} config, whose task builds no data beyond the "
                          f"graphs; -c describes a task's own data (e.g. query sets), a graph is described "
                          f"by name or folder")
    fkg = load_federated_kg(cfg)
    _print_clients(fkg)
    print(task().data_stats(cfg, fkg, workers=workers))
    return 0


def cmd_data_stats(args: argparse.Namespace) -> int:
    """``fedkg data stats``: sizes of a KG, or of every client of a federated folder, or with
    ``-c`` a config's federation and its task's own data (a query-answering config's query sets)."""
    from lightning_fedkg.data import load_federated, load_kg

    if args.workers < 1:
        raise ConfigError(f"data stats: --workers must be at least 1, got {args.workers}")
    if args.config:
        return _task_data_stats(args.config, args.target, args.workers)
    if len(args.target) != 1:
        raise ConfigError("data stats: give one dataset (a bundled name or a folder), or -c CONFIG for query sets")
    target = args.target[0]
    path = Path(target)
    if path.is_dir() and ((path / "client_0").is_dir() or (path / "0").is_dir()):
        _print_clients(load_federated(target))
        return 0
    kg = load_kg(target)
    stats = kg.stats()
    width = max(len(k) for k in stats)
    for k, v in stats.items():
        print(f"{k:<{width}}  {v}")
    return 0


def cmd_data_synth(args: argparse.Namespace) -> int:
    """``fedkg data synth``: write a synthetic power-law KG folder
    (:func:`lightning_fedkg.data.synthetic.write_synthetic`) and print its split sizes."""
    from lightning_fedkg.data.synthetic import write_synthetic

    try:
        sizes = write_synthetic(args.out, args.entities, args.relations, args.triples, args.exponent, args.seed,
                                args.valid, args.test)
    except ValueError as err:
        raise ConfigError(f"data synth: {err}") from None
    print(f"{args.out}: " + ", ".join(f"{split} {count}" for split, count in sizes.items()))
    return 0


def package_version() -> str:
    """The installed ``lightning-fedkg`` distribution's version, else the package's own
    ``__version__`` (a source checkout on ``PYTHONPATH``, not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lightning-fedkg")
    except PackageNotFoundError:
        from lightning_fedkg import __version__

        return __version__


def fit_epilog() -> str:
    """What ``fedkg fit --help`` lists below the options: the config's sections and keys,
    and the names a config can give (from the registries, without importing a method)."""
    import typing

    from lightning_fedkg.registry import MODELS, PHASES, STRATEGIES

    types = typing.get_type_hints(ExperimentConfig)  # the fields' annotations are strings
    sections = [f"  {name:<10} {', '.join(g.name for g in dataclasses.fields(kind))}"
                if dataclasses.is_dataclass(kind) else f"  {name}" for name, kind in types.items()]
    return "\n".join([
        "config sections and their keys (override any as section.key=value):", *sections,
        "  federated.<strategy>  the named strategy's own settings; <phase> likewise (e.g. unlearn)",
        "",
        f"federated.strategy: none (one KG), {', '.join(STRATEGIES.names())}, or package.module:Class",
        f"model.name:         {', '.join(MODELS.names())}, or package.module:Class",
        f"phases:             {', '.join(PHASES.names())}",
    ])


def add_plugin_commands(sub) -> None:
    """Add the commands methods and backends contribute (:data:`~lightning_fedkg.registry.COMMANDS`:
    FedLU's ``unlearn``, FedCQA's ``query``, Flower's ``flower``). One that cannot be loaded is left out with a warning,
    so that a broken plugin does not take every other command with it."""
    from lightning_fedkg.registry import COMMANDS, RegistryError

    for name in COMMANDS.names():
        try:
            command = COMMANDS.get(name)
        except RegistryError as err:
            print(f"fedkg: warning: {err}", file=sys.stderr)
            continue
        command.add_to(sub, name)


class IntermixedParser(argparse.ArgumentParser):
    """A parser whose positionals (a command's ``key=value`` overrides) may come before,
    between and after its options: ``fedkg fit -c X a=1 --out D b=2``.

    Plain argparse takes only the first run of positionals and refuses the rest as
    "unrecognized arguments". A parser with sub-commands cannot be parsed intermixed
    (argparse raises TypeError), so only a command's own parser (a leaf) is; sub-parsers
    are called through ``parse_known_args``, hence the override here.
    """

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing or any(a.nargs in (argparse.PARSER, argparse.REMAINDER)
                                    for a in self._get_positional_actions()):
            return super().parse_known_args(args, namespace)
        # parse_known_intermixed_args calls parse_known_args itself (Python 3.11, 3.12): the
        # flag sends those calls to argparse's own.
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser() -> argparse.ArgumentParser:
    """The ``fedkg`` argument parser: fit, test, the commands methods and backends add
    (:func:`add_plugin_commands`: query, unlearn, flower), audit, data stats."""
    parser = argparse.ArgumentParser(prog="fedkg", description="Federated knowledge-graph embedding.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"fedkg {package_version()}")
    # Every command's parser (and a group's, flower's: its commands inherit the class) takes
    # its overrides on either side of its options.
    sub = parser.add_subparsers(dest="command", required=True, parser_class=IntermixedParser)

    fit = sub.add_parser("fit", help="train what a config describes (resumes a run directory)",
                         epilog=fit_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    fit.add_argument("-c", "--config", required=True, help="YAML config file")
    fit.add_argument("--out", help="run directory (default: <out_dir>/<name>)")
    fit.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.dim=64")
    fit.set_defaults(func=cmd_fit)

    test = sub.add_parser("test", help="evaluate a checkpoint on the test split")
    test.add_argument("-c", "--config", help="YAML config file (the run's config.yaml works)")
    test.add_argument("--ckpt", help="checkpoint: a single-KG .ckpt, or a federated run's checkpoints/*.json")
    test.add_argument("--from", dest="from_run", metavar="RUN_DIR",
                      help="evaluate a finished run's best state with its own config (writes nothing)")
    test.add_argument("--json", action="store_true", help="print the metrics as JSON instead of the table")
    test.add_argument("overrides", nargs="*",
                      help="key=value overrides (with --from: of the run's own config, e.g. task.eval_per_type=5000)")
    test.set_defaults(func=cmd_test)

    add_plugin_commands(sub)

    audit = sub.add_parser("audit", help="attack a finished run's recorded payloads as a curious server would")
    audit.add_argument("--from", dest="from_run", metavar="RUN_DIR", required=True,
                       help="a finished run with federated.record_payloads=true (only read)")
    audit.add_argument("--out", help="output folder for audit.json (default: RUN_DIR-audit)")
    audit.add_argument("--known", type=float, default=0.1,
                       help="fraction of the victim's training triples the attacker knows, in (0, 1) (default 0.1)")
    audit.add_argument("--victim", action="append", help="a client to attack (repeatable; default: every client)")
    audit.add_argument("--seed", type=int, default=0, help="which triples are known; the attacker's init")
    audit.add_argument("--epochs", type=int, default=300, help="the attacker's fitting epochs (default 300)")
    audit.set_defaults(func=cmd_audit)

    data = sub.add_parser("data", help="dataset utilities")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    stats = data_sub.add_parser("stats", help="print statistics of a dataset")
    stats.add_argument("target", nargs="*", help="bundled name (umls, nations, kinship) or folder; "
                       "with -c, key=value overrides of the config")
    stats.add_argument("-c", "--config", help="a query-answering config: statistics of its query sets "
                       "(sampled, or loaded from task.cache_dir)")
    stats.add_argument("--workers", type=int, default=1,
                       help="with -c: sample the query sets missing from the cache in this many processes "
                            "(default 1)")
    stats.set_defaults(func=cmd_data_stats)
    synth = data_sub.add_parser("synth", help="write a synthetic KG with power-law entity degrees")
    synth.add_argument("--entities", type=int, required=True, help="entities (each one occurs in train)")
    synth.add_argument("--relations", type=int, required=True, help="relations (each one occurs in train)")
    synth.add_argument("--triples", type=int, required=True, help="distinct triples over all three splits")
    synth.add_argument("--exponent", type=float, default=0.75,
                       help="Zipf exponent of the entities' popularity (default 0.75: degree tail ~ k^-2.3)")
    synth.add_argument("--seed", type=int, default=0, help="the same seed writes the same files (default 0)")
    synth.add_argument("--valid", type=float, default=0.05, help="fraction of the triples in valid (default 0.05)")
    synth.add_argument("--test", type=float, default=0.05, help="fraction of the triples in test (default 0.05)")
    synth.add_argument("--out", required=True, help="folder for {train,valid,test}.txt")
    synth.set_defaults(func=cmd_data_synth)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fedkg`` with ``argv``; returns the exit status (2 for bad input)."""
    args = build_parser().parse_args(argv)
    # Only our logger gets a handler (once): Lightning already prints its own messages.
    if not any(getattr(h, "_fedkg_cli", False) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._fedkg_cli = True
        log.addHandler(handler)
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    quiet_known_warnings()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return interrupted(args)
    except SystemExit as exit:
        # Lightning's trainer turns Ctrl-C into "graceful shutdown" + sys.exit(1), raised while
        # it handles the KeyboardInterrupt: that is still an interrupt, not a failure.
        if isinstance(exit.__context__, KeyboardInterrupt):
            return interrupted(args)
        raise
    except Exception as err:
        if not isinstance(err, user_error_types()):
            raise
        print(f"fedkg: error: {err}", file=sys.stderr)
        return 2


#: The exit status of a command stopped by Ctrl-C (128 + SIGINT, what shells report).
INTERRUPTED = 130


def interrupted(args: argparse.Namespace) -> int:
    """Say that ``args``'s command was interrupted and, for a training command whose run
    directory is known, the command that resumes it; returns :data:`INTERRUPTED`.

    Every round (an epoch for a single-KG run) is committed whole or not at all, so running
    the same command again continues from the last committed one (docs/usage.md#resuming).
    """
    import shlex

    run_dir = getattr(args, "run_dir", None)
    if run_dir is None:
        print("fedkg: interrupted", file=sys.stderr)
    else:
        print(f"fedkg: interrupted; {run_dir} keeps its last committed round (or epoch), and this command "
              f"resumes from it: {shlex.join(args.resume_words)}", file=sys.stderr)
    return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
