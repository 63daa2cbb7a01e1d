"""The Flower client's round secrets against the review's finding on concurrent processes:
two processes serving one client's work folder (two ClientApps of one SuperNode, or a
ClientApp beside the client worker) could each load ``round_secrets.pt`` and each answer an
unmask request of the same round, one as if a peer survived (its self-mask share) and one
as if it dropped (its mask-key share): both secrets of that peer, which secure aggregation
must never give out. :meth:`ClientRuntime.handle` now holds an exclusive lock on the
client's folder for the whole request and re-reads the newest state after taking it. Each
test says what it measured on the old code."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from lightning_fedkg.privacy.secure import protocol as sa
from lightning_fedkg.federated.alignment import federation_secret
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.federated.message import decode, encode

from test_adversarial_server import VICTIM, _proxy, secure, unmask_request, until_unmask

pytestmark = pytest.mark.usefixtures("one_thread")

#: The client served by two processes, and how long each waits for the other's reload.
CLIENT, WAIT = "client_0", 0.5


def _one_flower_client(tmp_path):
    """A secure-aggregation run whose :data:`CLIENT` is a Flower client (the others are in
    process, sharing its seed-derived key), keyed and trained up to the unmasking. Returns
    the run, the runtime that served it so far, a factory of that client's runtimes (each one
    a process of its own), its registered digest and the server's round record."""
    from lightning_fedkg.backends.flower.backend import client_config_text, provision_beside_key, write_key_file
    from lightning_fedkg.backends.flower.client import ClientRuntime
    from lightning_fedkg.backends.flower.data import write_client_folders

    cfg = secure()
    run = FederatedRun(cfg, run_dir=None)
    folders = write_client_folders(cfg, tmp_path / "data")
    key = write_key_file(federation_secret("", cfg.seed), tmp_path / "org" / "federation.key")
    provision_beside_key(cfg, key, folders)
    folder = next(f for f in folders if f.name == CLIENT)

    def process():
        return ClientRuntime(folder, key, tmp_path / "work", "run1")

    first = process()
    answer, _ = first.handle({"kind": "hello", "config": client_config_text(cfg)}, b"")
    run.pool.halves[CLIENT] = _proxy(lambda: first, answer["digest"])
    run.align()
    st = until_unmask(run)
    assert first.secrets_path.is_file() and CLIENT in st.uploads and VICTIM in st.uploads
    return run, first, process, answer["digest"], st


def _unmask(client, digest, message):
    head = {"kind": "stage", "stage": sa.SA_UNMASK, "round": 1, "digest": digest}
    return client.handle(head, encode(message))


def _hook(client, method: str, wait_for: threading.Event | None = None, then: threading.Event | None = None):
    """Wrap ``client.<method>``: first wait (at most :data:`WAIT` seconds) for ``wait_for``,
    afterwards set ``then``."""
    original = getattr(client, method)

    def wrapped(*args, **kwargs):
        if wait_for is not None:
            wait_for.wait(WAIT)
        out = original(*args, **kwargs)
        if then is not None:
            then.set()
        return out

    setattr(client, method, wrapped)


@pytest.mark.slow
def test_two_processes_of_one_client_cannot_both_unmask_a_round(tmp_path):
    """Two runtimes of one client folder answer, at the same time, the server's two unmask
    requests of round 1: one says the victim survived, one that it dropped. The first waits
    (at most 0.5 s) before saving until the second has brought itself to the newest state,
    an interleaving two processes can have; the second already holds, in memory, the state
    saved after ``train``. On the old code both used the round's secrets and both answered:
    the first with the victim's self-mask share ``b``, the second with its mask-key share
    ``s``. Now exactly one answers, and the other, once the lock is its own, sees a newer
    state than the one in its memory, reloads it and refuses the round as already unmasked."""
    run, first, process, digest, st = _one_flower_client(tmp_path)
    everyone = sorted(st.uploads)
    second = process()  # another process of the same client, which has read the state after train
    second.ready()
    assert second.counter == first.counter and second.half.round_secrets() is not None
    others = [n for n in everyone if n != VICTIM]
    requests = {"first": unmask_request(st, everyone, []), "second": unmask_request(st, others, [VICTIM])}
    clients = {"first": first, "second": second}
    second_ready, first_saved = threading.Event(), threading.Event()
    _hook(second, "ready", then=second_ready)
    # the first saves once the second is ready, the second once the first saved (threads of
    # one process share a pid, and with it the temporary file name of a state they save)
    _hook(first, "save", wait_for=second_ready, then=first_saved)
    _hook(second, "save", wait_for=first_saved)
    answers, errors = {}, {}

    def serve(me):
        try:
            answers[me] = decode(_unmask(clients[me], digest, requests[me])[1])
        except Exception as err:
            errors[me] = f"{type(err).__name__}: {err}"

    threads = [threading.Thread(target=serve, args=(me,)) for me in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    revealed = {me: sorted(a.arrays) for me, a in answers.items()}
    assert len(answers) == 1, f"both processes answered the unmasking of round 1: {revealed}"
    (_, why), = errors.items()
    assert "already unmasked" in why, why
    assert not first.secrets_path.exists()


@pytest.mark.slow
def test_a_request_waits_for_another_process_holding_the_client(tmp_path, monkeypatch):
    """A real second process holds the client's lock: the request waits, then fails with an
    error naming the lock file (the wait bounded, here 0.3 s); once that process is gone
    the request is answered. On the old code the request was answered while the other
    process held the folder (there was no lock to wait for)."""
    from lightning_fedkg.backends.flower import client as client_module

    run, first, process, digest, st = _one_flower_client(tmp_path)
    everyone = sorted(st.uploads)
    lock = first.dir / "client.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr(client_module, "LOCK_TIMEOUT", 0.3, raising=False)
        with pytest.raises(RuntimeError, match=rf"{lock}"):
            _unmask(first, digest, unmask_request(st, everyone, []))
    finally:
        holder.kill()
        holder.wait()
    answer = decode(_unmask(first, digest, unmask_request(st, everyone, []))[1])
    assert f"b.{VICTIM}" in answer.arrays
    assert oct(lock.stat().st_mode & 0o777) == "0o600"
