"""Differentially private uploads for every holder-mean strategy (``federated.dp``).

Each selected client clips its update (trained rows minus downloaded rows, per ``unit``) and
adds Gaussian noise from ``os.urandom`` on a grid (:mod:`lightning_fedkg.privacy.noise`)
before it uploads. ``placement: local`` noises every upload in full; ``distributed`` (with
secure aggregation) splits the noise among a row's holders and also accounts
``epsilon_deviating_server``. ε is composed per client over every upload, with no
amplification by sampling. Threat model and guarantees: docs/privacy.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.aggregation import holder_counts
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.message import Message
from lightning_fedkg.privacy import dp as dplib
from lightning_fedkg.privacy import noise as noiselib

__all__ = ["DPServer", "DPClient", "noise_multiplier", "check_dp_config", "clip_update", "update_norms",
           "UNPROTECTED", "DROPPED"]

PREFIX = "dp."
MASKED = ("train", "upload")
EPSILON = "privacy/epsilon"
EPSILON_ADD_REMOVE = "privacy/epsilon_add_remove"
EPSILON_DEVIATING = "privacy/epsilon_deviating_server"
_REPORTED = (EPSILON, EPSILON_ADD_REMOVE, EPSILON_DEVIATING)

#: Upload metrics a DP client does not send: the training loss and example count are
#: functions of its data that no noise covers, and holder-mean aggregation does not need them.
DROPPED = ("examples", "loss")

#: What still crosses in clear under ``federated.dp`` (``metrics.json`` → ``privacy.unprotected``).
UNPROTECTED = (
    "evaluation replies: each client's validation and test MRR, MR and Hits@k (functions of its "
    "data and model, sent unnoised; the server needs them for early stopping and the report)",
    "who uploads in each round and which rows each client holds (the alignment)",
    "message sizes and timing",
    "anything a strategy sends outside the train and upload stages (e.g. unlearning or "
    "distillation phases): DP noises those two stages only",
)


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
    if cfg.federated.aggregation == "named_rows":
        raise ConfigError("federated.dp needs federated.aggregation=selected_holders or all_holders: under "
                          "named_rows a client's upload says which rows it trained on, which the noise does not hide")
    if dc.placement == "distributed" and not cfg.federated.secure_aggregation.enabled:
        raise ConfigError("federated.dp.placement=distributed needs federated.secure_aggregation.enabled=true: "
                          "without it the server sees each upload, whose noise is a fraction of the target")


def noise_multiplier(cfg, num_clients: int, coordinates: int = 1) -> float:
    """σ: ``federated.dp.noise_multiplier``, or calibrated to ``epsilon`` at ``delta`` under
    ``neighbours`` for a client that uploads in every one of ``federated.rounds`` rounds (the
    selection is public, so a selected client gets no amplification and may be selected every
    round). ``coordinates``: the most values clipped together (a row's width, or a client's
    whole upload), whose rounding to the release grid the calibration covers too.
    ``num_clients`` is kept for callers; the figure does not depend on it."""
    dc = cfg.federated.dp
    if dc.noise_multiplier is not None:
        return float(dc.noise_multiplier)
    base = dplib.calibrate_noise_multiplier(dc.epsilon, dc.delta, 1.0, cfg.federated.rounds, dc.accountant,
                                            dc.neighbours)
    scale = dplib.sensitivity(dc.neighbours)
    return base * (scale + noiselib.grid_slack(dc.clip, coordinates)) / scale


def event_epsilon(events, delta: float, accountant: str, neighbours: str, deviating: bool = False) -> float:
    """ε of a client's ledger ``[(round, σ_sum, slack, σ_own)]`` under ``neighbours``: each
    upload a Gaussian of multiplier ``σ_sum`` on the released sum (``deviating``: ``σ_own``,
    the client's own share alone), its sensitivity ``Δ`` widened by the grid's ``slack``."""
    scale = dplib.sensitivity(neighbours)
    sigmas = [(own if deviating else s) * scale / (scale + slack) for _, s, slack, own in events]
    return dplib.epsilon([(1.0, z) for z in sigmas], delta, accountant, neighbours)


def update_norms(update: dict[str, Tensor], unit: str) -> Tensor:
    """The L2 norms that clipping bounds: one per row (``row``; a tensor shared whole is one
    row), or one for the whole update (``client``)."""
    rows = [u.reshape(u.shape[0] if u.dim() > 1 else 1, -1).double() for u in update.values()]
    if unit == "client":
        return torch.stack([sum(r.pow(2).sum() for r in rows)]).sqrt()
    return torch.cat([r.norm(dim=1) for r in rows]) if rows else torch.zeros(0, dtype=torch.float64)


def clipped_coordinates(update: dict[str, Tensor], unit: str) -> int:
    """How many values one clip bounds together: the widest row, or the whole update."""
    if unit == "client":
        return sum(int(u.numel()) for u in update.values())
    return max((int(u[0].numel()) if u.dim() > 1 else int(u.numel()) for u in update.values()), default=1)


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
        self._num_clients = len(ctx.clients)
        self._sigma: float | None = None
        self.epsilons: dict[str, dict[str, float]] = {}
        self._shared: list[str] = []

    @property
    def sigma(self) -> float:
        """σ, calibrated once the table (and so the widest clipped unit) is known."""
        if self._sigma is None:
            tables = {t: v for t, v in self.table.items()}
            coords = clipped_coordinates(tables, self.dp.unit) if tables else 1
            self._sigma = noise_multiplier(self.cfg, self._num_clients, coords)
        return self._sigma

    def _row_counts(self, tensor: str, among: list[str]) -> Tensor:
        """How many of ``among`` hold each row of ``tensor`` (one count for a whole tensor)."""
        idx = [self.client_index(tensor, n) for n in among if n in self.holders_of[tensor]]
        if all(i is None for i in idx):
            return torch.tensor([len(idx)], dtype=torch.long)
        return holder_counts(int(self.table[tensor].shape[0]), idx)

    def _with_dp(self, messages: dict[str, Message]) -> dict[str, Message]:
        self._shared = sorted(messages)
        config = {"sigma": self.sigma}
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
            got = {k: float(reply.metrics[k]) for k in _REPORTED if k in reply.metrics}
            if got:
                self.epsilons[name] = got

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
                message.config["dp"] = {"sigma": self.sigma * math.sqrt(ratio)}
        return messages

    def aggregate_sa_unmask(self, round, replies, failures) -> None:
        self._collect(replies)
        super().aggregate_sa_unmask(round, replies, failures)

    def round_scalars(self, round: int) -> dict:
        out = super().round_scalars(round)
        out.update({f"privacy/epsilon/{n}": e[EPSILON] for n, e in self.epsilons.items() if EPSILON in e})
        return out

    def _column(self, key: str) -> dict[str, float]:
        return {n: e[key] for n, e in sorted(self.epsilons.items()) if key in e}

    def report(self) -> dict:
        out = super().report()
        clients, add_remove = self._column(EPSILON), self._column(EPSILON_ADD_REMOVE)
        relation = self.dp.neighbours
        privacy = {
            "epsilon": max(clients.values(), default=0.0), "delta": self.dp.delta,
            "neighbours": relation,
            "epsilon_add_remove": max(add_remove.values(), default=0.0),
            "accountant": f"dp-accounting {self.dp.accountant.upper()}",
            "mechanism": (f"Gaussian, noise multiplier {self.sigma:.4g}, clip {self.dp.clip} per {self.dp.unit}, "
                          f"{self.dp.placement} noise from os.urandom, released on a grid of clip·2^-{noiselib.GRID_BITS}; "
                          f"sensitivity {'2·clip (replace one)' if relation == 'replace' else 'clip (add/remove one)'}"),
            "amplification": "none: the selection is seeded from the run's config, public to the server and "
                             "to anyone with config.yaml; each upload is one Gaussian event, a round without "
                             "an upload costs nothing, ε composes every upload to the end of the run",
            "unit": self.dp.unit, "noise_multiplier": self.sigma, "clip": self.dp.clip,
            "placement": self.dp.placement, "clients": clients, "clients_add_remove": add_remove,
            "dropped_from_uploads": list(DROPPED), "unprotected": list(UNPROTECTED),
        }
        if self.dp.placement == "distributed":
            deviating = self._column(EPSILON_DEVIATING)
            privacy["threat_model"] = ("epsilon: the server follows the protocol and every client adds its share; "
                                       "epsilon_deviating_server: any server (it may inflate holder counts or "
                                       "claim dropouts) and any coalition of the other clients")
            privacy["epsilon_deviating_server"] = max(deviating.values(), default=0.0)
            privacy["clients_deviating_server"] = deviating
        else:
            privacy["threat_model"] = "the server and any coalition of other clients see every upload"
        out["privacy"] = privacy
        return out

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["dp"] = {"epsilons": {n: dict(e) for n, e in self.epsilons.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        # Privacy spent never goes back: restoring the best round's state for the test
        # keeps the ε of every round run since (a resume starts from nothing and takes it).
        for name, saved in state["dp"]["epsilons"].items():
            mine = self.epsilons.setdefault(name, {})
            for key, eps in saved.items():
                mine[key] = max(mine.get(key, 0.0), float(eps))


class DPClient:
    """Mixin before a client half (inside secure aggregation's, which masks what this one
    noised): clips the update, adds the noise, keeps the ledger."""

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        self.dp = party.cfg.federated.dp
        self._reference: dict[str, Tensor] | None = None
        #: ``[(round, σ_sum, slack, σ_own)]``: one Gaussian event per upload: the multiplier
        #: on the released sum, the grid's slack (:func:`~lightning_fedkg.privacy.noise.grid_slack`)
        #: and the multiplier of this client's own share (``σ/√k`` with the largest holder
        #: count it divided by; ``σ`` for local noise).
        self.events: list[tuple[int, float, float, float]] = []
        self._pending: tuple[float, float, float] | None = None

    def before_fit(self, message) -> None:
        self._reference = {k: v.detach().clone() for k, v in self.upload().items()}
        super().before_fit(message)

    def epsilon(self, neighbours: str | None = None, deviating: bool = False) -> float:
        """ε at ``delta`` over every upload so far, under ``neighbours`` (default the
        configured relation); ``deviating``: of this client's own noise share alone."""
        return event_epsilon(self.events, self.dp.delta, self.dp.accountant, neighbours or self.dp.neighbours,
                             deviating)

    def _record(self, round: int, sigma: float, slack: float, own: float) -> dict[str, float]:
        self.events.append((int(round), float(sigma), float(slack), float(own)))
        out = {EPSILON: self.epsilon(), EPSILON_ADD_REMOVE: self.epsilon("add_remove")}
        if self.dp.placement == "distributed":
            out[EPSILON_DEVIATING] = self.epsilon(deviating=True)
        self.party.log(out, round)
        return out

    def _holder_bound(self) -> int:
        """The most holders any row can have this round, from what this client did itself:
        the parties it split its mask secrets among in secure aggregation's key stage (the
        secure half's round state, on this same object)."""
        parties = getattr(getattr(self, "_round", None), "parties", None)
        if not parties:
            raise RuntimeError(f"{self.party.name}: distributed DP needs secure aggregation's round state")
        return len(parties)

    def _noise_std(self, key: str, u: Tensor, counts: dict[str, Tensor], sigma: float):
        """Per coordinate (broadcast): ``σ·clip``, or ``σ·clip/√k`` per row (distributed)."""
        std = sigma * self.dp.clip
        if self.dp.placement != "distributed":
            return std, 1
        k_rows = counts[key].to(torch.float64).clamp(min=1)
        bound = self._holder_bound()
        if float(k_rows.max()) > bound:
            raise RuntimeError(f"{self.party.name}: the server claims {int(k_rows.max())} holders of a row of "
                               f"{key!r}, more than the {bound} parties this client shared its secrets with; "
                               "refusing to shrink the noise")
        # one count per row (a tensor shared whole has one), broadcast over the row's values
        std = std / (k_rows.view(-1, *([1] * (u.dim() - 1))) if u.dim() else k_rows[0]).sqrt()
        return std, int(k_rows.max())

    def handle(self, stage, message, round):
        counts = {k[len(PREFIX) + 2:]: v.long() for k, v in message.arrays.items() if k.startswith(f"{PREFIX}k.")}
        message = Message(arrays={k: v for k, v in message.arrays.items() if not k.startswith(PREFIX)},
                          metrics=message.metrics, config=message.config)
        dp = message.config.get("dp")
        if stage == "sa_unmask" and self.dp.placement == "distributed":
            reply = super().handle(stage, message, round) or Message()
            sigma, slack, own = self._pending
            self._pending = None
            # a realised σ above the one this client's share was computed for is a lie
            realised = min(float(dp["sigma"]), sigma)
            return Message(arrays=reply.arrays, metrics={**reply.metrics, **self._record(round, realised, slack, own)},
                           config=reply.config)
        if stage not in MASKED:
            return super().handle(stage, message, round)
        reply = super().handle(stage, Message(arrays=message.arrays, metrics=message.metrics,
                                              config={k: v for k, v in message.config.items() if k != "dp"}), round)
        if self._reference is None:
            raise RuntimeError(f"{self.party.name}: federated.dp needs a download before the first upload")
        sigma = float(dp["sigma"])
        raw = {k: v - self._reference[k] for k, v in reply.arrays.items()}
        norms = update_norms(raw, self.dp.unit)
        update = clip_update(raw, self.dp.clip, self.dp.unit)
        step = noiselib.grid(self.dp.clip)
        slack = noiselib.grid_slack(self.dp.clip, clipped_coordinates(update, self.dp.unit))
        noisy, k_used = {}, 1
        for key, u in update.items():
            std, k = self._noise_std(key, u, counts, sigma)
            k_used = max(k_used, k)
            noisy[key] = (self._reference[key].double() + noiselib.snapped_release(u, std, step)).to(u.dtype)
        # what a user tunes ``clip`` by (the client's own TensorBoard, not the wire)
        self.party.log({"privacy/clipped_fraction": float((norms > self.dp.clip).double().mean()),
                        "privacy/median_update_norm": float(norms.median())}, round)
        metrics = {k: v for k, v in reply.metrics.items() if k not in DROPPED}
        if self.dp.placement == "local":
            metrics.update(self._record(round, sigma, slack, sigma))
        else:  # accounted when the unmasking says how many holders' noise the sum kept
            self._pending = (sigma, slack, sigma / math.sqrt(k_used))
        return Message(arrays=noisy, metrics=metrics, config=reply.config)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["dp_events"] = [list(e) for e in self.events]
        state["dp_pending"] = None if self._pending is None else list(self._pending)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        saved = [tuple(e) for e in state["dp_events"]]
        if len(saved) >= len(self.events):  # as the server's ε: what was spent is kept
            self.events = saved
        pending = state["dp_pending"]
        self._pending = None if pending is None else tuple(float(x) for x in pending)
