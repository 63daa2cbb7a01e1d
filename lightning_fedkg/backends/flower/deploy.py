"""A Flower deployment on this machine: a SuperLink and one SuperNode per client, as
separate OS processes started with Flower's own commands (``fedkg flower up``).

Each SuperNode gets its data folder, the path of the federation-key file and a work folder,
plus a client worker's socket (:mod:`.worker`) unless ``federated.flower.client_workers=false``.
The run is submitted with ``flwr run`` from an app project under the run folder; logs go to
``<run>/flower/logs/``, without colour codes or the known third-party noise
(:mod:`.logs`). Flower's processes are found beside this Python, activated or not
(:func:`flower_environment`). ``Deployment(tls=...)`` runs it over TLS
(:func:`localhost_certificates` makes a throwaway set). See docs/deployment.md.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, NamedTuple

from lightning_fedkg.config import ExperimentConfig
from lightning_fedkg.backends.flower.logs import copy_plain, quiet_environment

__all__ = ["Deployment", "TLSFiles", "flower_environment", "free_port", "localhost_certificates",
           "write_app_project", "up", "key_for", "wait_unlocked"]

APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedkg-run"
version = "1.0.0"
description = "A lightning_fedkg run on Flower (written by fedkg flower up)"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "lightning-fedkg"

[tool.flwr.app.components]
serverapp = "lightning_fedkg.backends.flower.apps:server_app"
clientapp = "lightning_fedkg.backends.flower.apps:client_app"

[tool.flwr.app.config]
fedkg-config = ""
run-dir = ""
num-clients = 0
resume = true
"""


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_app_project(folder: str | Path) -> Path:
    """The Flower app project ``flwr run`` submits (a pyproject naming :mod:`.apps`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_PYPROJECT)
    return folder


class TLSFiles(NamedTuple):
    """PEM files of a TLS deployment: the CA certificate the clients and ``flwr`` verify
    the SuperLink with, and the SuperLink's certificate and private key."""

    ca: Path
    certificate: Path
    key: Path


def localhost_certificates(folder: str | Path, days: int = 30) -> TLSFiles:
    """A throwaway CA and a SuperLink certificate it signs for ``127.0.0.1``/``localhost``,
    valid ``days``, written under ``folder`` (keys ``0600``). For a deployment on this
    machine, to run the TLS path end to end; organisations bring certificates of their own
    (docs/deployment.md, "What an organisation runs on its own machine")."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, key, issuer: str, issuer_key, ca: bool, names=()):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write_key(path: Path, key) -> None:
        path.unlink(missing_ok=True)
        path.touch(mode=0o600)  # owner-only before the key is in it
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("fedkg test CA", ca_key, "fedkg test CA", ca_key, ca=True)
    server = certificate("localhost", server_key, "fedkg test CA", ca_key, ca=False,
                         names=(x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))))
    files = TLSFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.certificate.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    write_key(files.key, server_key)
    return files


def _flower_command(name: str) -> list[str]:
    """A Flower console script of this environment (beside this Python)."""
    exe = Path(sys.executable).with_name(name)
    return [str(exe)] if exe.is_file() else [name]


def flower_environment(env: Mapping[str, str], home: Path) -> dict[str, str]:
    """The environment of a deployment's processes: ``env`` with this Python's folder first
    on ``PATH``, Flower's settings (``FLWR_HOME=home``, no runtime installs) and the quiet
    output of :func:`~lightning_fedkg.backends.flower.logs.quiet_environment` (their output goes
    to files).

    Flower's processes start others by name from ``PATH`` (the SuperLink and SuperNode
    start ``flower-superexec``, which starts ``flwr-serverapp``/``flwr-clientapp``), so
    ``venv/bin/fedkg flower up`` run without activating the venv failed ("No such file or
    directory: 'flower-superexec'"). ``sys.executable`` is not resolved: a venv's
    ``bin/python`` links to the base interpreter, whose folder has no Flower.
    """
    here = str(Path(sys.executable).parent)
    path = [here, *(p for p in env.get("PATH", "").split(os.pathsep) if p and p != here)]
    return quiet_environment({**env, "PATH": os.pathsep.join(path), "FLWR_HOME": str(home),
                              "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "PYTHONUNBUFFERED": "1"})


class Deployment:
    """Flower's processes for one run folder; a context manager that stops them all.

    ``tls``: the SuperLink serves its APIs over TLS with these files, and every SuperNode
    and ``flwr`` verifies it against their CA; None (default) runs them ``--insecure``:
    plain HTTP, fit for processes on one machine only."""

    def __init__(self, folder: str | Path, port: int | None = None, tls: TLSFiles | None = None) -> None:
        self.folder = Path(folder)
        self.port = port or free_port()
        self.tls = tls
        self.logs = self.folder / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        home = self.folder / "home"
        home.mkdir(parents=True, exist_ok=True)
        security = "insecure = true" if tls is None else f'root-certificates = "{Path(tls.ca).resolve()}"'
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "fedkg"\n\n[superlink.fedkg]\naddress = "127.0.0.1:{self.port}"\n{security}\n')
        self.env = flower_environment(os.environ, home)
        self.procs: dict[str, subprocess.Popen] = {}
        self._copies: dict[str, threading.Thread] = {}  # each process's log writer (copy_plain)
        self._sockets: Path | None = None  # a private folder for the client workers' sockets

    def _start(self, name: str, command: list[str]) -> subprocess.Popen:
        # A process group of its own: stopping it stops the ClientApp/ServerApp processes it
        # started. Its output (and theirs) reaches logs/<name>.log through copy_plain.
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                cwd=self.folder, start_new_session=True)
        self._copies[name] = copy_plain(proc.stdout, self.logs / f"{name}.log")
        self.procs[name] = proc
        return proc

    def _logged(self, name: str, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s) until the stopped process ``name``'s log is written
        out; a child that outlives it (a ServerApp after its SuperLink) may keep it open."""
        copy = self._copies.pop(name, None)
        if copy is not None:
            copy.join(timeout)

    def start_superlink(self, timeout: float = 120.0) -> None:
        """``flower-superlink`` on :attr:`port`, its state in ``state.db``; waits until it listens."""
        security = ["--insecure"] if self.tls is None else [
            "--ssl-ca-certfile", str(self.tls.ca), "--ssl-certfile", str(self.tls.certificate),
            "--ssl-keyfile", str(self.tls.key)]
        self._start("superlink", [*_flower_command("flower-superlink"), *security,
                                  "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
                                  "--port", str(self.port), "--database", str(self.folder / "state.db")])
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.procs["superlink"].poll() is not None:
                raise RuntimeError(f"flower-superlink exited; see {self.logs / 'superlink.log'}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"flower-superlink did not listen on port {self.port} within {timeout} s")

    def start_worker(self, name: str, data_path: str | Path, key_file: str | Path, work_dir: str | Path) -> str:
        """A client worker (:mod:`.worker`) for one client, process ``<name>-worker``; waits
        until it listens and returns its socket (short: a Unix socket path has ~100 bytes)."""
        from lightning_fedkg.backends.flower.worker import wait_listening, worker_command

        if self._sockets is None:
            self._sockets = Path(tempfile.mkdtemp(prefix="fedkg-"))
        path = str(self._sockets / f"{name}.sock")
        paths = {"data-path": str(data_path), "key-file": str(key_file), "work-dir": str(work_dir)}
        proc = self._start(f"{name}-worker", worker_command(paths, path))
        wait_listening(proc, path, self.logs / f"{name}-worker.log")
        return path

    def start_supernode(self, name: str, data_path: str | Path, key_file: str | Path, work_dir: str | Path,
                        worker_socket: str | None = None) -> None:
        """``flower-supernode`` of one client, with its three paths (and its worker's socket)
        as node config."""
        config = f"data-path='{Path(data_path).resolve()}' key-file='{Path(key_file).resolve()}' " \
                 f"work-dir='{Path(work_dir).resolve()}'"
        if worker_socket:
            config += f" worker-socket='{worker_socket}'"
        security = ["--insecure"] if self.tls is None else ["--root-certificates", str(Path(self.tls.ca).resolve())]
        self._start(name, [*_flower_command("flower-supernode"), *security, "--superlink",
                           f"127.0.0.1:{self.port}", "--port", str(free_port()), "--node-config", config])

    def start_client(self, name: str, data_path: str | Path, key_file: str | Path, work_dir: str | Path,
                     worker: bool = True) -> None:
        """One organisation's side: its client worker (unless ``worker`` is false) and SuperNode."""
        socket_path = self.start_worker(name, data_path, key_file, work_dir) if worker else None
        self.start_supernode(name, data_path, key_file, work_dir, socket_path)

    def run(self, app: str | Path, run_config: dict, timeout: float | None = None) -> int:
        """``flwr run APP --stream`` with ``run_config`` (a TOML file); the exit status."""
        import tomli_w

        path = self.folder / "run_config.toml"
        path.write_text(tomli_w.dumps(run_config))
        proc = self._start("run", [*_flower_command("flwr"), "run", str(app), "--run-config", str(path), "--stream"])
        try:
            return proc.wait(timeout=timeout)
        finally:
            self.procs.pop("run", None)
            self._logged("run")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process and every process it started: its process group, and
        its descendants in sessions of their own (the SuperLink starts its SuperExec so,
        which starts the ServerApp; a group kill alone would leave them running)."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        tree = _descendants(proc.pid)  # before the kill: orphans are re-parented
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        proc.wait()
        self._logged(name)

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux ``/proc``; elsewhere none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(entry.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def key_for(cfg: ExperimentConfig, folder: Path, key_file: str | Path | None = None) -> Path:
    """The federation-key file of a deployment: ``key_file`` when given, else
    ``<folder>/federation.key``, written once (``0600``) with the config's secret or a random one."""
    from lightning_fedkg.backends.flower.backend import write_key_file

    if key_file is not None:
        return Path(key_file)
    path = folder / "federation.key"
    if not path.is_file():
        write_key_file(cfg.federated.federation_key or secrets.token_hex(32), path)
    return path


def wait_unlocked(run_dir: Path, timeout: float = 60.0) -> None:
    """Wait until no process holds ``run_dir``'s lock, at most ``timeout`` seconds, then
    raise :class:`~lightning_fedkg.rundir.RunLockedError`. When only the SuperLink process
    dies, its ServerApp outlives it (Flower stops it once it notices: seen to take from a
    few seconds to over a minute), and a restart must not race it for the run; when the
    coordinator's machine dies, nothing is left to wait for."""
    from lightning_fedkg.rundir import RunLockedError, check_unlocked

    end = time.monotonic() + timeout
    while True:
        try:
            check_unlocked(run_dir)
            return
        except RunLockedError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def up(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True, key_file: str | Path | None = None,
       port: int | None = None, timeout: float | None = None, tls: TLSFiles | None = None) -> dict:
    """Run ``cfg`` as a deployment on this machine and return its ``metrics.json``.

    Writes each client's data folder (``<run>/flower/data/client_<k>``) and, with secure
    aggregation, the clients' identities beside the key file (``identities/``), starts the
    SuperLink and one SuperNode per client, submits the run and waits for it; all
    processes are stopped at the end. A run folder that holds a committed round resumes.
    ``tls``: run every connection to the SuperLink over TLS with these files
    (:class:`Deployment`).
    """
    import json

    from lightning_fedkg.backends.flower.data import write_client_folders
    from lightning_fedkg.backends.flower.backend import check_flower_config, client_config_text, provision_beside_key, require

    require()
    check_flower_config(cfg)
    run_dir = Path(run_dir).resolve()
    wait_unlocked(run_dir)
    folder = run_dir / "flower"
    data = write_client_folders(cfg, folder / "data")
    key = key_for(cfg, folder, key_file)
    provision_beside_key(cfg, key, data)
    app = write_app_project(folder / "app")
    (run_dir / "metrics.json").unlink(missing_ok=True)
    with Deployment(folder, port, tls) as d:
        d.start_superlink()
        for path in data:
            d.start_client(path.name, path, key, folder / "clients", worker=cfg.federated.flower.client_workers
                           is not False)
        status = d.run(app, {"fedkg-config": client_config_text(cfg), "run-dir": str(run_dir),
                             "num-clients": len(data), "resume": bool(resume)}, timeout=timeout)
    metrics = run_dir / "metrics.json"
    if not metrics.is_file():
        tail = (folder / "logs" / "run.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the Flower run ended (flwr run exit status {status}) without {metrics}; "
                           f"the end of its log:\n{tail}")
    return json.loads(metrics.read_text())


def remove_states(run_dir: str | Path) -> None:
    """Delete the clients' work folders of a local deployment (their saved states)."""
    shutil.rmtree(Path(run_dir) / "flower" / "clients", ignore_errors=True)
