"""The Strategy interface: everything method-specific in a federated run lives behind it.

The orchestrator (``federated/orchestrator.py``) only loops over rounds; a strategy says
which clients train, what the server sends them, what they send back and how the server
combines it. Per round the orchestrator calls::

    selected = strategy.select_clients(round)
    strategy.distribute(round, selected, learners)   # default: download(k) → Channel → merge
    ...each selected learner fits E local epochs...
    strategy.collect(round, selected, learners)      # default: upload → Channel → aggregate
    # every eval_every rounds, for every client k:
    strategy.prepare_evaluation(k, clients[k], round); clients[k] validates

The fine-grained hooks (``download``, ``merge``, ``upload``, ``aggregate``) cover the
server-client methods (FedE, FedR, FedLU's avatar table, secure aggregation's masked
uploads). ``distribute``/``collect`` are the coarse extension points for protocols that do
not fit "server sends, clients answer" — FKGE's peer-to-peer handshakes send
``client_i → client_j`` through the same :class:`~lightning_fedkg.federated.channel.Channel`.
A strategy may train other parties than the evaluating clients (``learners``), which is how
the centralised *Entire* reference trains one model on the union graph.

A *client* here is any object with ``index`` (int), ``name`` (``"client_k"``) and
``module`` (a LightningModule with a ``model`` attribute, e.g.
:class:`~lightning_fedkg.models.kge_module.KGEModule`); the orchestrator's
:class:`~lightning_fedkg.federated.orchestrator.Client` adds the datamodule and Trainer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from lightning_fedkg.federated.channel import Channel

if TYPE_CHECKING:
    from lightning_fedkg.config import ExperimentConfig

__all__ = [
    "SERVER",
    "Strategy",
    "client_name",
    "num_selected",
    "parameters_by_prefix",
    "read_parameters",
    "write_parameters",
]

#: The party name of the central server in Channel records.
SERVER = "server"

Payload = dict[str, Tensor]


def client_name(k: int) -> str:
    """The Channel party name of client ``k``."""
    return f"client_{k}"


def num_selected(fraction: float, num_clients: int) -> int:
    """Clients sampled per round: ``max(round(F·C), 1)`` with halves rounded up, capped at ``C``."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"federated.fraction must be in (0, 1], got {fraction}")
    return min(num_clients, max(1, math.floor(fraction * num_clients + 0.5)))


def parameters_by_prefix(model: nn.Module, prefix: str) -> dict[str, nn.Parameter]:
    """The model's own (non-nested) parameters whose names start with ``prefix``.

    The KGE parameter contract (``models/kge.py``): per-entity tables are named
    ``entity_*`` and per-relation tables ``relation_*``, first dimension = number of rows.
    """
    return {n: p for n, p in model.named_parameters(recurse=False) if n.startswith(prefix)}


def read_parameters(model: nn.Module, names: Sequence[str]) -> Payload:
    """Detached views of the named parameters (the Channel copies them on send)."""
    params = dict(model.named_parameters(recurse=False))
    return {n: params[n].detach() for n in names}


@torch.no_grad()
def write_parameters(model: nn.Module, payload: Mapping[str, Tensor]) -> None:
    """Copy ``payload`` into the model's parameters *in place*.

    In-place keeps the ``Parameter`` objects, so an optimizer that persists across rounds
    stays bound to them (LIBRARIES §2b). Shapes must match exactly.
    """
    params = dict(model.named_parameters(recurse=False))
    for name, value in payload.items():
        if name not in params:
            raise KeyError(f"payload names unknown parameter {name!r}")
        if params[name].shape != value.shape:
            raise ValueError(
                f"payload {name!r} has shape {tuple(value.shape)}, parameter has {tuple(params[name].shape)}"
            )
        params[name].copy_(value)


class Strategy:
    """Base class of federated settings; the defaults implement a silent, isolated run.

    Subclasses override the hooks they need. Server-side state (union tables, index
    maps, the client-selection generator) must be returned by :meth:`state_dict` so that
    a run resumed from a checkpoint continues identically.
    """

    #: The ``federated.strategy`` config value this class implements.
    name: str = "base"

    def __init__(self) -> None:
        self.channel: Channel = Channel()
        self.generator = torch.Generator()
        self.fraction: float = 1.0
        self.num_learners: int = 0

    # ------------------------------------------------------------------ setup
    def setup(
        self,
        fkg: Any,
        clients: Sequence[Any],
        cfg: "ExperimentConfig",
        *,
        channel: Channel | None = None,
        make_learner: Callable[[str, Any], Any] | None = None,
    ) -> None:
        """Build the server state before round 1.

        Args:
            fkg: the :class:`~lightning_fedkg.data.federated.FederatedKG` (index maps
                ``entity_index``/``relation_index``, existence vectors, ``union()``).
            clients: one client per KG of ``fkg``, in order; they are the parties evaluated.
            cfg: the experiment config (``cfg.federated`` holds F, E, aggregation, ...).
            channel: where every payload goes; a private one is created if omitted.
            make_learner: ``(name, KnowledgeGraph) -> client`` factory for strategies that
                train parties other than ``clients`` (Entire).
        """
        if channel is not None:
            self.channel = channel
        self.fraction = cfg.federated.fraction
        self.generator.manual_seed(int(cfg.seed) + 7919)
        self.num_learners = len(self.learners(clients))

    def learners(self, clients: Sequence[Any]) -> list[Any]:
        """The parties that train each round (indices of ``select_clients`` refer to them)."""
        return list(clients)

    # ------------------------------------------------------------------ per round
    def select_clients(self, round: int, generator: torch.Generator | None = None) -> list[int]:
        """Sorted indices of the learners that train in ``round``.

        Default: ``max(round(F·C), 1)`` learners drawn uniformly without replacement from
        the strategy's own seeded generator (part of :meth:`state_dict`), or from
        ``generator`` when given.
        """
        g = generator if generator is not None else self.generator
        m = num_selected(self.fraction, self.num_learners)
        perm = torch.randperm(self.num_learners, generator=g)
        return sorted(int(i) for i in perm[:m])

    def download(self, k: int) -> Payload | None:
        """Server → learner ``k`` payload at the start of a round (``None``: nothing to send)."""
        return None

    def merge(self, client: Any, payload: Payload) -> None:
        """Learner-side: apply a received download to its own module."""

    def upload(self, client: Any) -> Payload | None:
        """Learner → server payload after local training (``None``: nothing to send)."""
        return None

    def aggregate(self, uploads: dict[int, Payload]) -> None:
        """Server-side: combine ``{learner index: received upload}`` into the server state."""

    def distribute(self, round: int, selected: Sequence[int], learners: Sequence[Any]) -> None:
        """Move the round's downloads over the Channel and merge them (per selected learner)."""
        for k in selected:
            payload = self.download(k)
            if payload is None:
                continue
            received = self.channel.send(SERVER, learners[k].name, "download", payload, round)
            self.merge(learners[k], received)

    def collect(self, round: int, selected: Sequence[int], learners: Sequence[Any]) -> None:
        """Move the selected learners' uploads over the Channel, then :meth:`aggregate`."""
        uploads: dict[int, Payload] = {}
        for k in selected:
            payload = self.upload(learners[k])
            if payload is None:
                continue
            uploads[k] = self.channel.send(learners[k].name, SERVER, "upload", payload, round)
        if uploads:
            self.aggregate(uploads)

    def prepare_evaluation(self, k: int, client: Any, round: int, name: str = "eval_download") -> None:
        """Put into ``client.module`` what client ``k`` is evaluated with (default: its own state).

        Anything a server contributes must travel through the Channel, logged in ``round``
        under ``name`` (``eval_download`` for validation, ``test_download`` for the test).
        """

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Server state needed to resume; subclasses extend the dict."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.generator.set_state(state["generator"])
