"""The one run skeleton: what every engine of a federated run shares.

An :class:`Engine` is one way of driving parties: rounds in this process
(:class:`~.orchestrator.RoundEngine`), events in this process
(:class:`~.peer.EventEngine`) or events on Ray actors (:class:`~.peer_ray.RayEngine`).
:func:`run_engine` does everything around it, once for all of them::

    lock the run directory, check its settings, save config.yaml   (RunDirectory.open)
    thread pools and determinism; seed                              (configure_torch, seed_everything)
    find the newest committed state written with the same settings (resume_manifest)
    build the engine; restore it from that state
    open the wire log (channel_log.jsonl, payloads/)
    engine.run(commit)        the loop; commit(...) writes a resume point
    engine.results()          the metrics.json dict
    write metrics.json (atomically); close the engine

An engine only says what its loop does and what its state is.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from lightning_fedkg.atomic import write_atomic
from lightning_fedkg.config import ExperimentConfig, resume_fingerprint
from lightning_fedkg.federated.checkpoint import CHECKPOINT_DIR, commit_round, load_party, resume_manifest

__all__ = ["Engine", "Commit", "run_engine"]

log = logging.getLogger("lightning_fedkg")


class Commit:
    """Writes resume points of one run: ``commit(number, states, **meta)`` commits
    ``checkpoints/round_<number>`` (every party's state, then the manifest with the settings'
    fingerprint); :meth:`best` commits the ``best`` set."""

    def __init__(self, ckpt_dir: Path, cfg: ExperimentConfig, version: int) -> None:
        self.ckpt_dir, self.cfg, self.version = Path(ckpt_dir), cfg, int(version)

    def __call__(self, number: int, states: dict[str, Any], **meta) -> Path:
        return commit_round(self.ckpt_dir, f"round_{int(number):04d}", states,
                            {"version": self.version, "round": int(number), **meta,
                             "fingerprint": resume_fingerprint(self.cfg)})

    def best(self, states: dict[str, Any], **meta) -> Path:
        return commit_round(self.ckpt_dir, "best", states, {"version": self.version, **meta})


class Engine:
    """What :func:`run_engine` drives. Subclasses set :attr:`version` and :attr:`unit` and
    implement the four methods; ``channel`` is the transport whose log the skeleton opens."""

    #: The checkpoint format the engine writes and resumes (the manifests' ``version``).
    version = 1
    #: What a committed ``round`` number counts, for messages (``round``, ``event``).
    unit = "round"
    channel: Any

    def restore(self, load: Callable[[str], Any], manifest: dict) -> None:
        """Take the state committed in ``manifest``; ``load(party)`` reads one party's file."""
        raise NotImplementedError

    def resumed(self, run_dir: Path, manifest: dict) -> str:
        """The line logged after :meth:`restore`."""
        return f"resuming {run_dir} after {self.unit} {int(manifest['round'])}"

    def run(self, commit: Commit) -> None:
        """The loop, committing resume points with ``commit``."""
        raise NotImplementedError

    def results(self) -> dict:
        """The ``metrics.json`` dict, once the loop is over."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the engine holds (writers, processes); called however the run ends."""


def run_engine(cfg: ExperimentConfig, run_dir: str | Path, build: Callable[..., Engine], version: int,
               resume: bool = True) -> dict:
    """Run ``build(cfg, run_dir, purge_step=...)``'s engine in ``run_dir`` (see the module
    doc); ``version`` is the engine's checkpoint format. Returns the metrics."""
    from lightning_fedkg.rundir import RunDirectory
    from lightning_fedkg.runtime import config_table_elements, configure_torch

    run_dir = Path(run_dir)
    with RunDirectory.open(run_dir, cfg):
        import lightning as L

        # Threads and determinism, when a library caller did not set them (the CLI has).
        configure_torch(cfg.trainer, config_table_elements(cfg))
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        ckpt_dir = run_dir / CHECKPOINT_DIR
        manifest_path, manifest = resume_manifest(ckpt_dir, cfg, version, resume)
        engine = build(cfg, run_dir, purge_step=int(manifest["round"]) + 1 if manifest else None)
        try:
            if manifest is not None:
                engine.restore(lambda party: load_party(manifest_path, manifest, party), manifest)
                log.info("%s", engine.resumed(run_dir, manifest))
            engine.channel.open_log(run_dir / "channel_log.jsonl",
                                    run_dir / "payloads" if cfg.federated.record_payloads else None)
            engine.run(Commit(ckpt_dir, cfg, version))
            metrics = engine.results()
        finally:
            engine.close()
        text = json.dumps(metrics, indent=2).encode("utf-8")
        write_atomic(run_dir / "metrics.json", lambda f: f.write(text))
        return metrics
