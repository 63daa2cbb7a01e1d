"""The ServerApp and ClientApp a deployment runs (the app project's components).

``fedkg flower up`` writes a Flower app project whose ``[tool.flwr.app.components]`` name
these two objects; ``flwr run`` submits it to the SuperLink with the run config
(``fedkg-config``: the experiment config's YAML without the federation secret,
``run-dir``, ``num-clients``, ``resume``). Nothing is installed at run time: the package is
already installed beside every SuperNode and the SuperLink.
"""

from __future__ import annotations

from flwr.serverapp import ServerApp

from lightning_fedkg.backends.flower.client import client_app

__all__ = ["server_app", "client_app"]

server_app = ServerApp()


@server_app.main()
def main(grid, context) -> None:
    """Read the run config and serve the run (:func:`~.backend.serve_process`: this process
    opens the run directory itself)."""
    from lightning_fedkg.config import config_from_yaml_text
    from lightning_fedkg.backends.flower.backend import serve_process

    rc = context.run_config
    cfg = config_from_yaml_text(str(rc["fedkg-config"]), source="run config 'fedkg-config'")
    serve_process(grid, cfg, str(rc["run-dir"]), int(rc["num-clients"]), bool(rc["resume"]))
