"""Where a federated run, or a state it committed, is taken up inside the core.

:func:`run_federated` picks the loop (rounds or events) or the backend (Ray, Flower) and
runs it; :func:`lightning_fedkg.run.fit` has locked the run directory, set the threads and
seeded the process before. :func:`run_subrun` is a run a phase starts in a folder of its own
(FedE fusion's Single run, FedLU's retraining). :func:`restore_finished_run`,
:func:`load_run_from` and :func:`evaluate_federated_checkpoint` rebuild the parties at a
committed state.
"""

from __future__ import annotations

import copy
from pathlib import Path

from lightning_fedkg.config import ExperimentConfig
from lightning_fedkg.federated.checkpoint import check_format, load_party, read_manifest, resolve_manifest
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.federated.round_loop import CHECKPOINT_VERSION, RoundLoop
from lightning_fedkg.federated.runner import run_loop
from lightning_fedkg.federated.tasks import with_count

__all__ = ["run_federated", "run_subrun", "restore_finished_run", "load_run_from", "evaluate_federated_checkpoint"]


def run_federated(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True) -> dict:
    """Run the federated experiment ``cfg`` in ``run_dir``; resume it from its last committed round.

    ``run_dir`` is open, and this process set up and seeded, by :func:`lightning_fedkg.run.fit`
    (the entry to call) or :func:`run_subrun`. With ``federated.backend=local`` a
    peer-to-peer strategy runs on :class:`~.peer.EventLoop`, any other in rounds
    (:class:`~.round_loop.RoundLoop`), both through the one skeleton :func:`~.runner.run_loop`.
    Any other ``federated.backend`` is the entry registered under that name
    (:data:`~lightning_fedkg.registry.BACKENDS`): ``ray`` runs a peer-to-peer strategy on
    :class:`~lightning_fedkg.backends.ray.peer.RayEventLoop`, ``flower`` the same round loop with its clients
    elsewhere (a :class:`~.clients.ClientPool` of its own).

    Writes per-party checkpoints every round (``checkpoints/``), the best validation state,
    TensorBoard sub-runs ``tb/<party>`` with the round as step, ``channel_log.jsonl`` as
    transfers happen (and ``payloads/`` with ``federated.record_payloads``), and at the end
    ``metrics.json``.

    Returns the ``metrics.json`` dict: ``test`` (triple-weighted mean over clients of
    ``mrr, mr, hits@1, hits@3, hits@5, hits@10``, plus ``count``), ``clients`` (the same per
    client, plus ``count``, ``triples`` and ``name``), ``rounds`` (rounds completed),
    ``best_round``, ``best`` (and with ``federated.best=client``
    ``client_best_rounds``), ``bytes_sent`` (tensor bytes of rounds >= 1, evaluation downloads
    included), ``alignment_bytes`` (round 0), ``wire_bytes`` (serialized, all rounds),
    ``strategy``, ``validation`` (``[{round, mrr, clients: {name: mrr}}]``), ``failures`` (``[{round, stage, party,
    error}]``), ``seconds`` (wall time of the rounds, validation included, summed over
    resumes), the strategy's own blocks (FedLU's ``test_global``, ``distillation``) and one
    block per phase.
    """
    from lightning_fedkg.federated.peer import EventLoop, is_peer_strategy

    fc = cfg.federated
    if fc.backend != "local":
        # A backend of its own package (Ray: backends/ray/peer.py; Flower: lightning_fedkg.backends.flower),
        # found by entry point; each refuses the strategies it does not run.
        from lightning_fedkg.registry import BACKENDS

        return BACKENDS.get(fc.backend).run(cfg, run_dir, resume)
    if is_peer_strategy(fc.strategy):
        return run_loop(cfg, run_dir, EventLoop, EventLoop.version, resume)
    return run_loop(cfg, run_dir, RoundLoop, RoundLoop.version, resume)


def run_subrun(cfg: ExperimentConfig, run_dir: str | Path) -> dict:
    """:func:`run_federated` for a run a phase starts in a folder of the run being tested
    (FedE fusion's Single run, FedLU's retraining): the folder is opened (locked, checked
    against the run it may hold, ``config.yaml`` saved) and the process seeded with
    ``cfg.seed``, as :func:`lightning_fedkg.run.fit` does for a run; the thread settings are
    the enclosing run's."""
    from lightning_fedkg.rundir import RunDirectory
    from lightning_fedkg.runtime import seed_process

    with RunDirectory.open(run_dir, cfg):
        seed_process(cfg.seed)
        return run_federated(cfg, run_dir)


def restore_finished_run(cfg: ExperimentConfig, ckpt: str | Path) -> tuple[FederatedRun, int]:
    """The parties of ``cfg`` with the weights of a committed checkpoint (a manifest, or a run
    folder's best state) of this checkpoint format, in this process whatever
    ``federated.clients`` says. Writes nothing. Returns ``(run, round)``."""
    manifest_path = resolve_manifest(ckpt)
    manifest = read_manifest(manifest_path)
    check_format(manifest_path, manifest, CHECKPOINT_VERSION)
    if cfg.federated.clients != "local":
        # Side-by-side clients give the sequential results: the parties are rebuilt in this
        # process, where the commands that continue from them (unlearn, audit) reach them.
        cfg = copy.deepcopy(cfg)
        cfg.federated.clients = "local"
    run = FederatedRun(cfg, run_dir=None)
    run.load_party_states(lambda party: load_party(manifest_path, manifest, party), weights_only=True)
    run.last_round = int(manifest.get("round", 0))
    # A federated.best=client set, or a set committed with own_states (an unlearned run),
    # holds each client's own evaluated state: nothing to download.
    run.own_states = "client_rounds" in manifest or bool(manifest.get("own_states", False))
    run.load_evaluation_state(run.last_round)  # a no-op then, and with federated.evaluate=before_aggregation
    return run, run.last_round


def load_run_from(run_dir: str | Path, sections=()) -> tuple[ExperimentConfig, FederatedRun]:
    """``--from RUN_DIR``: a finished run's config and its parties at the best state.

    The source folder is only read, never written (commands such as unlearn or audit write
    into their own ``--out``).
    """
    from lightning_fedkg.rundir import read_run_config

    cfg = read_run_config(run_dir, sections)
    run, _ = restore_finished_run(cfg, run_dir)
    return cfg, run


def evaluate_federated_checkpoint(cfg: ExperimentConfig, ckpt_path: str | Path) -> dict:
    """Test every client with a committed checkpoint of a run of ``cfg``.

    Returns ``{"test", "clients", "strategy", "round"}`` as in ``metrics.json``, with the
    blocks the server half reports after a test (:meth:`~.strategy.ServerHalf.report`: the
    query task's ``in_graph`` and ``cross_graph``, DP's ``privacy``); nothing is written.
    A peer-to-peer run's: :func:`~.peer.evaluate_peer_checkpoint`. The process is seeded
    by the caller (:func:`lightning_fedkg.run.evaluate`).
    """
    from lightning_fedkg.federated.peer import evaluate_peer_checkpoint, is_peer_strategy

    if is_peer_strategy(cfg.federated.strategy):
        return evaluate_peer_checkpoint(cfg, ckpt_path)
    run, round_ = restore_finished_run(cfg, ckpt_path)
    avg, per_client = run.evaluate("test", round_)
    return {"test": with_count(avg, per_client), "clients": per_client, "strategy": cfg.federated.strategy,
            "round": round_, **run.server.report()}
