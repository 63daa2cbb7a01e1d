"""``fedkg flower up | split | policy | worker``: the Flower backend's command, a
:class:`~lightning_fedkg.commands.Command` registered as ``flower``
(:data:`~lightning_fedkg.registry.COMMANDS`).

Light at import (``fedkg`` imports it to build its parser): Flower, torch and the rest of
this package are imported by the sub-command that runs.
"""

from __future__ import annotations

import argparse

from lightning_fedkg.commands import Command
from lightning_fedkg.config import load_config, resolve_auto_settings
from lightning_fedkg.preflight import check_data_name, check_num_clients, resolve_run_dir
from lightning_fedkg.reports import format_metrics_table

__all__ = ["Flower"]


def flower_up(args: argparse.Namespace) -> int:
    """``fedkg flower up``: a Flower deployment on this machine (a SuperLink and one SuperNode
    per client, separate processes) runs the config; prints its table."""
    core = load_config(args.config, args.overrides, core_only=True)
    check_data_name(core)
    check_num_clients(core)
    run_dir = resolve_run_dir(core, args.out)  # up() waits for a previous server to let go of it
    args.run_dir, args.resume_words = run_dir, ["fedkg", "flower", "up", "-c", args.config, "--out", str(run_dir),
                                                *(["--key-file", args.key_file] if args.key_file else []),
                                                *(["--tls"] if args.tls else []), *args.overrides]
    cfg = load_config(args.config, [*args.overrides, "federated.backend=flower", "federated.flower.mode=deployment"])
    from lightning_fedkg.backends.flower.deploy import localhost_certificates, up

    print(f"run directory: {run_dir} (Flower logs in {run_dir / 'flower' / 'logs'})")
    tls = localhost_certificates(run_dir / "flower" / "tls") if args.tls else None
    metrics = up(resolve_auto_settings(cfg), run_dir, key_file=args.key_file, port=args.port, tls=tls)
    print(format_metrics_table(metrics, cfg))
    print(f"metrics written to {run_dir / 'metrics.json'}")
    return 0


def flower_split(args: argparse.Namespace) -> int:
    """``fedkg flower split``: one data folder per client of the config's federation."""
    cfg = load_config(args.config, args.overrides)
    check_num_clients(cfg)
    from lightning_fedkg.backends.flower.data import write_client_folders

    for folder in write_client_folders(cfg, args.out):
        print(folder)
    return 0


def flower_policy(args: argparse.Namespace) -> int:
    """``fedkg flower policy``: an organisation's client policy, from the config it agrees to."""
    cfg = load_config(args.config, args.overrides)
    from lightning_fedkg.privacy.policy import write_policy

    print(f"client policy written to {write_policy(cfg, args.out)}: put it beside the client's key file")
    return 0


def flower_worker(args: argparse.Namespace) -> int:
    """``fedkg flower worker``: one client's long-lived worker beside its SuperNode."""
    from lightning_fedkg.backends.flower.worker import serve

    serve({"data-path": args.data_path, "key-file": args.key_file, "work-dir": args.work_dir}, args.socket)
    return 0


class Flower(Command):
    """``fedkg flower``: run a config on Flower across processes, or prepare what each
    organisation's client is given (its data folder, its policy), or run a client's worker."""

    help = "run on Flower across processes (the flower extra)"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        flower_sub = parser.add_subparsers(dest="flower_command", required=True)
        up = flower_sub.add_parser("up", help="a SuperLink and one SuperNode per client on this machine run the config")
        up.add_argument("-c", "--config", required=True, help="YAML config file")
        up.add_argument("--out", help="run directory (default: <out_dir>/<name>); a committed run resumes")
        up.add_argument("--key-file", help="federation-key file the SuperNodes read (default: "
                                           "<run>/flower/federation.key, written once with a random secret)")
        up.add_argument("--port", type=int, help="the SuperLink's port (default: a free one)")
        up.add_argument("--tls", action="store_true", help="connect to the SuperLink over TLS, with a throwaway CA and "
                                                           "certificate for this machine (<run>/flower/tls/)")
        up.add_argument("overrides", nargs="*", help="key=value overrides")
        split = flower_sub.add_parser("split", help="write one data folder per client (what each SuperNode is given)")
        split.add_argument("-c", "--config", required=True, help="YAML config file (its data section)")
        split.add_argument("--out", required=True, help="folder for client_<k>/")
        split.add_argument("overrides", nargs="*", help="key=value overrides")
        policy = flower_sub.add_parser("policy", help="write an organisation's client policy (what its client reveals) "
                                                      "from the config it agrees to")
        policy.add_argument("-c", "--config", required=True, help="YAML config file")
        policy.add_argument("--out", required=True, help="the policy file, beside the client's key file "
                                                         "(e.g. /secrets/policy.yaml)")
        policy.add_argument("overrides", nargs="*", help="key=value overrides")
        worker = flower_sub.add_parser("worker", help="one client's long-lived worker beside its SuperNode (keeps the "
                                                      "party in memory between messages)")
        worker.add_argument("--data-path", required=True, help="the client's data folder (as its SuperNode's)")
        worker.add_argument("--key-file", required=True, help="the federation-key file (as its SuperNode's)")
        worker.add_argument("--work-dir", required=True, help="where the client keeps its states (as its SuperNode's)")
        worker.add_argument("--socket", required=True, help="Unix socket to listen at; give the SuperNode "
                                                            "--node-config \"... worker-socket='SOCKET'\"")

    @classmethod
    def run(cls, args: argparse.Namespace) -> int:
        return {"up": flower_up, "split": flower_split, "policy": flower_policy,
                "worker": flower_worker}[args.flower_command](args)
