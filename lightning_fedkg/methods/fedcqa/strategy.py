"""FedCQA and its baselines under the query-answering task.

Hu et al., "FedCQA: Answering Complex Queries on Multi-Source Knowledge Graphs via
Federated Learning" (§4.1, Eq. 2–4): the server averages the operator networks and
holder-averages entity rows; relation rows are not aggregated. :class:`FedCQA`
requires secure aggregation with the aggregate hidden (``secret: secure``, default) or runs
the paper's static masks (``secret: paper``, :mod:`.paper_secret`). Baselines (§5.1.3):
:class:`CQAFedE` and :class:`CQAFedR` share in clear; Local is ``single``, Central
``entire``. See docs/methods/fedcqa.md.
"""

from __future__ import annotations

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.strategy import ClientHalf, Strategy

from .config import FedCQAConfig
from .paper_secret import PaperSecretClient, PaperSecretServer, check_paper_config

__all__ = ["FedCQA", "CQAFedE", "CQAFedR", "FedCQAServer", "FedCQAClient"]


def _secret(cfg) -> str:
    # The section exists whenever federated.strategy names FedCQA; "secure" is its default.
    section = getattr(cfg.federated, "fedcqa", None)
    return "secure" if section is None else str(section.secret)


class FedCQAServer(PaperSecretServer):
    """The holder-mean server (Eq. 2). ``secret: secure``: refuses to run without the hidden
    secure aggregate, which then masks everything (the paper's masking stays off);
    ``secret: paper``: refuses secure aggregation and holds the paper's masked table."""

    def __init__(self, ctx, strategy) -> None:
        secret = _secret(ctx.cfg)
        if ctx.cfg.federated.aggregation == "named_rows":
            raise ConfigError("federated.strategy=fedcqa hides entity rows from the server; federated.aggregation="
                              "named_rows would show it which rows each client trained on (fedcqa_fede runs it in clear)")
        if secret == "paper":
            check_paper_config(ctx.cfg)
        else:
            sa = ctx.cfg.federated.secure_aggregation
            if not (sa.enabled and sa.hide_aggregate):
                raise ConfigError(
                    "federated.strategy=fedcqa aggregates entity rows so that the server sees neither the uploads "
                    "nor their mean: set federated.secure_aggregation.enabled=true, hide_aggregate=true and a "
                    "federated.federation_key (fedcqa_fede is the same training in clear; "
                    "federated.fedcqa.secret=paper is the paper's own, weaker, masking)")
        # Set before the base builds anything: aggregate_align reads it.
        self.paper_secret = secret == "paper"
        super().__init__(ctx, strategy)


class FedCQAClient(PaperSecretClient):
    """A plain client half under ``secret: secure`` (secure aggregation wraps it); the
    paper's masking client (Eq. 3–4) under ``secret: paper``."""

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        self.paper_secret = _secret(party.cfg) == "paper"


class FedCQA(Strategy):
    """FedCQA: operators FedAvg'd, entity rows holder-averaged without the server seeing them
    (``federated.fedcqa.secret``: the hidden secure aggregate, or the paper's masks, Eq. 2–4)."""

    name = "fedcqa"
    Server = FedCQAServer
    Client = FedCQAClient
    groups = ("entity", "operators")
    config_class = FedCQAConfig


class CQAFedE(Strategy):
    """The FedE baseline of FedCQA: entity, relation and operator parameters averaged in clear."""

    name = "fedcqa_fede"
    Server = HolderMeanServer
    Client = ClientHalf
    groups = ("entity", "relation", "operators")


class CQAFedR(Strategy):
    """The FedR baseline of FedCQA: relation rows and operators averaged in clear; entities stay."""

    name = "fedcqa_fedr"
    Server = HolderMeanServer
    Client = ClientHalf
    groups = ("relation", "operators")
