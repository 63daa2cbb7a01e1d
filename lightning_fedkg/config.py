"""Typed experiment configuration: dataclasses + omegaconf, YAML files and dotlist overrides.

Loading merges the structured defaults, the YAML file, then ``key=value`` overrides; an
unknown key is an error listing the valid keys of its section. Fields describe themselves
through ``dataclasses.field(metadata=...)``: ``{"range": Range(...)}`` is checked by
:func:`validate_ranges`, ``{"resume": "free"}`` marks a field that may change when a run is
resumed (everything else is in :func:`resume_fingerprint`). Entry point: :func:`load_config`.
The keys are listed in docs/usage.md.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import types
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass, replace
from pathlib import Path
from typing import IO, Any, Dict, Literal, Optional, Sequence

import yaml  # omegaconf's own YAML parser (PyYAML), already loaded with it
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

log = logging.getLogger("lightning_fedkg")

__all__ = [
    "ConfigError",
    "Range",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "TrainerConfig",
    "FederatedConfig",
    "SecureAggregationConfig",
    "DPConfig",
    "ExperimentConfig",
    "load_config",
    "build_config",
    "core_config",
    "experiment_class",
    "section_classes",
    "config_from_container",
    "resume_differences",
    "parse_yaml",
    "save_config",
    "config_from_yaml_text",
    "validate_model_and_train",
    "validate_names",
    "party_config",
    "validate_ranges",
    "resume_fingerprint",
    "fingerprint_differences",
    "show_progress_bar",
    "resolve_auto_settings",
]


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message says how to fix it."""


@dataclass(frozen=True)
class Range:
    """The allowed interval of a numeric config field, declared as ``metadata={"range": ...}``.

    ``None`` leaves that side unbounded; a bound is inclusive unless ``*_exclusive``.
    Non-finite values (``nan``, ``inf``) are always outside.
    """

    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies inside the interval."""
        if not math.isfinite(value):
            return False
        if self.min is not None and (value <= self.min if self.min_exclusive else value < self.min):
            return False
        if self.max is not None and (value >= self.max if self.max_exclusive else value > self.max):
            return False
        return True

    def describe(self) -> str:
        """The constraint as the error message states it, e.g. ``>= 1`` or ``in (0, 1]``."""
        if self.min is not None and self.max is not None:
            left = "(" if self.min_exclusive else "["
            right = ")" if self.max_exclusive else "]"
            return f"in {left}{_number(self.min)}, {_number(self.max)}{right}"
        if self.min is not None:
            return f"{'>' if self.min_exclusive else '>='} {_number(self.min)}"
        if self.max is not None:
            return f"{'<' if self.max_exclusive else '<='} {_number(self.max)}"
        return "a finite number"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


#: Lightning's ``seed_everything`` (and NumPy) accept unsigned 32-bit seeds only.
SEED_RANGE = Range(min=0, max=2**32 - 1)


@dataclass
class DataConfig:
    """Which knowledge graph(s) to load.

    ``name`` is a bundled dataset (``umls``, ``nations``, ``kinship``) or a path. For a
    federated run a single KG is split into ``num_clients`` clients, seeded by
    ``partition_seed``: ``partition: relation`` gives each client whole relations (FedE's
    procedure; clients share entities, not relations), ``random`` deals out triples at
    random (clients share relations too, where FedR differs from Single), ``clustered``
    gives each client one spectral cluster of co-occurring relations (FedLU's C-k split; needs
    the ``clustered`` extra, scikit-learn). A folder of
    pre-split clients (``client_<k>/`` or FedLU's ``<k>/``) is loaded as it is.

    ``client_entities``: ``own`` (default) sizes each client's entity table to the entities of
    its own triples; ``all`` gives every client every entity of the federation, as the FedCQA
    code does (its softmax and in-graph ranking then run over all entities; see
    :meth:`~lightning_fedkg.data.federated.FederatedKG.with_all_entities`). Every client then
    knows every entity of the federation, which ``own`` keeps from it (a client learns only
    rows of entities it holds). In process and on Ray only (not with Flower, nor with
    ``fkge``, which aligns its KGs by names).
    """

    name: str = "umls"
    format: Literal["auto", "triples", "openke", "pyg_fb15k237", "pyg_wn18rr"] = "auto"
    num_clients: int = field(default=3, metadata={"range": Range(min=1)})
    partition_seed: int = field(default=12345, metadata={"range": SEED_RANGE})
    partition: Literal["relation", "random", "clustered"] = "relation"
    client_entities: Literal["own", "all"] = "own"


#: ``data.partition`` values that give each client whole relations: at most one client per relation.
RELATION_PARTITIONS = ("relation", "clustered")


def too_many_clients(name: str, relations: int, num_clients: int, partition: str) -> ConfigError:
    """The error for ``data.num_clients`` above what a split by relation (``partition``, one
    of :data:`RELATION_PARTITIONS`) can give of a KG with ``relations`` relations: raised by
    the partitioners and, before anything is loaded, by ``fedkg`` (``cli.check_num_clients``)."""
    return ConfigError(f"data.num_clients={num_clients}: {name} has {relations} relations and "
                       f"data.partition={partition} gives each client whole relations, so it can be split among "
                       f"at most {relations} clients; set data.num_clients to at most {relations}, or "
                       f"data.partition=random to deal out triples instead")


#: The ``train.loss`` values (:func:`lightning_fedkg.models.kge_module.kge_loss`).
LOSSES = ("self_adversarial", "uniform", "margin")
#: The ``train.optimizer`` values (:mod:`lightning_fedkg.models.optimizers`).
OPTIMIZERS = ("adam", "sparse_adam")

#: ModelConfig fields that are keyword options of particular models (None = model default).
MODEL_OPTION_KEYS = ("p_norm", "relation_dim", "orthogonality_margin")
#: ModelConfig fields every model takes.
MODEL_CORE_KEYS = ("name", "dim", "gamma", "epsilon")


@dataclass
class ModelConfig:
    """The KGE score function (parameterised as the official FedE, FedLU and RotatE code).

    ``name`` is a registered model (``transe``, ``transh``, ``transr``, ``transd``,
    ``distmult``, ``complex``, ``rotate``; see ``lightning_fedkg.models.MODELS``) or an import
    path ``package.module:Class`` of a ``KGEModel`` subclass. ``p_norm`` (Trans*),
    ``relation_dim`` (TransR/TransD) and ``orthogonality_margin`` (TransH) are model options:
    None keeps the model's own default, and setting one the model does not take is an error.
    """

    name: str = "transe"
    dim: int = field(default=128, metadata={"range": Range(min=1)})
    gamma: float = field(default=10.0, metadata={"range": Range(min=0, min_exclusive=True)})
    epsilon: float = field(default=2.0, metadata={"range": Range(min=0)})
    p_norm: Optional[float] = None
    relation_dim: Optional[int] = None
    orthogonality_margin: Optional[float] = None

    def options(self) -> dict:
        """The model options that are set (not None), as keyword arguments of the model:
        the built-ins' (:data:`MODEL_OPTION_KEYS`) and a user model's own (fields a config
        adds for it, :func:`model_option_fields`)."""
        keys = [f.name for f in fields(self) if f.name not in MODEL_CORE_KEYS]
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass
class TrainConfig:
    """Optimisation, negative sampling and evaluation protocol of one learner.

    ``loss`` is ``self_adversarial``, ``uniform`` or ``margin`` (the margin ranking loss,
    with ``margin``). ``subsampling`` weights each triple's loss by RotatE's/FedLU's frequency
    weights (``lightning_fedkg.data.datamodule.subsampling_weights``) instead of a plain mean.
    ``fixed_negatives`` draws one epoch of batches and negatives once and replays it every
    epoch and round (the official FedLU code's sampling; ``LoaderSettings(fixed_negatives=)``).
    ``eval_chunk_size`` bounds how many evaluation queries are scored at once (None: a whole
    ``eval_batch_size`` batch). ``valid_filter: without_unlearn`` leaves a KG's ``unlearn``
    triples (FedLU's forgetting sets) out of the validation filter, as the official FedLU
    code does; for parity only (``all``, the default, filters validation like the test).
    ``batches_per_step`` hands the module that many batches per Lightning step, each its
    own optimizer step: the same updates in the same order, with Lightning's per-step
    work (hooks, batch transfer, loop bookkeeping) paid once per group.

    ``optimizer``: ``adam`` (the default, the official codes' dense ``torch.optim.Adam``: a
    step reads and writes every row of every table) or ``sparse_adam`` (the tables hand out
    row-sparse gradients and ``torch.optim.SparseAdam`` updates only the rows a batch
    touched, so a batch costs what it touches: PyTorch-BigGraph's and DGL-KE's approach, with
    lazy Adam instead of their row-wise Adagrad; :mod:`lightning_fedkg.models.optimizers`).
    A name rather than a ``sparse`` flag because the choice changes the update rule (lazy
    moments), not only its cost. With ``sparse_adam``: ``regularization`` covers the rows of
    the batch's positive triples; the step is never recorded (``trainer.capture: true`` and
    ``trainer.compile: true`` are errors); KGE learners only (FedLU's and FedCQA's refuse
    it); a loss term over whole tables (FedProx's or FedEC's with ``mu > 0``) stops the first
    step with an error.

    ``eval_candidates``: ``null`` (the default, every figure of the docs but the ones below)
    ranks each validation/test query against every entity, filtered; ``K`` ranks it
    against ``K`` entities drawn without replacement (one draw per evaluation batch, the same
    at every evaluation), filtered likewise: the protocol of graphs too large to rank in full
    (OGB's ``ogbl-wikikg2`` samples 500 per side). Its MRR and Hits@k are higher than the full
    ranking's and comparable only at the same ``K``; ``(rank - 1) · pool / K`` estimates the
    full rank minus one without bias
    (:func:`lightning_fedkg.evaluation.ranking.sampled_ranks`). ``K`` at least the entity
    count is the full ranking. Link-prediction learners only (FedE's fusion phase and the
    query-answering task rank in full). Figures that use it: the 10^6-entity evaluation of
    docs/results/scale.md (``K = 500``).
    """

    lr: float = field(default=1e-3, metadata={"range": Range(min=0, min_exclusive=True)})
    batch_size: int = field(default=512, metadata={"range": Range(min=1)})
    num_negatives: int = field(default=256, metadata={"range": Range(min=1)})
    negative_mode: Literal["per_triple", "shared"] = "per_triple"
    negative_sampler: Literal["uniform", "bernoulli"] = "uniform"
    filter_negatives: bool = False
    subsampling: bool = False
    fixed_negatives: bool = False
    corruption: Literal["tail", "head", "both"] = "both"
    loss: str = "self_adversarial"
    adversarial_temperature: float = field(default=1.0, metadata={"range": Range(min=0)})
    margin: float = field(default=1.0, metadata={"range": Range(min=0)})
    regularization: float = field(default=0.0, metadata={"range": Range(min=0)})
    # A fresh Adam at every fit(), i.e. every federated round (FedE's code); KGEModule's
    # default too. A single-KG run fits once, so there it changes nothing.
    reset_optimizer: bool = True
    max_epochs: int = field(default=100, metadata={"range": Range(min=1), "resume": "free"})
    eval_every: int = field(default=10, metadata={"range": Range(min=1)})
    patience: int = field(default=15, metadata={"range": Range(min=1)})
    eval_batch_size: int = field(default=256, metadata={"range": Range(min=1)})
    eval_sides: Literal["tail", "both"] = "both"
    valid_filter: Literal["all", "without_unlearn"] = "all"
    ties: Literal["mean", "optimistic", "pessimistic", "arbitrary"] = "mean"
    eval_chunk_size: Optional[int] = None
    batches_per_step: int = field(default=1, metadata={"range": Range(min=1), "resume": "free"})
    optimizer: Literal["adam", "sparse_adam"] = "adam"
    eval_candidates: Optional[int] = field(default=None, metadata={"range": Range(min=1)})


@dataclass
class TrainerConfig:
    """Where and how the run executes: every ``lightning.Trainer``'s arguments and the
    process's torch settings.

    ``progress_bar`` ``None`` (the default) draws bars only when stdout is a terminal (see
    :func:`show_progress_bar`). ``threads`` is the process's CPU thread budget (``None``:
    chosen when the run starts by :func:`lightning_fedkg.runtime.auto_threads`: one thread
    for the bundled tiny KGs, else the cores the 1-minute load average leaves free; set it
    when several runs share a machine; with ``federated.clients=ray`` it is each client
    worker's count, unset that automatic count shared out among the workers,
    :func:`lightning_fedkg.runtime.worker_threads`) and ``deterministic`` makes training bit-reproducible
    (deterministic algorithms, one thread unless ``threads`` is set); both are applied by
    :func:`lightning_fedkg.runtime.configure_torch`. ``devices``, ``progress_bar`` and
    ``threads`` may change when a run is resumed; ``accelerator``, ``precision`` and
    ``deterministic`` change what a step computes and may not. ``keep_on_device`` (federated
    runs on an accelerator) leaves each client's module and optimizer state on the device
    between its ``fit``/``validate``/``test`` calls instead of Lightning's move back to CPU
    after each; turn it off when the clients together do not fit in device memory.
    ``compile``: unset (the default), the Trans* models' L1 distances to a batch's shared
    candidates, and GQE's to the entity table (query answering), are compiled in training on
    CUDA, and on a CPU with ``compile_cpu``
    (:func:`lightning_fedkg.models.kge.families.compiling_pays`: a C++ compiler found,
    blocks of at least 2M elements, not ``deterministic``; faster, not bit for bit cdist's);
    ``true`` runs each training batch's whole score-and-loss through :func:`torch.compile`
    (:meth:`lightning_fedkg.models.KGEModule.compiled`); ``false`` compiles nothing. Compiled
    kernels may round differently from eager ones in the last bits, and the first batches of
    each shape pay the compilation (seconds per process). ``capture`` records each KGE
    training batch's whole step (losses, backward, Adam) as a CUDA graph and replays it per
    batch (:mod:`lightning_fedkg.models.captured`): ``None`` (the default) records on a CUDA
    device at ``32-true`` or ``bf16-mixed`` unless ``compile`` is true, ``false`` never; on a
    CPU the eager step runs either way. A recorded step skips Lightning's backward and
    optimizer-step hooks (``on_before_backward``, ``on_after_backward``,
    ``on_before_optimizer_step``), so callbacks on them do not fire.
    """

    accelerator: str = "auto"
    devices: int = field(default=1, metadata={"range": Range(min=1), "resume": "free"})
    precision: str = "32-true"
    progress_bar: bool | None = field(default=None, metadata={"resume": "free"})
    threads: int | None = field(default=None, metadata={"range": Range(min=1), "resume": "free"})
    deterministic: bool = False
    keep_on_device: bool = field(default=True, metadata={"resume": "free"})
    compile: bool | None = field(default=None, metadata={"resume": "free"})
    compile_cpu: bool = field(default=False, metadata={"resume": "free"})
    capture: bool | None = field(default=None, metadata={"resume": "free"})


@dataclass
class FlowerConfig:
    """``federated.flower``: how ``federated.backend=flower`` runs (:mod:`lightning_fedkg.backends.flower`).

    ``mode``: ``simulation`` (every ClientApp on this machine, Flower's simulation engine on
    Ray) or ``deployment`` (the ServerApp of a run submitted to a SuperLink, as ``fedkg
    flower up`` does; the clients are SuperNodes of other processes or machines).
    ``join_timeout``: seconds the server waits for every client to register before the run
    stops with the list of who joined. ``poll_interval``: seconds between the server's pulls
    of replies. ``reply_timeout``: the longest a stage waits for a client that is still
    connected (``federated.client_timeout`` wins when set; ``None``: no limit, a client that
    disconnects is a failure as soon as Flower reports it).
    ``keep_states``: how many of its latest states each client keeps on its own disk (what
    the server's checkpoints point to; states of a ``best`` set are kept apart).
    ``client_workers``: a long-lived client worker beside each client
    (:mod:`lightning_fedkg.backends.flower.worker`) keeps the party in memory, where a deployment
    otherwise starts a fresh ClientApp process per message that imports torch and rebuilds
    it. ``None`` (the default): on for deployments (``fedkg flower up``), off in simulation,
    whose Ray workers live for the whole run anyway.
    """

    mode: Literal["simulation", "deployment"] = field(default="simulation", metadata={"resume": "free"})
    join_timeout: float = field(default=300.0, metadata={"range": Range(min=0, min_exclusive=True), "resume": "free"})
    poll_interval: float = field(default=0.05, metadata={"range": Range(min=0, min_exclusive=True), "resume": "free"})
    reply_timeout: Optional[float] = field(default=None, metadata={"range": Range(min=0, min_exclusive=True),
                                                                   "resume": "free"})
    keep_states: int = field(default=12, metadata={"range": Range(min=2), "resume": "free"})
    client_workers: Optional[bool] = field(default=None, metadata={"resume": "free"})


@dataclass
class SecureAggregationConfig:
    """``federated.secure_aggregation``: masked uploads for every holder-mean strategy
    (FedE, FedR, FedProx, FedEC, FedLU's avatars), after Bonawitz et al. (CCS 2017);
    :mod:`lightning_fedkg.privacy.secure` says what each setting reveals.

    ``mode``: ``shared_rows`` (default) masks each row with the peers that hold it too, so a
    client learns which of its rows each peer holds; ``dense`` uploads every client's rows
    over the whole union (zeros elsewhere, a masked holder indicator beside them), so the
    server does not see which rows a client sent, at ``N / n_c`` times the bytes.
    ``threshold``: t of the t-of-n secret sharing, in ``[⌊n/2⌋ + 1, n]`` of the selected
    clients (at most half would let a server that splits the clients' views rebuild both
    secrets of one client): the round survives up to n − t dropouts (default
    ``⌊n/2⌋ + 1``; with ``active``, ``⌊2n/3⌋ + 1``). ``hide_aggregate``: every client adds its own offset derived from
    ``federated.federation_key`` (which must then be set), so the server learns neither
    the uploads nor their aggregate. ``active``: against a server that deviates from the
    protocol, signed key advertisements and a signed survivor list before any share is
    revealed (Bonawitz et al. §6; one more exchange per round), under each client's own
    identity key checked against a provisioned roster (:mod:`~lightning_fedkg.privacy.identities`).
    ``fractional_bits``: fixed-point precision; a mean is exact to ``2^-(bits+1)``.
    ``min_holders`` (``shared_rows``): a client uploads only the rows that at least this many
    parties of the round hold, counted from the peers it masks each row with, and keeps the
    others to itself (a row's aggregate over fewer would show the server those clients'
    rows); 2 by default, 3 to stand a server colluding with one client.
    """

    enabled: bool = False
    mode: Literal["shared_rows", "dense"] = "shared_rows"
    threshold: Optional[int] = field(default=None, metadata={"range": Range(min=1)})
    hide_aggregate: bool = False
    active: bool = False
    fractional_bits: int = field(default=16, metadata={"range": Range(min=1, max=30)})
    min_holders: int = field(default=2, metadata={"range": Range(min=1)})


@dataclass
class DPConfig:
    """``federated.dp``: clipped, Gaussian-noised uploads for every holder-mean strategy,
    with the privacy spent from dp-accounting (:mod:`lightning_fedkg.privacy.dp_uploads`).

    ``unit``: ``row`` clips each uploaded row's update (ε protects one entity's row) or
    ``client`` the whole update (ε protects a client's whole data, DP-FedAvg); ``clip`` is
    the L2 bound; set ``noise_multiplier`` (σ) or a target ``epsilon`` at ``delta`` (σ is
    then calibrated over ``federated.rounds``); ``placement``: ``local`` noise on every
    upload, or ``distributed`` shares under secure aggregation; ``accountant``: ``rdp`` or
    ``pld``; ``neighbours``: the relation ε is stated under, ``replace`` (one unit's data
    replaced by any other: sensitivity 2·clip, what a server that knows who participates
    can exploit) or ``add_remove`` (present or absent: sensitivity clip); ``metrics.json``
    gives the add/remove figure beside the configured one.
    """

    enabled: bool = False
    unit: Literal["row", "client"] = "row"
    clip: float = field(default=1.0, metadata={"range": Range(min=0, min_exclusive=True)})
    noise_multiplier: Optional[float] = field(default=None, metadata={"range": Range(min=0)})
    epsilon: Optional[float] = field(default=None, metadata={"range": Range(min=0, min_exclusive=True)})
    delta: float = field(default=1e-5, metadata={"range": Range(min=0, max=1, min_exclusive=True)})
    placement: Literal["local", "distributed"] = "local"
    accountant: Literal["rdp", "pld"] = "rdp"
    neighbours: Literal["replace", "add_remove"] = "replace"


@dataclass
class FederatedConfig:
    """Federated setting. ``strategy: none`` trains one model on one KG (no federation).

    ``strategy`` is a registered name (``lightning_fedkg.registry.STRATEGIES.names()``) or
    an import path ``package.module:Class`` of a user's
    :class:`~lightning_fedkg.federated.strategy.Strategy`; ``task`` likewise names a
    :class:`~lightning_fedkg.federated.tasks.Task` (default ``link_prediction``).
    ``rounds`` bounds the run; ``local_epochs`` is E, ``fraction`` is F (clients sampled
    per round), evaluation every ``eval_every`` rounds with early stopping after
    ``patience`` evaluations without improvement of the triple-weighted validation MRR.
    ``best`` chooses the state that is tested at the end: ``federation`` (every client at the
    round of the best triple-weighted validation MRR) or ``client`` (each client at the round
    of its own best validation MRR, as the official FedLU code tests).
    ``evaluate`` chooses what each client is validated and tested with: ``aggregated`` (the
    rows the server aggregated, sent for the evaluation; FedE's protocol) or
    ``before_aggregation`` (nothing is sent: each client evaluates the state its own local
    fit left, as the official FedLU/FedE controllers validate right after local training,
    before the server averages, and test those saved client models). Training is the same
    either way (the next round's download brings the aggregated rows); the ``best`` state
    is saved as it was evaluated. FedLU's ``federated.fedlu.avatar_eval=before_aggregation``
    is the same behaviour for the avatar alone (the only thing FedLU downloads).
    Peer-to-peer methods (FKGE) have no server and no aggregation: each party evaluates
    what it holds under either value. A centralised reference (*Entire*) refuses
    ``before_aggregation``: its clients train nothing. The value may not change on resume.
    ``aggregation`` decides what clients that were not sampled in a round contribute to
    FedE/FedR's holder-mean: ``selected_holders`` averages only the sampled holders of a
    row (rows none of them holds keep their value); ``all_holders`` reproduces the official
    FedE code, where unsampled holders contribute the current server row, a damped update;
    ``named_rows`` is the FedCQA code's ``--partial_update``: a row is averaged over the
    clients whose batches named it in the round (a query's anchor, relation or answer), and
    a row no client named stays as each client has it (query answering only, in clear: it
    shows the server which rows each client trained on, so secure aggregation and DP refuse it).

    Failures: a client that raises (or answers after ``client_timeout`` seconds) is
    recorded as failed; the round goes on when at least ``min_clients`` of the selected
    clients answered (all of them, if fewer were selected), else it is retried up to
    ``max_retries`` times before the run stops with an error.

    ``federation_key``: the clients' secret for the keyed hashes of names in alignment
    (round 0); empty derives one from the seed, fine for in-process simulation.
    ``record_payloads`` keeps every serialized message under ``<run_dir>/payloads/`` (for
    tests and privacy audits; large). ``parties`` holds per-party overrides of the
    ``model``/``train`` sections, e.g. ``parties: {client_1: {model: {name: transh}}}``.
    ``backend`` runs a peer-to-peer method (FKGE) in one process with a deterministic FIFO
    scheduler (``local``) or with one Ray actor process per party (``ray``; the ``ray`` extra).
    A server-client method runs in this process (``local``) or on Flower (``flower``, the
    ``flower`` extra; its settings in ``federated.flower``, :class:`FlowerConfig`).
    ``clients`` says where the clients of a server-client method train with
    ``backend=local``: ``local`` (default) one after the other in this process; ``ray``
    side by side, each in a long-lived Ray actor process of its own (the ``ray`` extra), the
    replies aggregated in the same client order, so the results equal the sequential run's
    bit for bit when each client computes with the same thread count. Each worker's thread
    count is ``trainer.threads``, or unset the automatic count shared out among the clients
    (:func:`~lightning_fedkg.runtime.worker_threads`); on Linux each worker runs on the
    cores :func:`~lightning_fedkg.runtime.place_workers` gives it. Both are logged and written
    to ``metrics.json`` (``client_workers``). Methods with post-training phases (FedE fusion) need
    their parties in this process and refuse ``ray``.
    A method's own settings live in its section, ``federated.<strategy name>``, whose
    fields are its strategy's ``config_class`` (added when a config names the strategy; see
    :func:`experiment_class`).
    """

    strategy: str = field(default="none", metadata={"trained": True})
    task: str = field(default="link_prediction", metadata={"trained": True})
    rounds: int = field(default=100, metadata={"range": Range(min=1), "resume": "free"})
    local_epochs: int = field(default=3, metadata={"range": Range(min=1)})
    fraction: float = field(default=1.0, metadata={"range": Range(min=0, max=1, min_exclusive=True)})
    eval_every: int = field(default=5, metadata={"range": Range(min=1)})
    patience: int = field(default=15, metadata={"range": Range(min=1), "resume": "free"})
    best: Literal["federation", "client"] = "federation"
    evaluate: Literal["aggregated", "before_aggregation"] = "aggregated"
    aggregation: Literal["selected_holders", "all_holders", "named_rows"] = "selected_holders"
    min_clients: int = field(default=1, metadata={"range": Range(min=1)})
    max_retries: int = field(default=2, metadata={"range": Range(min=0), "resume": "free"})
    client_timeout: Optional[float] = field(default=None, metadata={"range": Range(min=0, min_exclusive=True),
                                                                    "resume": "free"})
    record_payloads: bool = field(default=False, metadata={"resume": "free"})
    federation_key: str = ""
    backend: Literal["local", "ray", "flower"] = field(default="local", metadata={"resume": "free"})
    clients: Literal["local", "ray"] = field(default="local", metadata={"resume": "free"})
    flower: FlowerConfig = field(default_factory=FlowerConfig)
    parties: Dict[str, Any] = field(default_factory=dict)
    secure_aggregation: SecureAggregationConfig = field(default_factory=SecureAggregationConfig)
    dp: DPConfig = field(default_factory=DPConfig)


@dataclass
class ExperimentConfig:
    """A whole experiment: data, model, training, Trainer and federation settings."""

    name: str = field(default="experiment", metadata={"resume": "free"})
    seed: int = field(default=0, metadata={"range": SEED_RANGE})
    out_dir: str = field(default="runs", metadata={"resume": "free"})
    # What a run trained (the split, the model's shape and scores): fixed for `test --from`.
    data: DataConfig = field(default_factory=DataConfig, metadata={"trained": True})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"trained": True})
    train: TrainConfig = field(default_factory=TrainConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    federated: FederatedConfig = field(default_factory=FederatedConfig)

    def __reduce__(self):
        # The class may be built for the names this config resolves (experiment_class), and a
        # built class cannot be found by its name: rebuild from the values instead.
        return (config_from_container, (OmegaConf.to_container(OmegaConf.structured(self)),))


def _valid_keys(schema: DictConfig, dotted: str) -> list[str]:
    node = schema
    for part in [p for p in dotted.split(".")[:-1] if p]:
        child = node.get(part) if isinstance(node, DictConfig) else None
        if not isinstance(child, DictConfig):
            break
        node = child
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


#: Keys that were renamed: ``old: new``. A config that sets an old key is refused with a
#: message that names the new one (same values), rather than "unknown key".
RENAMED_KEYS = {"federated.engine": "federated.backend"}


def _merge(schema: DictConfig, layer: DictConfig, source: str) -> DictConfig:
    _check_sections(schema, OmegaConf.to_container(layer, resolve=False), source)
    try:
        return OmegaConf.merge(schema, layer)
    except (ConfigKeyError, ConfigAttributeError) as err:
        key = getattr(err, "full_key", None) or str(err)
        if key in RENAMED_KEYS:
            raise ConfigError(f"{source}: config key '{key}' is now '{RENAMED_KEYS[key]}' (same values); "
                              f"rename it") from None
        valid = _valid_keys(schema, key)
        hint = ""
        if key.startswith("federated.") and key.count(".") == 1:
            hint = " (a method's section federated.<name> exists when federated.strategy names the method)"
        raise ConfigError(
            f"{source}: unknown config key '{key}'. Valid keys here: {', '.join(valid)}{hint}"
        ) from None
    except ValidationError as err:
        first_line = str(err).splitlines()[0]
        raise ConfigError(f"{source}: {getattr(err, 'full_key', '')}: {first_line}") from None


def _check_sections(schema: DictConfig, values: dict, source: str, prefix: str = "",
                    root: DictConfig | None = None) -> None:
    """Raise :class:`ConfigError` where ``values`` (a layer, as plain containers) gives a
    section of ``schema`` (a mapping of keys: ``data``, ``federated.dp``, a method's, a
    party's) as a single value, a list or null.

    omegaconf's own report of it names neither the key nor the file ("None: Merge error: int
    is not a subclass of DataConfig"); this names the key, the file's line and column where
    the YAML gives one (:func:`_where`), and the section's keys. ``root``: the whole schema
    (a party's sections are the top level's ``model`` and ``train``).
    """
    root = schema if root is None else root
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        node = schema.get(key) if key in schema else None
        if prefix == "federated.parties.":  # a party: a mapping of its own model and train
            keys, node = list(PARTY_SECTIONS), root
        elif isinstance(node, DictConfig):
            keys = sorted(node.keys())
        else:
            continue
        if not isinstance(value, dict):
            raise ConfigError(_not_a_section(source, dotted, value, keys))
        _check_sections(node, value, source, f"{dotted}.", root)


def _not_a_section(source: str, dotted: str, value: Any, keys: list[str]) -> str:
    """The message for the section ``dotted`` given as ``value`` in ``source``."""
    listed = f" ({', '.join(keys)})" if keys else ""
    if source == "command line":
        shown = "null" if value is None else value
        return (f"command line: {dotted} is a section: set its keys as {dotted}.KEY=VALUE{listed}, "
                f"not {dotted}={shown}")
    kind = ("null (an empty section: give its keys, write {}, or remove it)" if value is None
            else "a list" if isinstance(value, list) else f"a single value ({value})")
    return _where(source, dotted, f"{dotted} is a section: give it as a mapping of its keys{listed}, not {kind}")


class YamlSource(str):
    """The name of a layer's source (its file's path) that keeps the YAML ``text`` it was
    parsed from: an error found after parsing (:func:`_check_sections`) points at its line
    (omegaconf's layers no longer know where their values were written)."""

    text: str

    def __new__(cls, name: str, text: str) -> "YamlSource":
        source = super().__new__(cls, name)
        source.text = text
        return source


def _where(source: str, dotted: str, reason: str) -> str:
    """``source:line:column: reason`` at the value of ``dotted`` where ``source`` is a
    :class:`YamlSource` that has it, else ``source: reason`` (the command line, a party)."""
    text = getattr(source, "text", None)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader) if text is not None else None
    except yaml.YAMLError:
        node = None
    for part in dotted.split("."):
        if not isinstance(node, yaml.MappingNode):
            node = None
            break
        node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
    return _at(source, node.start_mark, reason) if node is not None else f"{source}: {reason}"


# ---------------------------------------------------------------------- open sections
#: A section a config gains from the names it gives: ``(key, dataclass, resume_free)``.
Section = tuple[str, type, bool]


def section_classes(raw: DictConfig, sections: Sequence[str] = (), strict: bool = False
                    ) -> tuple[tuple[Section, ...], tuple[Section, ...], tuple[tuple[str, Any], ...]]:
    """What the names in ``raw`` add to the schema: ``(federated sections, top-level
    sections, model options)``.

    * ``federated.<name>``: the ``config_class`` of the strategy ``federated.strategy`` names,
      and of every registered strategy whose section ``raw`` sets (a section of a method the
      run does not use changes nothing; ``strict`` refuses one, as a likely mistake, while
      a saved ``config.yaml`` of an earlier version may hold every method's);
    * ``task``: the ``config_class`` of ``federated.task``'s task, if it has one;
    * ``<phase>``: the ``config_class`` of each registered phase whose section ``raw`` sets,
      or that ``sections`` asks for (``fedkg unlearn`` asks for ``unlearn``). A phase is its
      own resume point (its block is stored with its settings), so its section is
      resume-free;
    * ``model.<option>``: each keyword option of ``model.name``'s model that
      :class:`ModelConfig` does not have already (:func:`model_option_fields`).

    Names resolve through :mod:`lightning_fedkg.registry` (entry points of the installed
    packages, or import paths): nothing here imports a method. Raises :class:`ConfigError`
    for a name that does not resolve.
    """
    from lightning_fedkg.registry import PHASES, STRATEGIES, TASKS, RegistryError

    def resolve(registry, name: str, key: str):
        try:
            return registry.get(name)
        except RegistryError as err:
            raise ConfigError(f"{key}: {err}") from None

    fed_raw = raw.get("federated") if isinstance(raw.get("federated"), DictConfig) else OmegaConf.create({})
    core_federated = {f.name for f in fields(FederatedConfig)}
    federated: dict[str, Section] = {}
    strategy = fed_raw.get("strategy", "none")
    if strategy != "none":
        cls = resolve(STRATEGIES, strategy, "federated.strategy")
        if cls.config_class is not None:
            federated[cls.name] = (cls.name, cls.config_class, False)
    registered = set(STRATEGIES.names())
    for key in fed_raw.keys():
        if key not in core_federated and key not in federated and key in registered:
            if strict:
                raise ConfigError(f"federated.{key} is the section of the strategy {key!r}, which this run does not "
                                  f"use (federated.strategy={strategy}); remove the section or set the strategy")
            cls = resolve(STRATEGIES, key, f"federated.{key}")
            if cls.config_class is not None:
                federated[key] = (key, cls.config_class, False)
    top: dict[str, Section] = {}
    if strategy != "none":  # a single-KG run has no task to configure
        task = resolve(TASKS, fed_raw.get("task", "link_prediction"), "federated.task")
        if task.config_class is not None:
            top["task"] = ("task", task.config_class, False)
    core_top = {f.name for f in fields(ExperimentConfig)}
    phases = set(PHASES.names())
    for key in [*raw.keys(), *sections]:
        if key not in core_top and key not in top and key in phases:
            phase = resolve(PHASES, key, key)
            if phase.config_class is not None:
                top[key] = (key, phase.config_class, True)
    model_raw = raw.get("model") if isinstance(raw.get("model"), DictConfig) else OmegaConf.create({})
    return tuple(federated.values()), tuple(top.values()), model_option_fields(model_raw.get("name", "transe"))


def model_option_fields(name: str) -> tuple[tuple[str, Any], ...]:
    """``(option, type)`` of every keyword option of the model ``name`` names that
    :class:`ModelConfig` lacks (a user model's own options), read from its ``__init__``
    (:meth:`~lightning_fedkg.models.kge.KGEModel.option_names`); None stands for the
    model's default, as for the built-in options."""
    import inspect
    import typing

    from lightning_fedkg.registry import MODELS, RegistryError

    try:
        cls = MODELS.get(name)
    except RegistryError as err:
        raise ConfigError(f"model.name: {err}") from None
    core = {f.name for f in fields(ModelConfig)}
    extra = [o for o in (cls.option_names() or ()) if o not in core]
    if not extra:
        return ()
    hints = typing.get_type_hints(cls.__init__)
    params = inspect.signature(cls.__init__).parameters
    out = []
    for option in extra:
        kind = hints.get(option, Any)
        if params[option].default is None or typing.get_origin(kind) in (typing.Union, types.UnionType):
            kind = next((a for a in typing.get_args(kind) if a is not type(None)), Any)
        out.append((option, Optional[kind]))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def experiment_class(federated: tuple[Section, ...] = (), top: tuple[Section, ...] = (),
                     model_options: tuple[tuple[str, Any], ...] = ()) -> type[ExperimentConfig]:
    """:class:`ExperimentConfig` with the given method sections and model options as typed fields.

    Each section is a dataclass field with its defaults, so a method's settings are checked
    like the core's (unknown keys, types, ranges) and read as ``cfg.federated.fedlu.mu``.
    The same sections give the same class.
    """
    if not federated and not top and not model_options:
        return ExperimentConfig

    def as_field(key, cls, free):
        return (key, cls, field(default_factory=cls, metadata={"resume": "free"} if free else {}))

    federated_class = make_dataclass("FederatedConfig", [as_field(*s) for s in federated], bases=(FederatedConfig,))
    model_class = make_dataclass("ModelConfig", [(o, kind, field(default=None)) for o, kind in model_options],
                                 bases=(ModelConfig,))
    experiment_class_ = make_dataclass(
        "ExperimentConfig",
        [("model", model_class, field(default_factory=model_class, metadata=_metadata(ExperimentConfig, "model"))),
         ("federated", federated_class, field(default_factory=federated_class)), *(as_field(*s) for s in top)],
        bases=(ExperimentConfig,),
    )
    for built, base in ((federated_class, FederatedConfig), (model_class, ModelConfig),
                        (experiment_class_, ExperimentConfig)):
        built.__module__, built.__doc__ = __name__, base.__doc__
    return experiment_class_


def _metadata(cls: type, name: str) -> dict:
    """The metadata of ``cls``'s field ``name``, for a subclass that redeclares the field."""
    return dict(cls.__dataclass_fields__[name].metadata)


def build_config(layers: Sequence[tuple[DictConfig, str]], sections: Sequence[str] = (),
                 strict: bool = False) -> ExperimentConfig:
    """Merge ``(layer, source)`` pairs, in order, over the defaults of the sections their
    names resolve to (:func:`section_classes`, ``strict`` as there); check ranges and names.

    Raises :class:`ConfigError` naming the source and the key (with the valid keys). The
    core sections are checked first (:func:`core_config`), before a name is resolved,
    so that their mistakes are reported without importing torch.
    """
    core_config(layers)
    raw = OmegaConf.create({})
    for layer, _ in layers:
        raw = OmegaConf.merge(raw, layer)
    cfg = OmegaConf.structured(experiment_class(*section_classes(raw, sections, strict)))
    for layer, source in layers:
        cfg = _merge(cfg, layer, source)
    return validate_names(validate_ranges(OmegaConf.to_object(cfg)))


def _last_set(layers: Sequence[tuple[DictConfig, str]], section: str, key: str, default: Any) -> Any:
    """``section.key`` as the last layer that sets it gives it (unresolved), else ``default``."""
    value = default
    for layer, _ in layers:
        node = layer.get(section) if isinstance(layer, DictConfig) else None
        if isinstance(node, DictConfig) and key in node:
            value = node.get(key)
    return value


def _is_builtin_model(name: Any) -> bool:
    """Whether ``model.name`` names one of this package's KGE models (from its entry point's
    target, without importing it)."""
    from lightning_fedkg.registry import MODELS

    if not isinstance(name, str) or ":" in name:
        return False
    ep = MODELS._declared().get(name.lower())
    return ep is not None and ep.value.startswith("lightning_fedkg.models.")


def core_config(layers: Sequence[tuple[DictConfig, str]]) -> ExperimentConfig:
    """The core sections of ``layers`` (keys, types and ranges checked), without the
    sections a name adds: nothing is imported, so this is fast. A method section is a
    mapping that is not a core field (under ``federated``, or at the top level); a
    misspelled one is reported by :func:`build_config`, once the names are resolved."""
    federated_core = {f.name for f in fields(FederatedConfig)}
    top_core = {f.name for f in fields(ExperimentConfig)}
    model_core = {f.name for f in fields(ModelConfig)}
    # A user model's own options are known once it is resolved (an import); the built-in
    # models take no option ModelConfig lacks, so with one of them a misspelled model key
    # (the commonest slip, model.dimm=...) is reported here, before torch is imported.
    builtin_model = _is_builtin_model(_last_set(layers, "model", "name", default="transe"))
    from lightning_fedkg.registry import MODELS, PHASES, STRATEGIES, TASKS, RegistryError

    # A method's section given as a value (federated.fede: 3) is left to build_config too,
    # whose schema has the section and says it must be a mapping (not "unknown key").
    federated_methods, top_methods = set(STRATEGIES.names()), {"task", *PHASES.names()}

    def strip(layer: DictConfig) -> DictConfig:
        values = OmegaConf.to_container(layer, resolve=False)
        fed = values.get("federated")
        if isinstance(fed, dict):
            values["federated"] = {k: v for k, v in fed.items()
                                   if k in federated_core or not (isinstance(v, dict) or k in federated_methods)}
        model = values.get("model")
        if isinstance(model, dict) and not builtin_model:
            values["model"] = {k: v for k, v in model.items() if k in model_core}
        return OmegaConf.create({k: v for k, v in values.items()
                                 if k in top_core or not (isinstance(v, dict) or k in top_methods)})

    cfg = OmegaConf.structured(ExperimentConfig)
    for layer, source in layers:
        cfg = _merge(cfg, strip(layer), source)
    core = validate_ranges(OmegaConf.to_object(cfg))
    # Unknown names are errors the registries give from their entry points alone (a known
    # name is resolved, and its options checked, by build_config).
    for key, registry, name in (("model.name", MODELS, core.model.name),
                                ("federated.strategy", STRATEGIES, core.federated.strategy),
                                ("federated.task", TASKS, core.federated.task)):
        if name != "none" and ":" not in name and name.lower() not in registry.names():
            try:
                registry.get(name)
            except RegistryError as err:
                raise ConfigError(f"{key}: {err}") from None
    if core.train.loss not in LOSSES:
        raise ConfigError(f"train.loss: unknown loss {core.train.loss!r}; valid: {', '.join(LOSSES)}")
    return core


_NODE_KINDS = {yaml.SequenceNode: "list", yaml.ScalarNode: "single value"}


def parse_yaml(text: str, source: str) -> DictConfig:
    """``text`` (a config file's content) as an omegaconf mapping, before any checks of keys.

    A YAML syntax error, or a top level that is not a mapping of sections, raises
    :class:`ConfigError` as ``source:line:column: reason`` (1-based, where the parser
    stopped), the form editors and compilers use, instead of PyYAML's multi-line report.
    """
    try:
        # Composing first (no values built) finds syntax errors and gives the top-level
        # node with its position, which omegaconf's result no longer has.
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None and not isinstance(root, yaml.MappingNode):
            kind = _NODE_KINDS.get(type(root), "value")
            raise ConfigError(_at(source, root.start_mark, "the top level must be a mapping of sections "
                                                           f"(data:, model:, train:, ...), not a {kind}"))
        return OmegaConf.create(text) if root is not None else OmegaConf.create()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        if mark is None:  # e.g. a reader error (a control character): no position to show
            raise ConfigError(f"{source}: {str(err).splitlines()[0]}") from None
        reason = err.problem or "invalid YAML"
        lines = text.splitlines()
        # PyYAML's word for a tab is "character that cannot start any token".
        if mark.line < len(lines) and lines[mark.line][mark.column:mark.column + 1] == "\t":
            reason += " (a tab: indent YAML with spaces)"
        context = getattr(err, "context_mark", None)
        if err.context and context is not None and (context.line, context.column) != (mark.line, mark.column):
            reason += f" ({err.context} that starts at line {context.line + 1}, column {context.column + 1})"
        raise ConfigError(_at(source, mark, reason)) from None


def _at(source: str, mark: yaml.Mark, reason: str) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}: {reason}"


#: The key a config file names the files it builds on with (:func:`file_layers`).
BASE_KEY = "base"


def file_layers(path: Path, chain: tuple[Path, ...] = ()) -> list[tuple[DictConfig, Any]]:
    """``(layer, source)`` of a config file and of the files it builds on, in merge order.

    A file may start from others: ``base: ../base/umls.yaml`` (or a list of paths, merged in
    order), relative to the file, each of which may name bases of its own; the file's own
    keys are merged last, so a shipped config is a short delta over what its siblings share.
    A plain list of files rather than Hydra's ``defaults`` groups: nothing to learn beyond
    "merged in order", and omegaconf does the merging. Errors name the file and the line."""
    if path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path.resolve()))
        raise ConfigError(f"{path}: config bases form a cycle: {cycle}")
    text = path.read_text(encoding="utf-8")
    layer = parse_yaml(text, str(path))
    # A file with nothing in it (or only comments) would silently run every default: far
    # more likely a wrong or truncated file than an intent. `{}` says "defaults" on purpose.
    if yaml.compose(text, Loader=yaml.SafeLoader) is None:
        raise ConfigError(f"{path}: the config file is empty (no sections); give the sections to run "
                          f"(data:, model:, train:, ...), or write {{}} to run every default")
    out: list[tuple[DictConfig, Any]] = []
    bases = layer.get(BASE_KEY) if BASE_KEY in layer else None
    if bases is not None:
        names = [bases] if isinstance(bases, str) else list(bases) if OmegaConf.is_list(bases) else None
        if not names or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{path}: '{BASE_KEY}' names the config files this one builds on: a path or a list "
                              f"of paths, relative to {path.parent}, got {OmegaConf.to_container(layer)[BASE_KEY]!r}")
        for name in names:
            base = (path.parent / name)
            if not base.is_file():
                raise ConfigError(f"{path}: its base {name} is not a file (looked for {base})")
            out += file_layers(base, (*chain, path.resolve()))
        layer = OmegaConf.create({k: v for k, v in layer.items() if k != BASE_KEY})
    out.append((layer, YamlSource(str(path), text)))
    return out


def moved_hint(path: Path) -> str:
    """Where a config that moved now lives (``configs/MOVED.txt``: ``old<TAB>new`` lines), as
    a sentence to add to "not found", or ''."""
    moved = Path(__file__).resolve().parents[1] / "configs" / "MOVED.txt"
    if not moved.is_file():
        return ""
    wanted = path.as_posix().lstrip("./")
    for line in moved.read_text(encoding="utf-8").splitlines():
        old, _, new = line.partition("\t")
        if new and (wanted == old or wanted.endswith("/" + old)):
            return f" (it moved to {new})"
    return ""


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                sections: Sequence[str] = (), core_only: bool = False) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` from a YAML file and ``key=value`` overrides.

    ``sections`` names phase sections to include even when neither source sets them.
    ``core_only`` checks and returns the core sections only (:func:`core_config`: fast,
    nothing imported; what a command needs to find its run directory).
    Raises :class:`ConfigError` naming the offending key and listing the valid keys, or the
    file, line and column of a YAML syntax error (see :func:`parse_yaml`).
    """
    layers = []
    if path is not None:
        path = Path(path)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))
            hint = (f"; the YAML files in it: {', '.join(found[:10])}{', ...' if len(found) > 10 else ''}"
                    if found else "; it holds no .yaml file")
            raise ConfigError(f"config {path} is a directory, not a YAML file{hint}")
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}{moved_hint(path)}")
        layers += file_layers(path)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"overrides must look like key=value, got: {' '.join(bad)}")
    if overrides:
        layers.append((OmegaConf.from_dotlist(list(overrides)), "command line"))
    return core_config(layers) if core_only else build_config(layers, sections, strict=True)


def config_from_container(values: dict) -> ExperimentConfig:
    """A config from plain nested values (what ``OmegaConf.to_container`` gives)."""
    return build_config([(OmegaConf.create(values), "config values")])


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the fully resolved config as YAML (the run directory's ``config.yaml``).

    Written to a temporary file beside ``path`` and moved into place with ``os.replace``:
    an interrupted write leaves the previous file, never half of one.
    """
    path = Path(path)
    from lightning_fedkg.atomic import write_atomic

    text = OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def config_from_yaml_text(text: str, sections: Sequence[str] = (), source: str = "config.yaml") -> ExperimentConfig:
    """Parse a resolved ``config.yaml`` back (used when resuming a run directory).

    ``source`` names the text in errors (the file's path where there is one).
    """
    return build_config([(parse_yaml(text, source), YamlSource(source, text))], sections)


def validate_model_and_train(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check the names and options of ``cfg.model`` / ``cfg.train`` against what exists.

    ``model.name`` must be a registered KGE model (or an import path to one), ``train.loss``
    a known loss, and every model option that is set must be one the model takes. Raises
    :class:`ConfigError` listing the valid choices; returns ``cfg`` unchanged.
    """
    # Resolving the name imports the model's module (torch): here, not at module level,
    # so that `import lightning_fedkg.config` stays light.
    from lightning_fedkg.registry import MODELS, RegistryError

    try:
        model_cls = MODELS.get(cfg.model.name)
    except RegistryError as err:
        raise ConfigError(f"model.name: {err}") from None
    if cfg.train.loss not in LOSSES:
        raise ConfigError(f"train.loss: unknown loss {cfg.train.loss!r}; valid: {', '.join(LOSSES)}")
    if cfg.trainer.compile and cfg.trainer.capture:
        raise ConfigError("trainer.capture: a recorded step and a compiled loss exclude each other; "
                          "set trainer.compile=false or trainer.capture=null")
    if cfg.train.optimizer == "sparse_adam":
        # Sparse gradients' shapes follow each batch's distinct rows: nothing to record once
        # and replay, and dynamo does not trace sparse embedding backward.
        for key in ("capture", "compile"):
            if getattr(cfg.trainer, key):
                raise ConfigError(f"trainer.{key}=true cannot run train.optimizer=sparse_adam, whose row-sparse "
                                  f"steps change shape with every batch; set trainer.{key}=null (the row-sparse "
                                  f"step runs eagerly) or train.optimizer=adam")
    accepted = model_cls.option_names()
    for key in cfg.model.options():
        if accepted is not None and key not in accepted:
            raise ConfigError(
                f"model.{key}: KGE model {cfg.model.name!r} does not take {key} "
                f"(its options: {', '.join(accepted) or 'none'}); remove it or set it to null"
            )
    return cfg


#: Sections a party may override in ``federated.parties.<name>``.
PARTY_SECTIONS = ("model", "train")


def party_config(cfg: ExperimentConfig, name: str) -> ExperimentConfig:
    """``cfg`` with ``federated.parties[name]`` merged in (per-party model/train overrides)."""
    overrides = (cfg.federated.parties or {}).get(name)
    if not overrides:
        return cfg
    bad = set(overrides) - set(PARTY_SECTIONS)
    if bad:
        raise ConfigError(f"federated.parties.{name}: only {list(PARTY_SECTIONS)} may differ per party, "
                          f"got {sorted(bad)}")
    base = OmegaConf.structured(cfg)
    merged = _merge(base, OmegaConf.create({k: dict(v) for k, v in overrides.items()}), f"federated.parties.{name}")
    return validate_ranges(OmegaConf.to_object(merged))


def trained_differences(saved: ExperimentConfig, cfg: ExperimentConfig) -> list[str]:
    """``key: saved -> new`` for every setting of what a run trained that ``cfg`` changes
    from the run's ``saved`` config: the fields whose metadata says ``{"trained": True}``
    (whole sections too: ``data``, ``model``; a task's encoder, ...), in any section, and
    each party's model (``federated.parties``). ``fedkg test --from`` refuses these: the
    run's saved state was trained with the saved values (another ``model.dim`` would not
    even load), so only how it is tested may change."""
    out = _trained_differences(saved, cfg, "")
    parties = sorted(set(saved.federated.parties or {}) | set(cfg.federated.parties or {}))
    for name in parties:
        before, after = party_config(saved, name).model, party_config(cfg, name).model
        out += fingerprint_differences(_plain(before), _plain(after), f"federated.parties.{name}.model.")
    return out


def _trained_differences(saved: Any, cfg: Any, prefix: str) -> list[str]:
    out = []
    for f in fields(cfg):
        before, after = getattr(saved, f.name, None), getattr(cfg, f.name)
        if f.metadata.get("trained"):
            out += fingerprint_differences({f.name: _plain(before)}, {f.name: _plain(after)}, prefix)
        elif is_dataclass(after) and is_dataclass(before):
            out += _trained_differences(before, after, f"{prefix}{f.name}.")
    return out


def _plain(value: Any) -> Any:
    """A dataclass as a nested dict of its fields (what :func:`fingerprint_differences` walks)."""
    if not is_dataclass(value):
        return value
    return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}


def validate_names(cfg: ExperimentConfig) -> ExperimentConfig:
    """Every name a config gives must resolve: the model and loss
    (:func:`validate_model_and_train`) and each per-party override (the strategy, task and
    phases resolved when the sections were built). Raises :class:`ConfigError`."""
    validate_model_and_train(cfg)
    for name in cfg.federated.parties or {}:
        try:
            validate_model_and_train(party_config(cfg, name))
        except ConfigError as err:
            message, prefix = str(err), f"federated.parties.{name}"
            raise ConfigError(message if message.startswith(prefix) else f"{prefix}: {message}") from None
    return cfg


def _leaves(node, prefix: str = ""):
    """``(dotted key, dataclass field, value)`` of every non-dataclass field, depth first."""
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, value


def validate_ranges(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check every field that declares ``metadata={"range": Range(...)}``.

    Types are already enforced by omegaconf; this catches values of the right type that no
    run can use (``model.dim=-5``, ``federated.fraction=1.5``) before anything is written.
    ``None`` (an optional field left unset) is not checked. Raises :class:`ConfigError`
    listing every violation as ``key: value is out of range (must be ...)``.
    """
    problems = []
    for key, f, value in _leaves(cfg):
        bounds = f.metadata.get("range")
        # bool is an int subclass, but a flag has no range to violate.
        if bounds is None or value is None or isinstance(value, bool):
            continue
        if not bounds.contains(value):
            problems.append(f"{key}: {value!r} is out of range (must be {bounds.describe()})")
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


def resume_fingerprint(cfg: ExperimentConfig) -> dict:
    """The settings a resumed run must share with the run directory it continues.

    ``cfg`` as a nested dict (sections are dicts, leaves plain values) without the fields
    whose metadata says ``{"resume": "free"}``. Two configs may share a run directory
    exactly when their fingerprints are equal.
    """

    def strip(node) -> dict:
        out = {}
        for f in fields(node):
            if f.metadata.get("resume") == "free":
                continue
            value = getattr(node, f.name)
            out[f.name] = strip(value) if is_dataclass(value) else value
        return out

    return strip(cfg)


def resume_differences(saved: dict, cfg: ExperimentConfig) -> list[str]:
    """:func:`fingerprint_differences` of a saved fingerprint and ``cfg``'s, where sections of
    methods ``cfg`` does not use (earlier versions saved every method's) are left out."""
    current = resume_fingerprint(cfg)
    federated = dict(saved.get("federated") or {})
    used = current.get("federated", {})
    for key in [k for k, v in federated.items() if isinstance(v, dict) and k != "parties" and k not in used]:
        del federated[key]
    # A setting added after the run was written did not exist then: it reads as its
    # default, which is the behaviour the run had (new fields default to the old behaviour).
    saved = _with_missing(dict(saved, federated=federated), resume_fingerprint(type(cfg)()))
    return fingerprint_differences(saved, current)


def _with_missing(saved: dict, defaults: dict) -> dict:
    """``saved`` with every key of ``defaults`` it lacks taken from ``defaults`` (recursively)."""
    out = dict(saved)
    for key, default in defaults.items():
        if key not in out:
            out[key] = default
        elif isinstance(out[key], dict) and isinstance(default, dict):
            out[key] = _with_missing(out[key], default)
    return out


def fingerprint_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """``key: saved -> current`` for every leaf where two fingerprints differ, sorted by key.

    A key missing on one side reads as ``None`` there (a field added or removed between
    versions).
    """
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += fingerprint_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def show_progress_bar(trainer: TrainerConfig, stream: IO | None = None) -> bool:
    """Whether to draw progress bars: ``trainer.progress_bar``, or when it is ``None``
    (the default), only if ``stream`` (``sys.stdout``, where tqdm and Lightning draw) is a
    terminal — redrawn bars in a log file are hundreds of kilobytes of noise."""
    if trainer.progress_bar is not None:
        return bool(trainer.progress_bar)
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def resolve_auto_settings(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with ``trainer.progress_bar: null`` (auto) decided for this process's stdout.

    The saved ``config.yaml`` keeps ``null``; the runners get a plain bool (the federated
    round loop reads the field as one).
    """
    return replace(cfg, trainer=replace(cfg.trainer, progress_bar=show_progress_bar(cfg.trainer)))
