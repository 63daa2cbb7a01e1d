"""The built-in federated methods, one package each; the core (``federated/``, ``models/``,
``data/``, ``evaluation/``) names none of them.

``single``, ``entire`` (the baselines), ``fede`` (with model fusion), ``fedr``, ``fedprox``,
``fedec``, ``fedlu`` (with unlearning), ``fkge`` and ``fedcqa``. Each package exports its
strategy and config section(s); ``pyproject.toml`` declares them as entry points
(``lightning_fedkg.strategies``, ``lightning_fedkg.phases``), which is how the registries
(:mod:`lightning_fedkg.registry`) find them. One page per method: docs/methods/.
"""

#: The built-in method packages (their entry points are in pyproject.toml).
BUILTIN_PACKAGES = ("single", "entire", "fede", "fedr", "fedprox", "fedec", "fedlu", "fkge", "fedcqa")
