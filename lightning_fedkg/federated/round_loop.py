"""The round loop of a server-client method in this process: :class:`RoundLoop`.

Driven by :func:`~.runner.run_loop`::

    round 0: alignment (keyed hashes of names, see .alignment)
    for round r = 1..R:
        the round's stages (FederatedRun.train_round)
        every eval_every rounds (and at R): validation; early stopping on the task's
            weighted monitor (patience counts evaluations, as FedE's code); the best set
        commit the round's per-party checkpoints (manifest last)
    reload the best state; test; phases (FedE fusion); the metrics.json dict

A client that raises, or answers after ``federated.client_timeout``, is a *failure*: the
stage goes on when ``federated.min_clients`` answered, else the round is retried.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from lightning_fedkg.config import ExperimentConfig, show_progress_bar
from lightning_fedkg.federated.checkpoint import CHECKPOINT_DIR, capture_rng, load_party, read_manifest, restore_rng
from lightning_fedkg.federated.clients import ClientPool
from lightning_fedkg.federated.federation import FederatedRun, round_bytes
from lightning_fedkg.federated.phases import PhaseContext, run_phases
from lightning_fedkg.federated.runner import Commit, Loop
from lightning_fedkg.federated.tasks import with_count

__all__ = ["CHECKPOINT_VERSION", "EarlyStopping", "RoundLoop"]

log = logging.getLogger("lightning_fedkg")

#: The checkpoint format :class:`RoundLoop` writes and resumes (the manifests' ``version``).
CHECKPOINT_VERSION = 3
RUNNER = "runner"


@dataclass
class EarlyStopping:
    """Patience counted in evaluations (FedE's code), on a higher-is-better score."""

    patience: int
    best_metric: float = -math.inf
    best_round: int = 0
    bad_evaluations: int = 0

    def update(self, value: float, round: int, count_stall: bool = True) -> bool:
        """Record an evaluation; True when it is a strict improvement (a new best).

        An evaluation that is no improvement counts toward the patience only with
        ``count_stall`` (the strategy's :meth:`~.strategy.ServerHalf.stall_counts`); an
        improvement always resets the count. NaN is never an improvement (a diverged
        federation must not become the best state).
        """
        if value > self.best_metric:
            self.best_metric, self.best_round, self.bad_evaluations = float(value), int(round), 0
            return True
        if count_stall:
            self.bad_evaluations += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.bad_evaluations >= self.patience


class RoundLoop(Loop):
    """The round loop of a server-client method in this process (see the module doc).

    State beyond the parties': early stopping, the validation history, each client's best
    round (``federated.best=client``), the seconds spent, the RNG, the wire log and the
    failures; all of it is committed with every round.
    """

    version = CHECKPOINT_VERSION
    unit = "round"

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, purge_step: int | None = None,
                 clients: Callable[[FederatedRun], ClientPool] | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.federation = FederatedRun(cfg, run_dir, purge_step=purge_step, clients=clients)
        self.channel = self.federation.channel
        self.stopper = EarlyStopping(patience=cfg.federated.patience)
        self.history: list[dict] = []
        self.client_best: dict[str, dict] = {}  # federated.best=client: {party: {"round", "value"}}
        self.seconds = 0.0  # wall time of the round loop, summed over the processes of a resumed run
        self.last_round = 0
        self.trained = 0  # rounds trained by this process

    def resumed(self, run_dir: Path, manifest: dict) -> str:
        if self.stopper.should_stop or self.last_round >= self.cfg.federated.rounds:
            return f"{run_dir} finished after round {self.last_round}"
        return super().resumed(run_dir, manifest)

    def restore(self, load, manifest) -> None:
        runner = load(RUNNER)
        self.federation.load_party_states(load)
        self.federation.channel.load_state_dict(runner["channel"])
        self.federation.failures = list(runner["failures"])
        # The patience may be changed on resume; the counters carry over.
        self.stopper = EarlyStopping(**{**runner["early_stopping"], "patience": self.cfg.federated.patience})
        self.history = list(runner["history"])
        self.client_best = dict(runner.get("client_best", {}))
        self.seconds = float(runner.get("seconds", 0.0))
        restore_rng(runner["rng"])
        self.last_round = self.federation.last_round = int(manifest["round"])

    def run(self, commit: Commit) -> None:
        fc, run = self.cfg.federated, self.federation
        if not run.aligned:
            run.align()
            run.log_server({"comm/alignment_bytes": float(sum(r.bytes for r in run.channel.records(round=0)))}, 0)
        from tqdm import tqdm

        show = show_progress_bar(self.cfg.trainer)
        bar = tqdm(total=fc.rounds, initial=min(self.last_round, fc.rounds), desc=f"{fc.strategy} rounds",
                   unit="round", disable=not show, dynamic_ncols=True)
        try:
            for r in range(self.last_round + 1, fc.rounds + 1):
                if self.stopper.should_stop:
                    break
                started = time.perf_counter()
                self.train_and_validate(r, commit)
                self.seconds += time.perf_counter() - started
                self.last_round, self.trained = r, self.trained + 1
                commit(r, {**run.party_states(), RUNNER: self.state()}, stopped=self.stopper.should_stop)
                bar.update(1)
                if not show:  # a log file gets one line per round instead of a bar
                    log.info("%s", self.progress_line(r, time.perf_counter() - started))
        finally:
            bar.close()

    def train_and_validate(self, r: int, commit: Commit) -> None:
        """Round ``r``'s stages, then (every ``eval_every`` rounds and at the last) validation,
        early stopping and the ``best`` set; its server scalars."""
        fc, run = self.cfg.federated, self.federation
        run.train_round(r)
        scalars = {}
        if r % fc.eval_every == 0 or r == fc.rounds:
            avg, per_client = run.evaluate("val", r)
            monitor = avg[run.task.monitor]
            self.history.append({"round": r, run.task.monitor: monitor,
                                 "clients": {e["name"]: e.get(run.task.monitor) for e in per_client}})
            # Read after the evaluation: the server half has aggregated it.
            improved = self.stopper.update(monitor, r, count_stall=run.server.stall_counts(r))
            if fc.best == "client":
                self.commit_client_bests(commit, per_client, r)
            elif improved:
                commit.best(run.party_states(weights_only=True), round=r)
            scalars.update({f"val/{k}": v for k, v in avg.items()})
        scalars.update(run.server.round_scalars(r))
        scalars["comm/bytes"] = float(sum(rec.bytes for rec in run.channel.records(round=r)))
        scalars["comm/bytes_total"] = float(round_bytes(run.channel))
        run.log_server(scalars, r)

    def progress_line(self, r: int, seconds: float) -> str:
        line = f"round {r}/{self.cfg.federated.rounds} ({seconds:.1f} s)"
        if self.history and self.history[-1]["round"] == r:
            key = self.federation.task.monitor
            line += (f": val {key} {self.history[-1][key]:.4f}, best {self.stopper.best_metric:.4f} "
                     f"at round {self.stopper.best_round}")
        return line

    def commit_client_bests(self, commit: Commit, per_client: list[dict], round: int) -> None:
        """``federated.best=client``: commit the ``best`` set with each client at its own best round.

        A client whose validation monitor is a strict new best of its own (a failed client
        never is) contributes its current state; the others keep the state of their earlier
        best, read back from the previous ``best`` set.
        """
        monitor, best = self.federation.task.monitor, self.client_best
        improved = {e["name"] for e in per_client
                    if "failed" not in e and e[monitor] > best.get(e["name"], {}).get("value", -math.inf)}
        if not improved:
            return
        states = self.federation.party_states(weights_only=True)
        best_path = commit.ckpt_dir / "best.json"
        if best_path.is_file():
            previous = read_manifest(best_path)
            for name in best.keys() - improved:
                states[name] = load_party(best_path, previous, name)
        for e in per_client:
            if e["name"] in improved:
                best[e["name"]] = {"round": int(round), "value": float(e[monitor])}
        commit.best(states, round=int(round), client_rounds={n: b["round"] for n, b in best.items()})

    def state(self) -> dict:
        """The ``runner`` file of a committed round."""
        return {
            "seconds": self.seconds,
            "early_stopping": asdict(self.stopper),
            "history": self.history,
            "client_best": self.client_best,
            "rng": capture_rng(),
            "channel": self.federation.channel.state_dict(),
            "failures": self.federation.failures,
        }

    def results(self) -> dict:
        """Test the best state; the strategy's report and every phase's block."""
        fc, run, run_dir = self.cfg.federated, self.federation, self.run_dir
        best_path = run_dir / CHECKPOINT_DIR / "best.json"
        if not best_path.is_file():
            raise RuntimeError(f"{best_path} is missing: no evaluation has completed")
        if self.trained == 0:
            # A finished run run again: the test is repeated (same state, same result, same
            # wire log), but not logged a second time.
            log.info("%s finished after round %d: nothing to train; testing its best state again",
                     run_dir, self.last_round)
            run.mute_writers()
        best = read_manifest(best_path)
        run.load_party_states(lambda party: load_party(best_path, best, party), weights_only=True)
        run.last_round = self.last_round
        run.own_states = fc.best == "client"
        avg, per_client = run.evaluate("test", self.last_round)
        records = run.channel.records()
        metrics = {
            "test": with_count(avg, per_client),
            "clients": per_client,
            "rounds": int(self.last_round),
            "best_round": int(self.stopper.best_round),
            "best": fc.best,
            **({"client_best_rounds": {n: b["round"] for n, b in self.client_best.items()}}
               if fc.best == "client" else {}),
            "bytes_sent": round_bytes(run.channel),
            "alignment_bytes": int(sum(r.bytes for r in records if r.round == 0)),
            "wire_bytes": int(run.channel.total_wire_bytes),
            "strategy": fc.strategy,
            "validation": self.history,
            "failures": run.failures,
            "seconds": round(self.seconds, 3),
        }
        metrics.update(run.server.report())
        metrics.update(run.pool.report())
        # The federation's test belongs to the state it tested: the best round's step.
        run.log_server({f"test/{k}": v for k, v in {**avg, **run.server.test_scalars()}.items()}, self.stopper.best_round)
        run.log_server({"comm/bytes_total": float(metrics["bytes_sent"])}, self.last_round)
        run.last_round = self.last_round
        metrics.update(run_phases(run.strategy.phases(self.cfg), PhaseContext(self.cfg, run, run_dir, run.writer)))
        return metrics

    def close(self) -> None:
        self.federation.close()
