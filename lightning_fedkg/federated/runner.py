"""The one run skeleton: what every loop of a federated run shares.

A :class:`Loop` drives parties: rounds (:class:`~.round_loop.RoundLoop`), events in this
process (:class:`~.peer.EventLoop`) or on Ray actors (:class:`~lightning_fedkg.backends.ray.peer.RayEventLoop`).
:func:`run_loop` does the rest, once for all of them, in a run directory that
:func:`lightning_fedkg.run.fit` has opened, in a process it has set up and seeded::

    find the newest committed state written with the same settings (resume_manifest)
    build the loop; restore it from that state; open the wire log
    loop.run(commit)          the loop; commit(...) writes a resume point
    loop.results()            the metrics.json dict
    write metrics.json (atomically); close the loop

See docs/DESIGN.md ("Runs, checkpoints, resuming").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from lightning_fedkg.atomic import write_atomic
from lightning_fedkg.config import ExperimentConfig, resume_fingerprint
from lightning_fedkg.federated.checkpoint import CHECKPOINT_DIR, commit_round, load_party, resume_manifest

__all__ = ["Loop", "Commit", "run_loop"]

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


class Loop:
    """What :func:`run_loop` drives. Subclasses set :attr:`version` and :attr:`unit` and
    implement the four methods; ``channel`` is the transport whose log the skeleton opens."""

    #: The checkpoint format the loop writes and resumes (the manifests' ``version``).
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
        """Release what the loop holds (writers, processes); called however the run ends."""


def run_loop(cfg: ExperimentConfig, run_dir: str | Path, build: Callable[..., Loop], version: int,
             resume: bool = True) -> dict:
    """Run ``build(cfg, run_dir, purge_step=...)``'s loop in ``run_dir`` (see the module
    doc); ``version`` is the loop's checkpoint format. Returns the metrics."""
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / CHECKPOINT_DIR
    manifest_path, manifest = resume_manifest(ckpt_dir, cfg, version, resume)
    loop = build(cfg, run_dir, purge_step=int(manifest["round"]) + 1 if manifest else None)
    try:
        if manifest is not None:
            loop.restore(lambda party: load_party(manifest_path, manifest, party), manifest)
            log.info("%s", loop.resumed(run_dir, manifest))
        loop.channel.open_log(run_dir / "channel_log.jsonl",
                              run_dir / "payloads" if cfg.federated.record_payloads else None)
        loop.run(Commit(ckpt_dir, cfg, version))
        metrics = loop.results()
    finally:
        loop.close()
    text = json.dumps(metrics, indent=2).encode("utf-8")
    write_atomic(run_dir / "metrics.json", lambda f: f.write(text))
    return metrics
