"""Differentially private uploads for every holder-mean strategy (``federated.dp``).

Each selected client clips its update (trained rows minus the rows it downloaded, per row
or per client: :mod:`lightning_fedkg.privacy.dp`) to norm ``clip`` and adds Gaussian noise
before it uploads; the noise comes from a generator seeded by the OS, fresh per client, so
no party can reproduce it. ``placement``:

* ``local``: every upload carries noise ``σ·clip`` per coordinate, so the guarantee holds
  against a server that sees each upload (no secure aggregation needed).
* ``distributed`` (needs ``federated.secure_aggregation``): each of the ``k`` holders of a
  row adds ``σ·clip/√k``, so the sum the server unmasks carries ``σ·clip``: the same
  guarantee on the aggregate at ``1/√k`` of the noise per client. When holders drop after
  the shares, the sum carries less: the server tells each survivor its realised multiplier
  ``σ·√(min over its rows of k_survived/k_shared)`` and the client accounts that.

Every client keeps its own ledger (the list of its Gaussian events) and reports ε at
``delta`` with each upload (``privacy/epsilon`` in its TensorBoard); ``metrics.json``'s
``privacy`` block has ε per client, the mechanism and the accountant.
"""

from __future__ import annotations

import math
import secrets

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.aggregation import holder_counts
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import num_selected
from lightning_fedkg.privacy import dp as dplib

__all__ = ["DPServer", "DPClient", "noise_multiplier", "check_dp_config", "clip_update", "update_norms"]

PREFIX = "dp."
MASKED = ("train", "upload")
EPSILON = "privacy/epsilon"


def check_dp_config(cfg, strategy) -> None:
    """Raise :class:`ConfigError` unless ``federated.dp`` can run with ``strategy``."""
    dc = cfg.federated.dp
    if not issubclass(strategy.Server, HolderMeanServer):
        raise ConfigError(f"federated.dp needs a holder-mean strategy (one whose server is a "
                          f"HolderMeanServer); {cfg.federated.strategy!r} aggregates otherwise")
    if (dc.noise_multiplier is None) == (dc.epsilon is None):
        raise ConfigError("federated.dp: set exactly one of noise_multiplier (σ) and epsilon (a target; σ is "
                          f"calibrated over federated.rounds), got noise_multiplier={dc.noise_multiplier}, "
                          f"epsilon={dc.epsilon}")
    if dc.placement == "distributed" and not cfg.federated.secure_aggregation.enabled:
        raise ConfigError("federated.dp.placement=distributed needs federated.secure_aggregation.enabled=true: "
                          "without it the server sees each upload, whose noise is a fraction of the target")


def sampling_rate(cfg, num_clients: int) -> float:
    """q: the fraction of the ``num_clients`` clients selected per round."""
    return num_selected(cfg.federated.fraction, num_clients) / num_clients


def noise_multiplier(cfg, num_clients: int) -> float:
    """σ: ``federated.dp.noise_multiplier``, or calibrated to ``epsilon`` at ``delta`` over
    ``federated.rounds`` rounds at the sampling rate."""
    dc = cfg.federated.dp
    if dc.noise_multiplier is not None:
        return float(dc.noise_multiplier)
    return dplib.calibrate_noise_multiplier(dc.epsilon, dc.delta, sampling_rate(cfg, num_clients),
                                            cfg.federated.rounds, dc.accountant)


def update_norms(update: dict[str, Tensor], unit: str) -> Tensor:
    """The L2 norms that clipping bounds: one per row (``row``; a tensor shared whole is one
    row), or one for the whole update (``client``)."""
    rows = [u.reshape(u.shape[0] if u.dim() > 1 else 1, -1).double() for u in update.values()]
    if unit == "client":
        return torch.stack([sum(r.pow(2).sum() for r in rows)]).sqrt()
    return torch.cat([r.norm(dim=1) for r in rows]) if rows else torch.zeros(0, dtype=torch.float64)


def clip_update(update: dict[str, Tensor], clip: float, unit: str) -> dict[str, Tensor]:
    """``update`` with each row's (``unit=row``) or the whole update's (``client``) L2 norm
    scaled down to at most ``clip``; a tensor shared whole counts as one row."""
    if unit == "client":
        norm = float(update_norms(update, unit)[0]) if update else 0.0
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        return {k: u * scale for k, u in update.items()}
    out = {}
    for k, u in update.items():
        rows = u.reshape(u.shape[0] if u.dim() > 1 else 1, -1)
        norms = rows.norm(dim=1, keepdim=True)
        scale = torch.clamp(clip / norms.clamp(min=1e-30), max=1.0)
        out[k] = (rows * scale).view(u.shape)
    return out


class DPServer:
    """Mixin (outermost) before a holder-mean server: tells clients σ (and, distributed, the
    holders of their rows and their realised multiplier) and gathers their ε."""

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        check_dp_config(ctx.cfg, strategy)
        self.dp = ctx.cfg.federated.dp
        self.sigma = noise_multiplier(ctx.cfg, len(ctx.clients))
        self.q = sampling_rate(ctx.cfg, len(ctx.clients))
        self.epsilons: dict[str, float] = {}
        self._shared: list[str] = []

    def _row_counts(self, tensor: str, among: list[str]) -> Tensor:
        """How many of ``among`` hold each row of ``tensor`` (one count for a whole tensor)."""
        idx = [self.client_index(tensor, n) for n in among if n in self.holders_of[tensor]]
        if all(i is None for i in idx):
            return torch.tensor([len(idx)], dtype=torch.long)
        return holder_counts(int(self.table[tensor].shape[0]), idx)

    def _with_dp(self, messages: dict[str, Message]) -> dict[str, Message]:
        self._shared = sorted(messages)
        config = {"sigma": self.sigma, "q": self.q}
        counts = {t: self._row_counts(t, self._shared) for t in self.table} \
            if self.dp.placement == "distributed" else {}
        for name, message in messages.items():
            message.config["dp"] = dict(config)
            for t, k in counts.items():
                if name in self.holders_of[t]:
                    idx = self.client_index(t, name)
                    message.arrays[f"{PREFIX}k.{t}"] = (k if idx is None else k[idx]).to(torch.int32)
        return messages

    def configure_train(self, round, selected):
        return self._with_dp(super().configure_train(round, selected))

    def configure_upload(self, round, selected):
        return self._with_dp(super().configure_upload(round, selected))

    def _collect(self, replies) -> None:
        for name, reply in replies.items():
            if EPSILON in reply.metrics:
                self.epsilons[name] = float(reply.metrics[EPSILON])

    def aggregate_train(self, round, replies, failures) -> None:
        self._collect(replies)
        super().aggregate_train(round, replies, failures)

    def aggregate_upload(self, round, replies, failures) -> None:
        self._collect(replies)
        super().aggregate_upload(round, replies, failures)

    def configure_sa_unmask(self, round, selected):
        """Distributed noise: each survivor's realised multiplier, from who survived."""
        messages = super().configure_sa_unmask(round, selected)
        if self.dp.placement == "distributed":
            survivors = sorted(messages)
            counts = {t: (self._row_counts(t, self._shared), self._row_counts(t, survivors)) for t in self.table}
            for name, message in messages.items():
                ratio = 1.0
                for t, (k2, k3) in counts.items():
                    if name in self.holders_of[t]:
                        idx = self.client_index(t, name)
                        mine = (k3.double() / k2.double().clamp(min=1)) if idx is None else \
                            (k3[idx].double() / k2[idx].double().clamp(min=1))
                        ratio = min(ratio, float(mine.min()))
                message.config["dp"] = {"sigma": self.sigma * math.sqrt(ratio), "q": self.q}
        return messages

    def aggregate_sa_unmask(self, round, replies, failures) -> None:
        self._collect(replies)
        super().aggregate_sa_unmask(round, replies, failures)

    def round_scalars(self, round: int) -> dict:
        out = super().round_scalars(round)
        out.update({f"privacy/epsilon/{n}": e for n, e in self.epsilons.items()})
        return out

    def report(self) -> dict:
        out = super().report()
        out["privacy"] = {
            "epsilon": max(self.epsilons.values(), default=0.0), "delta": self.dp.delta,
            "accountant": f"dp-accounting {self.dp.accountant.upper()}",
            "mechanism": (f"Gaussian, noise multiplier {self.sigma:.4g}, clip {self.dp.clip} per {self.dp.unit}, "
                          f"{self.dp.placement} noise" + (f", Poisson-sampled at q={self.q:.3g}" if self.q < 1 else "")),
            "unit": self.dp.unit, "noise_multiplier": self.sigma, "clip": self.dp.clip,
            "placement": self.dp.placement, "clients": dict(sorted(self.epsilons.items())),
        }
        return out

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["dp"] = {"epsilons": dict(self.epsilons)}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        # Privacy spent never goes back: restoring the best round's state for the test
        # keeps the ε of every round run since (a resume starts from nothing and takes it).
        for name, eps in (state.get("dp") or {}).get("epsilons", {}).items():
            self.epsilons[name] = max(self.epsilons.get(name, 0.0), float(eps))


class DPClient:
    """Mixin before a client half (inside secure aggregation's, which masks what this one
    noised): clips the update, adds the noise, keeps the ledger."""

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        self.dp = party.cfg.federated.dp
        self.generator = torch.Generator().manual_seed(secrets.randbits(63))
        self._reference: dict[str, Tensor] | None = None
        #: ``[(round, q, σ)]``: the Gaussian events of this client's uploads.
        self.events: list[tuple[int, float, float]] = []

    def before_fit(self, message) -> None:
        self._reference = {k: v.detach().clone() for k, v in self.upload().items()}
        super().before_fit(message)

    def epsilon(self) -> float:
        """ε at ``delta`` over this client's events so far. With sampling (q < 1) every
        round is an event whether or not the client was selected (the sampling is the
        mechanism), so the rounds up to the last one count."""
        if not self.events:
            return 0.0
        q = self.events[-1][1]
        if q < 1.0:
            sigma = min(s for _, _, s in self.events)
            return dplib.epsilon([(q, sigma)] * self.events[-1][0], self.dp.delta, self.dp.accountant)
        return dplib.epsilon([(q, s) for _, q, s in self.events], self.dp.delta, self.dp.accountant)

    def _record(self, round: int, q: float, sigma: float) -> float:
        self.events.append((int(round), float(q), float(sigma)))
        eps = self.epsilon()
        self.party.log({EPSILON: eps}, round)
        return eps

    def handle(self, stage, message, round):
        counts = {k[len(PREFIX) + 2:]: v.long() for k, v in message.arrays.items() if k.startswith(f"{PREFIX}k.")}
        message = Message(arrays={k: v for k, v in message.arrays.items() if not k.startswith(PREFIX)},
                          metrics=message.metrics, config=message.config)
        dp = message.config.get("dp")
        if stage == "sa_unmask" and self.dp.placement == "distributed":
            reply = super().handle(stage, message, round) or Message()
            eps = self._record(round, dp["q"], dp["sigma"])
            return Message(arrays=reply.arrays, metrics={**reply.metrics, EPSILON: eps}, config=reply.config)
        if stage not in MASKED:
            return super().handle(stage, message, round)
        reply = super().handle(stage, Message(arrays=message.arrays, metrics=message.metrics,
                                              config={k: v for k, v in message.config.items() if k != "dp"}), round)
        if self._reference is None:
            raise RuntimeError(f"{self.party.name}: federated.dp needs a download before the first upload")
        raw = {k: v - self._reference[k] for k, v in reply.arrays.items()}
        norms = update_norms(raw, self.dp.unit)
        update = clip_update(raw, self.dp.clip, self.dp.unit)
        noisy = {}
        for k, u in update.items():
            std = dp["sigma"] * self.dp.clip
            if self.dp.placement == "distributed":
                # one count per row (a tensor shared whole has one), broadcast over the row's values
                k_rows = counts[k].to(torch.float64).clamp(min=1)
                std = std / (k_rows.view(-1, *([1] * (u.dim() - 1))) if u.dim() else k_rows[0]).sqrt()
            noise = torch.randn(u.shape, generator=self.generator, dtype=torch.float64)
            noisy[k] = (self._reference[k].double() + u.double() + noise * std).to(u.dtype)
        # what a user tunes ``clip`` by (the client's own TensorBoard, not the wire)
        self.party.log({"privacy/clipped_fraction": float((norms > self.dp.clip).double().mean()),
                        "privacy/median_update_norm": float(norms.median())}, round)
        metrics = dict(reply.metrics)
        if self.dp.placement == "local":
            metrics[EPSILON] = self._record(round, dp["q"], dp["sigma"])
        return Message(arrays=noisy, metrics=metrics, config=reply.config)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["dp_events"] = [list(e) for e in self.events]
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        saved = [tuple(e) for e in state.get("dp_events", [])]
        if len(saved) >= len(self.events):  # as the server's ε: what was spent is kept
            self.events = saved
