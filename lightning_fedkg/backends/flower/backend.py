"""``federated.backend=flower``: the server's side of a run, in simulation or deployment.

:func:`serve` is what a ServerApp runs: the core's one run skeleton
(:func:`~lightning_fedkg.federated.runner.run_loop`) with :class:`FlowerRoundLoop`, the
in-process :class:`~lightning_fedkg.federated.round_loop.RoundLoop` whose clients are a
:class:`~.server.FlowerClients` pool. Resuming, checkpoints, ``metrics.json``,
TensorBoard and the wire log are the core's; a restarted ServerApp resumes from the last
committed round and the clients go back to the states that round points to.

:class:`FlowerBackend` is the backend ``fedkg fit`` finds for ``federated.backend=flower``:
with ``federated.flower.mode=simulation`` it starts Flower's simulation engine (Ray) with
one SuperNode per client on this machine; ``deployment`` is a run submitted to a SuperLink
(``fedkg flower up``, :mod:`.deploy`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

from lightning_fedkg.config import ConfigError, ExperimentConfig, resume_fingerprint
from lightning_fedkg.federated.round_loop import RoundLoop
from lightning_fedkg.federated.runner import run_loop

__all__ = ["FlowerBackend", "FlowerRoundLoop", "serve_process", "FlowerNotInstalledError", "require", "serve", "run_identity",
           "client_config_text", "write_key_file", "provision_beside_key", "simulate"]


class FlowerNotInstalledError(ConfigError, ImportError):
    """``federated.backend=flower`` without Flower installed."""


def require() -> None:
    """Raise :class:`FlowerNotInstalledError` (saying how to install it) without flwr."""
    try:
        import flwr  # noqa: F401
    except ImportError as err:
        raise FlowerNotInstalledError(f'federated.backend=flower needs Flower, which is not installed ({err}): '
                                      f'pip install "lightning-fedkg[flower]"') from None


def run_identity(cfg: ExperimentConfig, run_dir: str | Path) -> str:
    """The run's id at the clients: its settings (those a resume must keep) and folder name."""
    text = json.dumps({"settings": resume_fingerprint(cfg), "run": Path(run_dir).resolve().name}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def client_config_text(cfg: ExperimentConfig) -> str:
    """The config the clients are sent: the run's, without the federation secret (each
    client reads it from its own key file)."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    container["federated"]["federation_key"] = ""
    return OmegaConf.to_yaml(OmegaConf.create(container))


class FlowerRoundLoop(RoundLoop):
    """The round loop with Flower clients; ``metrics.json`` gains a ``flower`` block
    (the backend's mode, the registered clients, the nodes turned away)."""

    def results(self) -> dict:
        metrics = super().results()
        pool = self.federation.pool
        metrics["flower"] = {"mode": self.cfg.federated.flower.mode, "clients": list(pool.names),
                             "rejected": list(pool.rejections)}
        return metrics


def serve(grid, cfg: ExperimentConfig, run_dir: str | Path, num_clients: int, resume: bool = True) -> dict:
    """Run ``cfg`` in ``run_dir`` with the ``num_clients`` clients of ``grid`` (a ServerApp's
    main). ``run_dir`` is open: by :func:`lightning_fedkg.run.fit` in simulation, by
    :func:`serve_process` in deployment. The ServerApp sets up and seeds its own thread, as in
    deployment its own process, and as the clients do theirs."""
    from lightning_fedkg.backends.flower.server import FlowerClients
    from lightning_fedkg.runtime import prepare_process

    prepare_process(cfg)
    run_id, text = run_identity(cfg, run_dir), client_config_text(cfg)
    pool = functools.partial(FlowerClients, grid=grid, num_clients=num_clients, run_id=run_id, config_text=text)
    build = functools.partial(FlowerRoundLoop, clients=pool)
    return run_loop(cfg, run_dir, build, RoundLoop.version, resume)


def serve_process(grid, cfg: ExperimentConfig, run_dir: str | Path, num_clients: int, resume: bool = True) -> dict:
    """:func:`serve` in a deployment's ServerApp process, which no ``fedkg fit`` reaches: it
    opens ``run_dir`` itself (locked, checked, ``config.yaml`` saved) for the run."""
    from lightning_fedkg.rundir import RunDirectory

    with RunDirectory.open(run_dir, cfg):
        return serve(grid, cfg, run_dir, num_clients, resume)


def write_key_file(secret: str, path: str | Path) -> Path:
    """Write the federation secret readable by its owner only (``0600``, also over an
    existing file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # open's mode applies to a new file only: an existing one keeps its bits, so set them
    # before the secret is written
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path


def provision_beside_key(cfg: ExperimentConfig, key_file: str | Path, data: list[Path]) -> None:
    """Beside ``key_file``, where each :class:`~.client.ClientRuntime` reads them: the
    clients' policy (``policy.yaml``, :mod:`~lightning_fedkg.privacy.policy`: what they
    reveal, here the run's own settings) and, with secure aggregation, their identities and
    roster (:mod:`~lightning_fedkg.privacy.identities`), written once for the clients of
    the data folders ``data`` and reused afterwards. On one machine this process is the
    provisioner; across organisations each one writes its own policy and receives its own
    key and the roster out of band (docs/deployment.md, "What an organisation runs on its
    own machine")."""
    from lightning_fedkg.privacy.identities import IDENTITIES
    from lightning_fedkg.privacy.policy import POLICY_FILE, write_policy
    from lightning_fedkg.privacy.secure import provision_identities as provision
    from lightning_fedkg.backends.flower.data import CLIENT_FILE

    write_policy(cfg, Path(key_file).parent / POLICY_FILE)
    if cfg.federated.secure_aggregation.enabled:
        names = [json.loads((Path(d) / CLIENT_FILE).read_text())["name"] for d in data]
        provision(Path(key_file).parent / IDENTITIES, cfg, names)


def simulate(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True) -> dict:
    """Run ``cfg`` on Flower's simulation engine: a ServerApp in this process and one
    SuperNode per client (Ray workers), each ClientApp reading only its own folder."""
    from lightning_fedkg.backends.flower.logs import simulation_environment

    with simulation_environment():  # Ray reads it when imported, its workers when started
        return _simulate(cfg, run_dir, resume)


def _simulate(cfg: ExperimentConfig, run_dir: str | Path, resume: bool) -> dict:
    """:func:`simulate`'s work, in its environment."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from lightning_fedkg.federated.alignment import federation_secret
    from lightning_fedkg.backends.flower.logs import plain_logs_unless_terminal, quiet_noisy_warnings
    from lightning_fedkg.backends.flower.client import make_client_app
    from lightning_fedkg.backends.flower.data import write_client_folders

    plain_logs_unless_terminal()  # run_simulation logs here, before any ClientApp is built
    quiet_noisy_warnings()  # ray.init's FutureWarning, Flower's notice about run_simulation

    run_dir = Path(run_dir)
    folder = run_dir / "flower"
    data = [str(p) for p in write_client_folders(cfg, folder / "data")]
    # In simulation the secret comes from the config (or the seed, as in-process); the
    # clients still read it from a file only they are given.
    key_file = str(write_key_file(federation_secret(cfg.federated.federation_key, cfg.seed), folder / "federation.key"))
    provision_beside_key(cfg, key_file, data)
    work = str(folder / "clients")
    outcome: dict = {}

    server_app = ServerApp()

    @server_app.main()
    def main(grid, context) -> None:
        try:
            outcome["metrics"] = serve(grid, cfg, run_dir, len(data), resume)
        except BaseException as err:  # handed to the caller below, not lost in Flower's thread
            outcome["error"] = err

    paths = [{"data-path": d, "key-file": key_file, "work-dir": work} for d in data]
    with contextlib.ExitStack() as stack:
        if cfg.federated.flower.client_workers:  # off by default: Ray's workers live the whole run
            sockets = stack.enter_context(tempfile.TemporaryDirectory(prefix="fedkg-"))
            for k, p in enumerate(paths):
                p["worker-socket"] = stack.enter_context(client_worker(p, f"{sockets}/{k}.sock", folder / "logs"))

        def paths_of(context) -> dict[str, str]:
            return paths[int(context.node_config["partition-id"])]

        # Each process sets its torch threads from trainer.threads when it builds its client.
        run_simulation(server_app=server_app, client_app=make_client_app(paths_of), num_supernodes=len(data),
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": max(len(data), 1), "include_dashboard": False}})
    if "error" in outcome:
        raise outcome["error"]
    if "metrics" not in outcome:
        raise RuntimeError("the Flower simulation ended without the server's result (see the log above)")
    return outcome["metrics"]


@contextlib.contextmanager
def client_worker(paths: dict[str, str], socket_path: str, logs: Path):
    """A client worker process for ``paths`` (:mod:`.worker`), listening at ``socket_path``
    while the block runs; yields the socket path."""
    import subprocess

    from lightning_fedkg.backends.flower.logs import quiet_environment
    from lightning_fedkg.backends.flower.worker import wait_listening, worker_command

    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{Path(paths['data-path']).name}-worker.log"
    with open(log_path, "ab") as log:  # a file: its process warns quietly, without colours
        proc = subprocess.Popen(worker_command(paths, socket_path), stdout=log, stderr=subprocess.STDOUT,
                                env=quiet_environment(os.environ))
    try:
        wait_listening(proc, socket_path, log_path)
        yield socket_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def check_flower_config(cfg: ExperimentConfig) -> None:
    """Refuse what needs the clients' parties in the server's process: a strategy's phases
    after training (FedE's fusion, FedLU's unlearning) work on them directly."""
    from lightning_fedkg.federated.strategy import STRATEGIES

    phases = STRATEGIES.get(cfg.federated.strategy).phases(cfg)
    if phases:
        raise ConfigError(f"federated.backend=flower cannot run the phases {phases}: they work on every client's "
                          f"party in one process (federated.backend=local)")


class FlowerBackend:
    """The ``flower`` entry of :data:`~lightning_fedkg.registry.BACKENDS`."""

    @staticmethod
    def run(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True) -> dict:
        # The config is checked before Flower is looked for: a wrong setting is reported as
        # such whether or not the extra is installed.
        from lightning_fedkg.federated.peer import is_peer_strategy

        if is_peer_strategy(cfg.federated.strategy):
            raise ConfigError(f"federated.backend=flower runs server-client strategies; the peer-to-peer "
                              f"{cfg.federated.strategy!r} runs on federated.backend=local or ray")
        check_flower_config(cfg)
        if cfg.federated.flower.mode == "deployment":
            raise ConfigError("federated.flower.mode=deployment runs on a SuperLink and SuperNodes: start them and "
                              "the run with `fedkg flower up -c CONFIG` (docs/deployment.md)")
        require()
        return simulate(cfg, run_dir, resume)
