"""The ``fedlu`` method's config section(s)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from lightning_fedkg.config import Range, SEED_RANGE

__all__ = ["FedLUConfig", "UnlearnConfig"]


@dataclass
class FedLUConfig:
    """``federated.fedlu``: FedLU's mutual distillation (Zhu et al., WWW 2023, §4.2).

    Each client keeps local entity embeddings and an avatar of the global ones, scored with
    its own relations (:class:`~lightning_fedkg.methods.fedlu.distillation.DistillationModule`).
    ``mu`` weighs the KL term between the two score distributions (FedLU's script: 2.0).
    ``schedule``: ``always`` distils from the first round (the paper's text); ``gated``
    switches each direction on once validation says so, as the official code does
    (:class:`~lightning_fedkg.methods.fedlu.strategy.DistillationGate`), never before
    round ``wait_rounds`` unless a side stops improving. ``init_local_from_global`` starts
    the local entity table as a copy of the first avatar the client receives (the code's
    ``E_loc = E_glb = E_0[idx]``). ``avatar_eval``: the avatar is validated and tested with
    the ``aggregated`` rows the server sends, or as each client trained it, ``before_aggregation``
    (the official code's order: its clients validate before the server averages; the core
    ``federated.evaluate=before_aggregation`` does the same for every method).
    ``early_stopping``: which validations count toward ``federated.patience``. ``local``
    (default) counts every evaluation where the local validation MRR (the monitored result)
    does not improve; ``official`` counts only evaluations where neither the local nor the
    avatar's validation MRR improves, the official code's rule (its ``bad_iter`` is left
    unchanged when only the avatar improves), for parity.
    """

    mu: float = field(default=2.0, metadata={"range": Range(min=0)})
    schedule: Literal["gated", "always"] = "gated"
    wait_rounds: int = field(default=20, metadata={"range": Range(min=0)})
    init_local_from_global: bool = True
    avatar_eval: Literal["aggregated", "before_aggregation"] = "aggregated"
    early_stopping: Literal["local", "official"] = "local"


@dataclass
class UnlearnConfig:
    """``unlearn``: federated unlearning of a finished run (``fedkg unlearn``; FedLU §4.3).

    ``forget``: ``file`` takes each client's ``unlearn`` split (FedLU's ``unlearn.txt``);
    ``sample`` draws ``fraction`` of each client's training triples (seeded by ``seed``);
    ``auto`` (the default) is ``file`` when some client has an ``unlearn`` split, else
    ``sample`` (so ``fedkg unlearn --from RUN`` works on the bundled KGs as written).
    Retroactive interference runs ``interference_epochs`` over the forgetting set (hard
    confusion with the forgotten triple weighted ``forget_weight``, soft confusion weighted
    ``mu_soft``, and for the avatar distillation from the local side weighted
    ``mu_distill``); passive decay runs at most ``decay_epochs`` of mutual distillation
    (also weighted ``mu_distill``) on the retained triples, stopping at the first
    epoch whose local validation MRR does not improve. ``propagate_rounds`` normal
    aggregation rounds then carry the change into the global model (0: as the official
    code, the client's own avatar only). ``official_updates`` takes the official code's
    update counts (2 local + 2 avatar interference steps per forget batch and epoch, 5 decay
    steps per retained batch) instead of ours (1 + 1, and 1); see
    :mod:`~lightning_fedkg.methods.fedlu.client_unlearning`.

    ``retrain`` trains the gold standard from scratch without the forgotten triples, for
    ``retrain_rounds`` rounds (None: an equal budget, the source run's rounds plus the
    rounds the unlearning trained, i.e. ⌈most decay epochs a client ran / federated.local_epochs⌉
    + ``propagate_rounds``), with the source's early stopping; the membership-inference AUC
    is always reported. ``lr``/``batch_size`` None take ``train.lr``/``train.batch_size``.
    """

    forget: Literal["auto", "file", "sample"] = "auto"
    fraction: float = field(default=0.01, metadata={"range": Range(min=0, max=1, min_exclusive=True)})
    seed: int = field(default=0, metadata={"range": SEED_RANGE})
    interference_epochs: int = field(default=10, metadata={"range": Range(min=0)})
    decay_epochs: int = field(default=10, metadata={"range": Range(min=0)})
    forget_weight: float = field(default=10.0, metadata={"range": Range(min=0)})
    mu_soft: float = field(default=0.05, metadata={"range": Range(min=0)})
    mu_distill: float = field(default=2.0, metadata={"range": Range(min=0)})
    lr: Optional[float] = field(default=None, metadata={"range": Range(min=0, min_exclusive=True)})
    batch_size: Optional[int] = field(default=None, metadata={"range": Range(min=1)})
    propagate_rounds: int = field(default=1, metadata={"range": Range(min=0)})
    official_updates: bool = False
    retrain: bool = True
    retrain_rounds: Optional[int] = field(default=None, metadata={"range": Range(min=1)})
