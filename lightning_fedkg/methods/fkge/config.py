"""The ``fkge`` method's config section(s)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from lightning_fedkg.config import ConfigError, Range

__all__ = ["FKGEConfig", "check_fkge_config"]


@dataclass
class FKGEConfig:
    """``federated.fkge``: FKGE's pairwise handshakes (Peng et al., CIKM 2021, §3).

    Each party (one KG of ``data``'s multi-source federation) first trains alone: at most
    ``pretrain_epochs``, and with ``pretrain_patience`` its validation MRR is scored every
    ``pretrain_eval_every`` epochs and pre-training stops after that many scores without a
    new best (convergence, stated in ``metrics.json`` → ``kgs[i].pretrain``). Each party
    saves its pre-trained model to ``<run>/pretrained/<party>.pt``; ``pretrained_from: RUN``
    starts every party from that run's files instead (variants and controls from one
    converged start, as the paper's experiments do). Then it offers its embeddings to every partner it shares items
    with. A host runs PPAT with one queued client at a time and a KGEmb-Update of
    ``update_epochs`` on its own graph, kept only if ``backtrack_on`` MRR improved (else the
    exact previous state is restored); an accepted update makes it offer itself again.

    Data: ``align`` picks what PPAT translates (``entities``, the code's; ``relations``;
    ``both``, the paper's); ``align_fraction`` keeps that share of the aligned entities (the
    paper's 20-100% ablation), after ``holdout_fraction`` of them (the last in alignment
    order) are held out of every alignment and update to score the translation per
    handshake (``heldout_*`` in metrics.json); ``neighbours`` translated non-aligned neighbours per aligned
    entity become virtual entities of the host (0: aligned rows only; the code's strategy_2
    uses 1); ``shared_relations`` is the share of relations dealt to every source when one KG
    is cut into sources (needed for relation alignment). ``mode``: ``replace`` the host's
    aligned rows (paper) or ``average`` (code); ``none`` is the control that runs the same
    handshakes and updates but trains without anything received (the Independent baseline
    at equal training and backtracking). ``shuffle_received`` is a second control: the host
    permutes the translated aligned rows before using them, so they keep their values and
    lose which item each one is (what remains of a gain is not knowledge about the items).

    PPAT (:mod:`lightning_fedkg.methods.fkge.ppat`): at most ``ppat_epochs`` over the aligned
    rows in batches of ``ppat_batch_size``, and with ``ppat_patience`` the host's stopping
    rule (that many epochs without the mean generator loss dropping ``ppat_tolerance``
    below its best end the PPAT); MUSE's discriminator recipe: label ``smoothing`` and input
    ``dropout``; ``teachers`` PATE teachers and noise ``Lap(1/lam)``;
    every discriminator SGD ``lr``/``momentum`` (paper: 0.02, 0.9), width ``hidden``; the
    generator ``generator_lr``/``generator_momentum`` (None: the discriminators'),
    ``generator_init``, MUSE's ``orthogonalize`` beta.

    Budgets: a host hosts at most ``handshakes_per_kg`` handshakes, none after
    ``max_seconds`` (counted from its start in this process: a resumed run counts again),
    and answers no PATE query that would take its epsilon (at
    ``delta``) past ``max_epsilon``. ``federated.backend`` picks the execution mode.

    ``alignment``: ``ppat`` (the paper's GAN), ``supervised``
    (:mod:`lightning_fedkg.methods.fkge.supervised`: the host releases the cross-covariance
    of its aligned rows' directions with the client's rotated (optionally whitened) ones under the
    Gaussian mechanism, noise calibrated exactly so one handshake costs ``dp_epsilon`` at
    ``delta``; ``null``: exact, not private; the client fits ``W`` from it and its own rows)
    or ``random``: the control that removes the alignment, a fresh Haar-random rotation per
    handshake drawn from ``seed`` (nothing released under a mechanism; not a protocol, the
    host could recompute it), with the same schedule (``schedule``) and update.
    ``whiten_power``: the client sends ``unit(Z C^-p)`` (``C`` its rows' covariance) and
    decodes by ``polar(M B^T)``; 0 (default): its rows as they are, plain Procrustes; null:
    the ``p`` in [0, 1] with the smallest error predicted for near-isometric spaces (0 for
    the exact release). Whitening fixes the synthetic task's weak axes and hurts on UMLS,
    whose spaces are far from isometric (docs/results/fkge.md).
    ``dp_neighbours``: the neighbouring relation that ``dp_epsilon`` and the ledger are under,
    on the unit "one aligned entity's row" of the host: ``replace`` (default; one row
    replaced by any other, sensitivity 2) or ``add_remove`` (one aligned pair added or
    removed, sensitivity 1: half the noise for the same ``dp_epsilon``). ``metrics.json``
    reports the add/remove figure beside (``privacy.epsilon_add_remove``).

    Privacy per party: one :class:`~lightning_fedkg.methods.fkge.ledger.PrivacyLedger` per KG composes
    everything it releases under a mechanism (PATE labels, DP targets) into the
    ``epsilon`` of ``metrics.json`` and lists what no mechanism covers (``privacy.unprotected``:
    translated rows sent as a client, accept broadcasts, exact targets). With
    ``max_epsilon`` a party whose next accounted release would pass it releases nothing
    more: it stops hosting, declines to serve as a client and stops broadcasting. The
    epsilon's unit is one aligned entity's row; it does not bound what a party's KG reveals
    at triple level (one triple can move every row of its embedding).

    ``schedule``: the ``metrics.json`` (or run folder) of an earlier run; each KG then hosts
    exactly the partners it hosted there, in the same order, whatever its updates' outcomes
    -- with ``mode: none`` the control at an equal handshake schedule.

    ``reproducible_noise``: False (default) seeds each party's secret draws, a host's PATE
    noise and a client's initial generator ``W``, from the operating system's secure
    randomness, so no other party can recompute them; True derives them from ``seed``, the
    party names and the handshake number (all known to the partner): bit-reproducible runs
    for tests and debugging, which are **not private** (the client could subtract the noise
    from the labels; the host could invert ``W₀`` while ``W`` has barely moved).
    """

    pretrain_epochs: int = field(default=50, metadata={"range": Range(min=0)})
    pretrain_patience: Optional[int] = field(default=None, metadata={"range": Range(min=1)})
    pretrain_eval_every: int = field(default=5, metadata={"range": Range(min=1)})
    pretrained_from: Optional[str] = None
    update_epochs: int = field(default=10, metadata={"range": Range(min=0)})
    align: Literal["entities", "relations", "both"] = "entities"
    align_fraction: float = field(default=1.0, metadata={"range": Range(min=0, max=1, min_exclusive=True)})
    holdout_fraction: float = field(default=0.0, metadata={"range": Range(min=0, max=1, max_exclusive=True)})
    neighbours: int = field(default=1, metadata={"range": Range(min=0)})
    shared_relations: float = field(default=0.0, metadata={"range": Range(min=0, max=1, max_exclusive=True)})
    mode: Literal["replace", "average", "none"] = "replace"
    shuffle_received: bool = False
    backtrack_on: Literal["valid", "test"] = "valid"
    ppat_epochs: int = field(default=1, metadata={"range": Range(min=1)})
    ppat_patience: Optional[int] = field(default=None, metadata={"range": Range(min=1)})
    ppat_tolerance: float = field(default=1e-3, metadata={"range": Range(min=0)})
    smoothing: float = field(default=0.0, metadata={"range": Range(min=0, max=0.5, max_exclusive=True)})
    dropout: float = field(default=0.0, metadata={"range": Range(min=0, max=1, max_exclusive=True)})
    ppat_batch_size: int = field(default=32, metadata={"range": Range(min=1)})
    teachers: int = field(default=4, metadata={"range": Range(min=1)})
    lam: float = field(default=0.05, metadata={"range": Range(min=0, min_exclusive=True)})
    delta: float = field(default=1e-5, metadata={"range": Range(min=0, max=1, min_exclusive=True,
                                                                  max_exclusive=True)})
    hidden: int = field(default=1024, metadata={"range": Range(min=1)})
    lr: float = field(default=0.02, metadata={"range": Range(min=0, min_exclusive=True)})
    momentum: float = field(default=0.9, metadata={"range": Range(min=0, max=1)})
    generator_lr: Optional[float] = field(default=None, metadata={"range": Range(min=0, min_exclusive=True)})
    generator_momentum: Optional[float] = field(default=None, metadata={"range": Range(min=0, max=1)})
    generator_init: Literal["orthogonal", "identity", "xavier"] = "orthogonal"
    orthogonalize: float = field(default=0.0, metadata={"range": Range(min=0)})
    teacher_fakes: Literal["own", "all"] = "own"
    saturating: bool = False
    reproducible_noise: bool = False
    handshakes_per_kg: int = field(default=4, metadata={"range": Range(min=0), "resume": "free"})
    max_seconds: Optional[float] = field(default=None, metadata={"range": Range(min=0, min_exclusive=True),
                                                                 "resume": "free"})
    max_epsilon: Optional[float] = field(default=None, metadata={"range": Range(min=0, min_exclusive=True)})
    alignment: Literal["ppat", "supervised", "random"] = "ppat"
    whiten_power: Optional[float] = field(default=0.0, metadata={"range": Range(min=0, max=1)})
    dp_epsilon: Optional[float] = field(default=4.0, metadata={"range": Range(min=0, min_exclusive=True)})
    dp_neighbours: Literal["replace", "add_remove"] = "replace"
    schedule: Optional[str] = None


def check_fkge_config(fk: FKGEConfig) -> None:
    """Refuse, before any training, a privacy budget under which no handshake can happen
    (the run would pre-train, release nothing and exit 0). Raises :class:`ConfigError`
    naming the keys."""
    if fk.max_epsilon is None or fk.alignment == "random":
        return
    from .ledger import PrivacyLedger
    from .supervised import release_cost

    ledger = PrivacyLedger(fk.lam, delta=fk.delta, neighbours=fk.dp_neighbours)
    if fk.alignment == "supervised":
        if fk.dp_epsilon is None:
            raise ConfigError("federated.fkge.dp_epsilon: null (the exact release, not private) with "
                              f"federated.fkge.max_epsilon={fk.max_epsilon:g} allows no handshake: an exact "
                              "release has no finite epsilon; set federated.fkge.max_epsilon=null or a dp_epsilon")
        cost = release_cost(fk.dp_epsilon, fk.delta, ledger.max_order, fk.dp_neighbours)
        first = ledger.epsilon_after_gaussian(cost.log_moments, cost.mu)
        if first > fk.max_epsilon:
            raise ConfigError(f"federated.fkge.dp_epsilon={fk.dp_epsilon:g} per release is above "
                              f"federated.fkge.max_epsilon={fk.max_epsilon:g}: no handshake fits the budget")
        return
    first = ledger.epsilon_after_pate(1)
    if first > fk.max_epsilon:
        raise ConfigError(f"federated.fkge.max_epsilon={fk.max_epsilon:g} is below what one PATE label costs at "
                          f"federated.fkge.lam={fk.lam:g}, federated.fkge.delta={fk.delta:g} ({first:.3f}): "
                          "no PPAT batch can be answered; raise max_epsilon or lower lam")
