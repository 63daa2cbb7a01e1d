"""Differentially private uploads for every holder-mean strategy (``federated.dp``).

Each selected client clips its update (trained rows minus downloaded rows, per ``unit``) and
adds Gaussian noise from ``os.urandom`` on a grid (:mod:`lightning_fedkg.privacy.mechanisms.noise`)
before it uploads. σ is the client's own, from its own settings; the server sends none.
``placement: local`` noises every upload in full; ``distributed`` (with secure aggregation)
splits the noise among a row's holders, counted from the peers the client itself masks that
row with, and also accounts ``epsilon_deviating_server``. Each upload is charged to the
client's ledger as it is sent, composed with no amplification by sampling, and a client
with a target ε refuses an upload beyond it. Threat model and guarantees: docs/privacy.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.protections import Protection
from lightning_fedkg.privacy.mechanisms import accounting as dplib
from lightning_fedkg.privacy.mechanisms import noise as noiselib

__all__ = ["DPUploads", "DPServer", "DPClient", "noise_multiplier", "check_dp_config", "clip_update", "update_norms",
           "UNPROTECTED", "DROPPED"]

PREFIX = "dp."
MASKED = ("train", "upload")
EPSILON = "privacy/epsilon"
EPSILON_ADD_REMOVE = "privacy/epsilon_add_remove"
EPSILON_DEVIATING = "privacy/epsilon_deviating_server"
SIGMA = "privacy/noise_multiplier"
_REPORTED = (EPSILON, EPSILON_ADD_REMOVE, EPSILON_DEVIATING, SIGMA)

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
    if dc.placement == "distributed" and cfg.federated.secure_aggregation.mode == "dense":
        raise ConfigError("federated.dp.placement=distributed needs federated.secure_aggregation.mode=shared_rows: "
                          "a client divides its noise by the holders of each row, which it counts from the peers "
                          "it masks that row with; in dense mode it masks every row with every peer")


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
    """Mixin (outermost) before a holder-mean server: gathers the clients' ε and σ from
    their replies. It sends no noise setting: each client derives its own."""

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        check_dp_config(ctx.cfg, strategy)
        self.dp = ctx.cfg.federated.dp
        self.epsilons: dict[str, dict[str, float]] = {}

    def _collect(self, replies) -> None:
        for name, reply in replies.items():
            got = {k: float(reply.metrics[k]) for k in _REPORTED if k in reply.metrics}
            if got:
                self.epsilons.setdefault(name, {}).update(got)

    def aggregate_train(self, round, replies, failures) -> None:
        self._collect(replies)
        super().aggregate_train(round, replies, failures)

    def aggregate_upload(self, round, replies, failures) -> None:
        self._collect(replies)
        super().aggregate_upload(round, replies, failures)

    def aggregate_sa_unmask(self, round, replies, failures) -> None:
        self._collect(replies)
        super().aggregate_sa_unmask(round, replies, failures)

    def round_scalars(self, round: int) -> dict:
        out = super().round_scalars(round)
        out.update({f"privacy/epsilon/{n}": e[EPSILON] for n, e in self.epsilons.items() if EPSILON in e})
        return out

    def _column(self, key: str) -> dict[str, float]:
        return {n: e[key] for n, e in sorted(self.epsilons.items()) if key in e}

    def _tail_delta(self, sigma: float | None, holders: int = 1, epsilon: float | None = None) -> float | None:
        """What the noise sampler's cut adds to δ per release of a clipped unit
        (:func:`~lightning_fedkg.privacy.mechanisms.noise.tail_delta`), at the sensitivity the ledger
        accounts (the relation's, widened by the grid's slack), for ``sigma`` the least any
        client reported and the widest unit of the table (every client's is narrower: the
        bound only grows with the width); None before any client reported its σ."""
        if sigma is None:
            return None
        coords = clipped_coordinates(dict(self.table), self.dp.unit) if self.table else 1
        sensitivity = dplib.sensitivity(self.dp.neighbours) + noiselib.grid_slack(self.dp.clip, coords)
        return noiselib.tail_delta(sigma, sensitivity, coords, holders=holders, epsilon=epsilon)

    def report(self) -> dict:
        out = super().report()
        clients, add_remove = self._column(EPSILON), self._column(EPSILON_ADD_REMOVE)
        sigmas = self._column(SIGMA)
        sigma = min(sigmas.values(), default=None)  # the least noise any client added
        relation = self.dp.neighbours
        epsilon = max(clients.values(), default=0.0)
        # distributed: the sum of at most every client's share, bounded through the run's ε
        n = len(self.clients)
        tail = self._tail_delta(sigma) if self.dp.placement == "local" else \
            self._tail_delta(sigma, holders=n, epsilon=epsilon)
        privacy = {
            "epsilon": epsilon, "delta": self.dp.delta, "delta_tail_per_row": tail,
            "neighbours": relation,
            "epsilon_add_remove": max(add_remove.values(), default=0.0),
            "accountant": f"dp-accounting {self.dp.accountant.upper()}",
            "mechanism": (f"Gaussian, noise multiplier {'none sent' if sigma is None else f'{sigma:.4g}'} (each "
                          f"client's own, from its own settings), clip {self.dp.clip} per {self.dp.unit}, "
                          f"{self.dp.placement} noise from os.urandom, released on a grid of clip·2^-{noiselib.GRID_BITS}; "
                          f"sensitivity {'2·clip (replace one)' if relation == 'replace' else 'clip (add/remove one)'}"),
            "amplification": "none: the selection is seeded from the run's config, public to the server and "
                             "to anyone with config.yaml; each upload is one Gaussian event, a round without "
                             "an upload costs nothing, ε composes every upload to the end of the run",
            "unit": self.dp.unit, "noise_multiplier": sigma, "clients_noise_multiplier": sigmas, "clip": self.dp.clip,
            "placement": self.dp.placement, "clients": clients, "clients_add_remove": add_remove,
            "dropped_from_uploads": list(DROPPED), "unprotected": list(UNPROTECTED),
        }
        if self.dp.placement == "distributed":
            deviating = self._column(EPSILON_DEVIATING)
            privacy["threat_model"] = ("epsilon: the server follows the protocol (it asks every survivor to unmask) "
                                       "and every holder adds its share; epsilon_deviating_server: any server (it "
                                       "may claim holders or dropouts, or unmask without asking a client) and any "
                                       "coalition of the other clients")
            privacy["epsilon_deviating_server"] = max(deviating.values(), default=0.0)
            # a client's own share alone: the local bound at the smallest share, σ/√n
            privacy["delta_tail_per_row_deviating_server"] = self._tail_delta(
                None if sigma is None else sigma / math.sqrt(n))
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
                mine[key] = eps if key == SIGMA else max(mine.get(key, 0.0), float(eps))


class DPClient:
    """Mixin before a client half (inside secure aggregation's, which masks what this one
    noised): clips the update, adds the noise of its own σ, keeps the ledger."""

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        self.dp = party.cfg.federated.dp
        self._reference: dict[str, Tensor] | None = None
        self._sigma: float | None = None
        #: ``[(round, σ_sum, slack, σ_own)]``: one Gaussian event per upload, charged when it
        #: is sent: the multiplier on the released sum (distributed: lowered at the unmasking
        #: when holders dropped), the grid's slack (:func:`~lightning_fedkg.privacy.mechanisms.noise.grid_slack`)
        #: and the multiplier of this client's own share (``σ/√k`` with the most holders it
        #: divided by; ``σ`` for local noise).
        self.events: list[tuple[int, float, float, float]] = []

    def before_fit(self, message) -> None:
        self._reference = {k: v.detach().clone() for k, v in self.upload().items()}
        super().before_fit(message)

    def sigma(self, update: dict[str, Tensor]) -> float:
        """σ from this client's own settings (:func:`noise_multiplier`), for the widest unit
        it clips (its own rows: the same every round), computed once."""
        if self._sigma is None:
            self._sigma = noise_multiplier(self.cfg, 0, clipped_coordinates(update, self.dp.unit))
        return self._sigma

    def epsilon(self, neighbours: str | None = None, deviating: bool = False,
                events: list | None = None) -> float:
        """ε at ``delta`` over every upload so far (or ``events``), under ``neighbours``
        (default the configured relation); ``deviating``: of this client's own noise share alone."""
        return event_epsilon(self.events if events is None else events, self.dp.delta, self.dp.accountant,
                             neighbours or self.dp.neighbours, deviating)

    def _report(self, round: int) -> dict[str, float]:
        out = {EPSILON: self.epsilon(), EPSILON_ADD_REMOVE: self.epsilon("add_remove"), SIGMA: float(self._sigma)}
        if self.dp.placement == "distributed":
            out[EPSILON_DEVIATING] = self.epsilon(deviating=True)
        self.party.log({k: v for k, v in out.items() if k != SIGMA}, round)
        return out

    def _charge(self, event: tuple[int, float, float, float]) -> None:
        """Add ``event`` to the ledger, unless it would take ε past the target ``epsilon``
        (σ was calibrated to reach it over ``federated.rounds`` uploads): then refuse."""
        target = self.dp.epsilon
        if target is not None:
            spent = self.epsilon(events=[*self.events, event])
            if spent > target * (1 + 1e-6):
                raise RuntimeError(f"{self.party.name}: this upload would spend ε {spent:.4g}, past the budget "
                                   f"ε {target:g} of its own settings (federated.dp.epsilon over "
                                   f"federated.rounds={self.cfg.federated.rounds} uploads); refusing to upload")
        self.events.append(event)

    def _row_holders(self, key: str, among: list[str] | None = None) -> Tensor:
        """Distributed: per row of ``key``, how many parties share its noise, counted from the
        peers this client masks the row with (secure aggregation's round, this same object)."""
        if not hasattr(self, "row_holders"):
            raise RuntimeError(f"{self.party.name}: distributed DP needs secure aggregation's round state")
        u = self._reference[key]
        return self.row_holders(key, u.shape[0] if u.dim() > 1 else 1, among)

    def handle(self, stage, message, round):
        sent = sorted({*(k for k in message.config if k == "dp"), *(k for k in message.arrays if k.startswith(PREFIX))})
        if sent:
            raise RuntimeError(f"{self.party.name}: the server sent noise settings {sent}; this client takes σ "
                               "from its own policy and its holder counts from its own masking, never from the "
                               "server; refusing")
        if stage == "sa_unmask" and self.dp.placement == "distributed":
            lowered = self._realised(message.config["sa"], round)  # before the secure half spends the round
            reply = super().handle(stage, message, round) or Message()
            self._lower(round, lowered)
            return Message(arrays=reply.arrays, metrics={**reply.metrics, **self._report(round)}, config=reply.config)
        if stage not in MASKED:
            return super().handle(stage, message, round)
        reply = super().handle(stage, message, round)
        if self._reference is None:
            raise RuntimeError(f"{self.party.name}: federated.dp needs a download before the first upload")
        raw = {k: v - self._reference[k] for k, v in reply.arrays.items()}
        norms = update_norms(raw, self.dp.unit)
        update = clip_update(raw, self.dp.clip, self.dp.unit)
        sigma = self.sigma(update)
        step = noiselib.grid(self.dp.clip)
        slack = noiselib.grid_slack(self.dp.clip, clipped_coordinates(update, self.dp.unit))
        stds, k_used = {}, 1
        for key, u in update.items():
            stds[key] = sigma * self.dp.clip
            if self.dp.placement == "distributed":
                k = self._row_holders(key).to(torch.float64)
                k_used = max(k_used, int(k.max()))
                # one count per row (a tensor shared whole has one), broadcast over the row's values
                stds[key] = stds[key] / (k.view(-1, *([1] * (u.dim() - 1))) if u.dim() else k[0]).sqrt()
        # charged before anything leaves: a release the server reads without asking this
        # client again (an unmasking with the other survivors' shares) is already counted
        self._charge((int(round), sigma, slack, sigma / math.sqrt(k_used)))
        noisy = {key: (self._reference[key].double() + noiselib.snapped_release(u, stds[key], step)).to(u.dtype)
                 for key, u in update.items()}
        # what a user tunes ``clip`` by (the client's own TensorBoard, not the wire)
        self.party.log({"privacy/clipped_fraction": float((norms > self.dp.clip).double().mean()),
                        "privacy/median_update_norm": float(norms.median())}, round)
        metrics = {k: v for k, v in reply.metrics.items() if k not in DROPPED}
        metrics.update(self._report(round))
        return Message(arrays=noisy, metrics=metrics, config=reply.config)

    def _realised(self, sa: dict, round: int) -> float | None:
        """Distributed: the multiplier left on the sum if only the survivors ``sa`` names
        unmask: ``σ·√(min k_survivors / k)`` over this client's rows, counted from its own
        masking (None: no upload of this round on the ledger)."""
        if not self.events or self.events[-1][0] != int(round) or not hasattr(self, "row_holders"):
            return None
        survivors = list(sa.get("survivors", []))
        ratio = 1.0
        for key in self._reference or {}:
            k2 = self._row_holders(key).double()
            k3 = self._row_holders(key, survivors).double()
            ratio = min(ratio, float((k3 / k2).min()))
        return self._sigma * math.sqrt(ratio)

    def _lower(self, round: int, realised: float | None) -> None:
        """Lower this round's charged σ to the realised one (never raise it: the survivors
        the server names can only make ε larger)."""
        if realised is not None and self.events and self.events[-1][0] == int(round):
            r, sigma, slack, own = self.events[-1]
            self.events[-1] = (r, min(sigma, realised), slack, own)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        state = super().state_dict()
        state["dp_events"] = [list(e) for e in self.events]
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._merge_events([tuple(e) for e in state["dp_events"]])

    def spent_state(self) -> dict:
        return {**super().spent_state(), "dp_events": [list(e) for e in self.events]}

    def load_spent_state(self, state: dict) -> None:
        super().load_spent_state(state)
        self._merge_events([tuple(e) for e in state.get("dp_events", [])])

    def _merge_events(self, saved: list[tuple]) -> None:
        """Privacy spent never goes back: keep the longer ledger (a restored state's is the
        shorter), and of two of one length each event's smaller σ."""
        if len(saved) > len(self.events):
            self.events = [(int(r), float(s), float(sl), float(o)) for r, s, sl, o in saved]
        elif len(saved) == len(self.events):
            self.events = [(r, min(s, float(saved[i][1])), sl, o) for i, (r, s, sl, o) in enumerate(self.events)]


class DPUploads(Protection):
    """``federated.dp`` as a protection: outermost on the server (it annotates the downloads
    secure aggregation builds and reads the clients' ε from their replies), inside secure
    aggregation on a client (whose masks cover what it noised)."""

    name = "dp"
    prefix = "DP"
    server_order = 0
    client_order = 1

    @classmethod
    def check(cls, cfg, strategy) -> None:
        dplib.require()
        check_dp_config(cfg, strategy)

    @classmethod
    def halves(cls) -> tuple[type, type]:
        return DPServer, DPClient
