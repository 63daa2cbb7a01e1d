"""A long-lived client process beside a SuperNode: the party stays in memory between messages.

Flower 1.41 starts a fresh ClientApp process per message; the worker (``fedkg flower
worker``) holds the :class:`~.client.ClientRuntime` instead, and the ClientApp hands it each
message over a Unix socket (:mod:`multiprocessing.connection`, an HMAC challenge keyed by
the federation secret, owner-only). It is a speed-up, never a requirement: a ClientApp that
cannot reach it answers from the same state files (:func:`.client.forward`).
See docs/deployment.md.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["serve", "worker_command", "wait_listening"]

log = logging.getLogger("lightning_fedkg")


def serve(paths: dict[str, str], socket_path: str | Path, max_requests: int | None = None) -> None:
    """Answer requests for the client whose ``data-path``, ``key-file`` and ``work-dir`` are
    ``paths`` at ``socket_path``, one at a time, until stopped (or after ``max_requests``)."""
    from multiprocessing.connection import Listener

    from lightning_fedkg.backends.flower.client import answer_request, worker_key
    from lightning_fedkg.backends.flower.data import read_key_file

    socket_path = Path(socket_path)
    if not socket_path.parent.is_dir():  # a folder of its own is the owner's only; a given one is left as it is
        socket_path.parent.mkdir(parents=True, mode=0o700)
    socket_path.unlink(missing_ok=True)
    key = worker_key(read_key_file(paths["key-file"]))
    served = 0
    with Listener(str(socket_path), family="AF_UNIX", authkey=key) as listener:
        os.chmod(socket_path, 0o600)
        log.info("flower: client worker for %s listening at %s", paths["data-path"], socket_path)
        while max_requests is None or served < max_requests:
            try:
                connection = listener.accept()
            except Exception as err:  # noqa: BLE001 - a failed challenge must not stop the worker
                log.warning("flower: client worker refused a connection: %s", err)
                continue
            with connection:
                try:
                    head = json.loads(connection.recv_bytes())
                    payload = connection.recv_bytes()
                except (EOFError, OSError, ValueError) as err:
                    log.warning("flower: client worker lost a request: %s", err)
                    continue
                try:
                    answer, reply = answer_request(head, payload, paths, role="worker")
                    out = {"answer": answer}
                except Exception as err:  # noqa: BLE001 - the ClientApp re-raises it for Flower to report
                    log.exception("flower: client worker failed a %s request", head.get("kind"))
                    out, reply = {"error": f"{type(err).__name__}: {err}", "type": type(err).__name__}, b""
                try:
                    connection.send_bytes(json.dumps(out).encode("utf-8"))
                    connection.send_bytes(reply)
                except OSError as err:  # the ClientApp process is gone; its state is saved all the same
                    log.warning("flower: client worker could not answer: %s", err)
            served += 1


def worker_command(paths: dict[str, str], socket_path: str) -> list[str]:
    """``fedkg flower worker`` for ``paths`` listening at ``socket_path``, run by this Python."""
    return [sys.executable, "-m", "lightning_fedkg.cli", "flower", "worker",
            "--data-path", str(Path(paths["data-path"]).resolve()),
            "--key-file", str(Path(paths["key-file"]).resolve()), "--work-dir", str(Path(paths["work-dir"]).resolve()),
            "--socket", socket_path]


def wait_listening(proc: subprocess.Popen, socket_path: str, log_path: str | Path, timeout: float = 120.0) -> None:
    """Wait until the worker ``proc`` listens at ``socket_path``; raise if it exits first or
    does not within ``timeout`` seconds (its log says why)."""
    end = time.monotonic() + timeout
    while not Path(socket_path).exists():
        if proc.poll() is not None:
            raise RuntimeError(f"a client worker exited (status {proc.returncode}); see {log_path}")
        if time.monotonic() > end:
            raise TimeoutError(f"a client worker did not listen at {socket_path} within {timeout} s; see {log_path}")
        time.sleep(0.1)
