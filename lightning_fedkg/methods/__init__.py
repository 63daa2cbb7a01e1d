"""The built-in federated methods, one package each; the core (``federated/``, ``models/``,
``data/``, ``evaluation/``) names none of them.

==========  ==============================================================================
package     what it holds
==========  ==============================================================================
single      every client alone (FedE's Isolation)
entire      one model on the union of the clients' KGs (in-process reference)
fede        FedE: holder-mean of entity rows; its model-fusion layer and phase
fedr        FedR: holder-mean of relation rows
fedprox     FedProx on FedE's rows (FedLU's baseline)
fedec       FedEC on FedE's rows (FedLU's baseline)
fedlu       FedLU: distillation learner, strategy, client unlearning steps, unlearning phase
fkge        FKGE: PPAT, the KGEmb-Update, the peer-to-peer federation
fedcqa      FedCQA: the query-answering task, distributed retrieval, FedCQA and its baselines
==========  ==============================================================================

Each package exports its strategy and its config section(s); ``pyproject.toml`` declares
them as entry points (``lightning_fedkg.strategies``, ``lightning_fedkg.phases``), which is
how the registries (:mod:`lightning_fedkg.registry`) find them. A new method is one more
package with the same shape, and one more entry point, or an import path in a config.
"""

#: The built-in method packages (their entry points are in pyproject.toml).
BUILTIN_PACKAGES = ("single", "entire", "fede", "fedr", "fedprox", "fedec", "fedlu", "fkge", "fedcqa")
