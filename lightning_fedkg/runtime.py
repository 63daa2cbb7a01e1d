"""Process-wide torch settings a run asks for: its CPU thread budget and determinism.

``fedkg fit``/``fedkg test`` call :func:`configure_torch` right after loading the config,
before Lightning is imported or any tensor work starts; library users running several
experiments in one process call it once themselves. Both settings are global to the
process (torch has one intra-op and one inter-op thread pool), which is why they live
here and not in a Trainer.
"""

from __future__ import annotations

from lightning_fedkg.config import TrainerConfig

__all__ = ["configure_torch", "effective_threads", "EXPECTED_WARNINGS"]


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


def effective_threads(trainer: TrainerConfig) -> int | None:
    """The intra-op thread count a run asks for: ``trainer.threads``, else 1 when
    ``trainer.deterministic`` (see :func:`configure_torch`), else ``None`` (torch's default,
    one thread per core)."""
    if trainer.threads is not None:
        return int(trainer.threads)
    return 1 if trainer.deterministic else None


def configure_torch(trainer: TrainerConfig) -> int:
    """Apply ``trainer.threads`` and ``trainer.deterministic`` to this process.

    * ``threads = n``: ``torch.set_num_threads(n)`` and one inter-op thread. Several
      processes on one machine should split its cores (``trainer.threads=1`` for two runs
      on two cores): with torch's default every process starts a thread per core, and the
      oversubscribed OpenMP threads spend their time waiting on each other.
    * ``deterministic``: ``torch.use_deterministic_algorithms(True)`` (Lightning's
      ``deterministic=True`` for single-KG runs), and one thread unless ``threads`` says
      otherwise. Measured on CPU (torch 2.13, 2 threads, ``scripts/determinism_probe.py``):
      the backward of advanced indexing (``table[ids]``, an ``index_put_`` that accumulates
      duplicate rows — the models look up the positive triples this way) adds the
      duplicates in an order that varies from process to process, so two identical runs
      drift apart (1e-4 to 8e-3 in the weights after one UMLS epoch at dim 256). Everything
      else a run uses repeats bit for bit, ``index_add_`` (the backward of
      ``index_select``) included. The deterministic switch moves ``index_put_`` to a sorted
      kernel, which fixes that. Independently, large reductions (``sum``/``mean``) split
      their work per thread, so their last bits follow the thread count: one thread makes
      the result independent of the machine's core count.

    Returns the intra-op thread count now in effect.
    """
    import torch

    threads = effective_threads(trainer)
    if threads is not None:
        torch.set_num_threads(threads)
        _single_interop_thread(torch)
    if trainer.deterministic:
        torch.use_deterministic_algorithms(True)
    return torch.get_num_threads()


def _single_interop_thread(torch) -> None:
    # torch accepts the inter-op pool size once per process, and only before the pool has
    # started (it raises RuntimeError otherwise): a second run in one process keeps the first's.
    if torch.get_num_interop_threads() == 1:
        return
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
