"""FedCQA (Hu et al.): complex query answering over several KGs, the query-answering task,
its distributed retrieval of cross-graph queries, and the baselines FedE/FedR-style.

* :mod:`.strategy` (:class:`FedCQA`, :class:`CQAFedE`, :class:`CQAFedR`), :mod:`.paper_secret`
  (the paper's masking), :mod:`.retrieval` (cross-graph queries), :mod:`.config`;
* the task: :mod:`.task` (``federated.task: query_answering``), :mod:`.queries` and
  :mod:`.query_sets` (structures, answering, cached sets), :mod:`.encoders` (GQE, Q2P,
  tree-LSTM), :mod:`.module` (``QueryAnsweringModule``), :mod:`.ranking`, :mod:`.entries`;
* ``fedkg query``: :mod:`.commands` and :mod:`.query_text`. See docs/methods/fedcqa.md.
"""

import importlib

#: Each export and the module that defines it, imported on first use: ``fedkg`` imports
#: :mod:`.commands` for every call, ``--help`` included, which must not load torch.
_EXPORTS = {"FedCQA": "strategy", "CQAFedE": "strategy", "CQAFedR": "strategy", "FedCQAConfig": "config",
            "QueryAnswering": "task", "QueryTaskConfig": "config"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
