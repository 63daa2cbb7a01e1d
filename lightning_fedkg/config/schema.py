"""The typed experiment configuration: the core sections as dataclasses.

Fields describe themselves through ``dataclasses.field(metadata=...)``: ``{"range":
Range(...)}`` is checked by :func:`~lightning_fedkg.config.validation.validate_ranges`,
``{"resume": "free"}`` marks a field that may change when a run is resumed, ``{"trained":
True}`` a setting of what a run trained. A method's section is its strategy's
``config_class`` (``methods/<name>/config.py``), added by
:mod:`~lightning_fedkg.config.sections`. The keys are listed in docs/usage.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, Literal, Optional

from omegaconf import OmegaConf

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
    each shape pay the compilation (seconds per process). ``native_l1`` (off by default): on a
    CPU, a Trans* model's L1 distances to shared candidates, in training and evaluation, go
    through the library's own C kernel (:mod:`lightning_fedkg.models.kge.native_l1`: built once
    per machine by the system C compiler, ahead of ``compile_cpu``; cdist where it cannot be
    built; not with ``deterministic``; not bit for bit cdist's). ``capture`` records each KGE
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
    native_l1: bool = field(default=False, metadata={"resume": "free"})
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


#: How a config is rebuilt from its plain values when it is unpickled: registered by
#: :mod:`lightning_fedkg.config.loading` (its ``config_from_container``), which builds on
#: this module and so cannot be imported by it.
REBUILD: dict[str, Callable[[dict], Any]] = {}


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
        return (REBUILD["from_values"], (OmegaConf.to_container(OmegaConf.structured(self)),))
