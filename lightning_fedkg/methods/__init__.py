"""The built-in federated methods, one package each holding the method's whole slice; the
core (``federated/``, ``models/``, ``data/``, ``evaluation/``) and ``cli.py`` name none of them.

``single``, ``entire`` (the baselines), ``fede`` (with model fusion), ``fedr``, ``fedprox``,
``fedec``, ``fedlu`` (with unlearning), ``fkge`` (with its multi-source data, triple
classification and PATE accounting) and ``fedcqa`` (with the query-answering task). Each
package exports its strategy and config section(s); ``pyproject.toml`` declares them as
entry points (``lightning_fedkg.strategies``, ``.phases``, ``.tasks`` and ``.commands``:
FedLU's ``fedkg unlearn``, FedCQA's ``fedkg query``), which is how the registries
(:mod:`lightning_fedkg.registry`) find them; a strategy, task or phase prints its own table
through ``format_report``. One page per method: docs/methods/.
"""

#: The built-in method packages (their entry points are in pyproject.toml).
BUILTIN_PACKAGES = ("single", "entire", "fede", "fedr", "fedprox", "fedec", "fedlu", "fkge", "fedcqa")
