"""Process-wide torch settings a run asks for: its CPU thread budget and determinism.

:func:`lightning_fedkg.run.fit` and :func:`~lightning_fedkg.run.evaluate` (behind ``fedkg
fit``/``fedkg test``) call :func:`configure_torch` before Lightning is imported or any tensor
work starts, and seed with :func:`seed_process`; a process they do not reach (a Ray actor, a
Flower process) calls :func:`prepare_process` for itself. Both settings are global to the
process (torch has one intra-op and one inter-op thread pool), which is why they live
here and not in a Trainer.

With ``trainer.threads`` unset the thread count is chosen here (:func:`auto_threads`) from
the cores this process may use, the machine's 1-minute load average and, when the caller
knows it, the size of the largest embedding table. This module imports neither torch nor
Lightning at import time.
"""

from __future__ import annotations

import logging
import math
import os

from lightning_fedkg.config import ExperimentConfig, TrainerConfig

__all__ = [
    "EXPECTED_WARNINGS",
    "SMALL_TABLE_ELEMENTS",
    "auto_threads",
    "config_table_elements",
    "configure_torch",
    "effective_threads",
    "machine_cpus",
    "machine_load",
    "prepare_process",
    "seed_process",
    "worker_threads",
]

log = logging.getLogger(__name__)


#: Lightning warnings that are expected with our loaders and call patterns, silenced by
#: the CLI (process-wide) and around every federated party's Trainer call: in-process
#: IterableDatasets with an exact ``__len__`` and no workers, tiny KGs with fewer batches
#: than the logging interval, fits without validation, and Lightning's pytree shim tripping
#: a torch deprecation. Nothing in them is for the user to change.
EXPECTED_WARNINGS = (
    ".*IterableDataset.*__len__.*",
    ".*smaller than the logging interval.*",
    ".*does not have many workers.*",
    ".*no `val_dataloader`.*",
    ".*LeafSpec.*",
)

# The automatic thread count. Thresholds from docs/results/threads.md, "Default CPU threads"
# (scripts/benchmarks/bench_threads.py; whole `fedkg fit` runs, FedE TransE; 2-core EPYC, torch 2.13):
# * Table size. On a quiet machine a second thread gains nothing below ~20k entity-table
#   elements (UMLS quick starts at dim 64 / 128: 8.6k / 17k elements, 1 and 2 threads
#   within 2%), 11% at 35k (dim 256), 18% at 69k (dim 512), 48% at 276k (dim 2048), 57% on
#   FB15k-237-Fed3 at dim 32 (465k) and 84% at dim 256 (3.7M). When the machine is busy it
#   loses: 1.5-1.7x slower on UMLS beside one busy process and 2.6-5.5x beside two,
#   1.2x on FB15k-237-Fed3 dim 256 beside one. A load that starts after the run does is
#   not in the load average the choice reads, so below SMALL_TABLE_ELEMENTS, where a
#   quiet machine gains at most ~10%, one thread is chosen whatever the load.
SMALL_TABLE_ELEMENTS = 50_000
# * Load. FB15k-237-Fed3 at dim 32 beside a process busy 25% of the time: 2 threads 1.46x
#   faster than one; busy 50% of the time: 1 thread 5% faster; busy all the time (dim 256):
#   1 thread 1.2x faster. So a core counts as free when its share of the 1-minute load
#   average is at most 0.5: threads = floor(cpus - load + FREE_CORE_SLACK).
FREE_CORE_SLACK = 0.5

#: Entities of the bundled KGs (``lightning_fedkg/data/bundled``), known before loading.
BUNDLED_ENTITIES = {"umls": 135, "nations": 14, "kinship": 104}
#: Built-in models whose entity rows are wider than ``model.dim`` (``[re || im]``).
_ENTITY_WIDTH_FACTOR = {"complex": 2, "rotate": 2}


def machine_cpus() -> int:
    """The cores this process may run on: its CPU affinity where the OS has one, else
    ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def machine_load() -> float | None:
    """The machine's 1-minute load average, or None where the OS has none (Windows)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def config_table_elements(cfg: ExperimentConfig) -> int | None:
    """Elements of the largest embedding table (entities x entity width) when the config
    alone tells: a bundled KG (tiny, its entity count is known); None for a data folder,
    whose size is known only once it is loaded."""
    name = cfg.data.name
    entities = BUNDLED_ENTITIES.get(name.lower()) if isinstance(name, str) else None
    if entities is None:
        return None
    return entities * cfg.model.dim * _ENTITY_WIDTH_FACTOR.get(str(cfg.model.name).lower(), 1)


def _choose(cpus: int, load: float | None, table_elements: int | None) -> tuple[int, str]:
    """The automatic thread count and the reason, as logged."""
    cpus = max(1, int(cpus))
    facts = f"{cpus} core{'s' if cpus != 1 else ''}, load " + ("unknown" if load is None else f"{load:.2f}")
    if cpus == 1:
        return 1, facts
    if table_elements is not None and table_elements < SMALL_TABLE_ELEMENTS:
        return 1, f"{facts}; small tables, {table_elements:,} elements"
    free = cpus if load is None else cpus - max(0.0, load)
    threads = max(1, min(cpus, math.floor(free + FREE_CORE_SLACK)))
    size = "table size unknown" if table_elements is None else f"{table_elements:,} table elements"
    return threads, f"{facts}; {size}; {threads} free core{'s' if threads != 1 else ''}"


def auto_threads(cpus: int, load: float | None, table_elements: int | None = None) -> int:
    """The intra-op thread count for an unset ``trainer.threads``.

    One thread when the largest embedding table has fewer than :data:`SMALL_TABLE_ELEMENTS`
    elements (``table_elements``, entities x width; None = unknown); otherwise the cores
    that are free, ``floor(cpus - load + FREE_CORE_SLACK)``, at least 1 and at most ``cpus``
    (``load`` None = unknown counts as an idle machine). See the thresholds' comment above.
    """
    return _choose(cpus, load, table_elements)[0]


def effective_threads(trainer: TrainerConfig) -> int | None:
    """The intra-op thread count a run asks for: ``trainer.threads``, else 1 when
    ``trainer.deterministic`` (see :func:`configure_torch`), else ``None``: chosen by
    :func:`auto_threads` when :func:`configure_torch` runs."""
    if trainer.threads is not None:
        return int(trainer.threads)
    return 1 if trainer.deterministic else None


def worker_threads(trainer: TrainerConfig, workers: int, table_elements: int | None = None,
                   cpus: int | None = None, load: float | None = None) -> tuple[int, str]:
    """The intra-op thread count of each of ``workers`` processes that train side by side
    (``federated.clients=ray``), and why, as logged.

    ``trainer.threads`` (or ``trainer.deterministic``'s one thread) is taken as it is, per
    worker. Unset, the count one process would get (:func:`auto_threads`, from ``cpus`` and
    ``load``, this machine's by default) is shared out: ``max(1, count // workers)``, so that
    the workers together start no more threads than there are free cores (one each on a
    2-core machine with 3 clients, and for small tables whatever the cores).
    """
    workers = max(1, int(workers))
    fixed = effective_threads(trainer)
    if fixed is not None:
        why = "trainer.threads" if trainer.threads is not None else "trainer.deterministic"
        return fixed, f"{why}, per worker"
    cpus = machine_cpus() if cpus is None else cpus
    load = machine_load() if load is None else load
    total, facts = _choose(cpus, load, table_elements)
    threads = max(1, total // workers)
    return threads, f"{facts}; {total} shared by {workers} worker{'s' if workers != 1 else ''}"


def machine_core_ids() -> list[int] | None:
    """The ids of the cores this process may run on, or None where the OS cannot pin
    processes to cores (macOS, Windows)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def shared_finish(work: list[float], slots: int) -> float:
    """When ``work`` ends on ``slots`` slots that the OS time-slices evenly among the
    workers (each runs at ``min(1, slots / running)`` of a slot until it is done)."""
    left, now = sorted(w for w in work if w > 0), 0.0
    while left:
        rate = min(1.0, slots / len(left))
        step = left[0]
        now += step / rate
        left = [w - step for w in left[1:] if w - step > 0]
    return now


def _placements(work: list[float], slots: int):
    """Candidate placements ``(predicted end, workers pinned, {worker: its own slot}, the
    slots the other workers share)``: the ``k`` largest workers on slots of their own and
    the others sharing the rest, for every ``k``; and each worker pinned by the
    longest-processing-time rule (the least-loaded slot, largest first)."""
    order = sorted(range(len(work)), key=lambda i: (-work[i], i))
    for k in range(slots):
        own, rest = order[:k], order[k:]
        end = max([work[i] for i in own] + [shared_finish([work[i] for i in rest], slots - k)])
        yield end, k, {i: j for j, i in enumerate(own)}, list(range(k, slots))
    load, slot_of = [0.0] * slots, {}
    for i in order:
        j = min(range(slots), key=lambda s: (load[s], s))
        load[j] += work[i]
        slot_of[i] = j
    yield max(load), len(work), slot_of, []


def place_workers(work: list[float], threads: int, cores: list[int]) -> list[list[int]]:
    """The cores each of ``len(work)`` workers may run on, from their ``work`` (any unit).

    The cores are cut into slots of ``threads`` consecutive ids (one slot of all of them
    when there are fewer). With no more workers than slots, each gets a slot of its own.
    Otherwise the placement that :func:`shared_finish` predicts to end first is taken among:
    the ``k`` largest workers each on a slot of its own and the others time-sliced by the OS
    on the remaining slots' cores (``k = 0`` leaves all to the OS), and every worker pinned
    to one slot by the longest-processing-time rule; a tie goes to the one that pins fewer.
    Three UMLS clients on two cores (work .07 / .09 / .18): the largest alone on one core,
    where the OS alone would give it two thirds of a core until another finishes. Three
    clients of about equal work: the OS, whose time-slicing ends them together, where
    pinning would leave one core with two of them.
    """
    if not work:
        return []
    threads = max(1, int(threads))
    slots = [cores[i:i + threads] for i in range(0, len(cores) - threads + 1, threads)] or [list(cores)]
    if len(work) <= len(slots):
        return [list(slots[i]) for i in range(len(work))]
    _, _, slot_of, pool = min(_placements(work, len(slots)), key=lambda c: (c[0], c[1]))
    shared = sorted(c for j in pool for c in slots[j])
    return [list(slots[slot_of[i]]) if i in slot_of else list(shared) for i in range(len(work))]


def pin_process(cores: list[int]) -> bool:
    """Pin every thread of this process, and the threads it starts later, to ``cores``;
    False where the OS cannot (then nothing changes)."""
    try:
        os.sched_setaffinity(0, cores)
        # sched_setaffinity(0) moves only the calling thread on Linux; threads that exist
        # already (torch's pools, the RPC threads of a Ray worker) are moved one by one.
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), cores)
            except OSError:  # a thread that ended meanwhile
                pass
        return True
    except (AttributeError, OSError):
        return False


#: The count this process's pools were set to by :func:`configure_torch` and why, or None.
_configured: tuple[int, str] | None = None


def configure_torch(trainer: TrainerConfig, table_elements: int | None = None) -> int:
    """Apply ``trainer.threads`` and ``trainer.deterministic`` to this process.

    * ``threads = n``: ``torch.set_num_threads(n)`` and one inter-op thread. Several
      processes on one machine should split its cores (``trainer.threads=1`` for two runs
      on two cores): with torch's default every process starts a thread per core, and the
      oversubscribed OpenMP threads spend their time waiting on each other.
    * ``threads`` unset: :func:`auto_threads` picks the count from :func:`machine_cpus`,
      :func:`machine_load` and ``table_elements`` (the largest embedding table's elements,
      e.g. :func:`config_table_elements`; None = unknown), then as ``threads = n``. It
      decides once per process: a later call with ``threads`` unset keeps the count that an
      earlier call set (by then this process's own work is in the load average). Where
      ``OMP_NUM_THREADS`` is set, torch's own count (which follows it) is kept.
    * ``deterministic``: ``torch.use_deterministic_algorithms(True)`` (Lightning's
      ``deterministic=True`` for single-KG runs), and one thread unless ``threads`` says
      otherwise. Measured on CPU (torch 2.13, 2 threads, ``scripts/benchmarks/determinism_probe.py``):
      the backward of advanced indexing (``table[ids]``, an ``index_put_`` that accumulates
      duplicate rows — the models look up the positive triples this way) adds the
      duplicates in an order that varies from process to process, so two identical runs
      drift apart (1e-4 to 8e-3 in the weights after one UMLS epoch at dim 256). Everything
      else a run uses repeats bit for bit, ``index_add_`` (the backward of
      ``index_select``) included. The deterministic switch moves ``index_put_`` to a sorted
      kernel, which fixes that. Independently, large reductions (``sum``/``mean``) split
      their work per thread, so their last bits follow the thread count: one thread makes
      the result independent of the machine's core count.

    Logs one INFO line (``lightning_fedkg.runtime``) with the count and why when the
    count is set. Returns the intra-op thread count now in effect.
    """
    import torch

    global _configured
    threads = effective_threads(trainer)
    if threads is not None:
        why = "trainer.threads" if trainer.threads is not None else "trainer.deterministic"
    elif _configured is not None:
        threads, why = _configured  # decided already in this process
    elif os.environ.get("OMP_NUM_THREADS"):
        threads, why = None, f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    else:
        threads, why = _choose(machine_cpus(), machine_load(), table_elements)
    if threads is None:  # the environment decides; torch's pools are left as they are
        threads = torch.get_num_threads()
    else:
        torch.set_num_threads(threads)
        _single_interop_thread(torch)
    if (threads, why) != _configured:
        log.info("threads: %d (%s)", threads, why)
    _configured = (threads, why)
    if trainer.deterministic:
        torch.use_deterministic_algorithms(True)
    return torch.get_num_threads()


def seed_process(seed: int) -> None:
    """Seed every generator of this process (Python, NumPy, torch; Lightning's dataloader
    workers too) with ``seed``: the one call behind every seeded start of (part of) a run."""
    import lightning as L

    L.seed_everything(seed, workers=True, verbose=False)


def prepare_process(cfg: ExperimentConfig) -> None:
    """Threads, determinism and seed of a process that runs (part of) a run: what
    :func:`lightning_fedkg.run.fit` does before a run starts, and what a process it does not
    reach does for itself (a Ray actor, a Flower client or ServerApp)."""
    configure_torch(cfg.trainer, config_table_elements(cfg))
    seed_process(cfg.seed)


def _single_interop_thread(torch) -> None:
    # torch accepts the inter-op pool size once per process, and only before the pool has
    # started (it raises RuntimeError otherwise): a second run in one process keeps the first's.
    if torch.get_num_interop_threads() == 1:
        return
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
