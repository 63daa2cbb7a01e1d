"""FedProx: FedE's server, a proximal term ``mu/2 ‖E − E_global‖²_F`` in every local fit."""

import pytest
import torch

from lightning_fedkg.config import load_config
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.run import fit

from conftest import make_tiny_config


@pytest.mark.slow
def test_fedprox_with_mu_zero_is_fede_exactly(tiny_fede_run, tmp_path, one_thread):
    fede, _ = tiny_fede_run
    prox = fit(make_tiny_config("fedprox", "federated.fedprox.mu=0"), tmp_path / "prox")
    assert prox["test"] == fede["test"] and prox["clients"] == fede["clients"]
    assert prox["bytes_sent"] == fede["bytes_sent"]


def distance_from_download(strategy: str, mu: float) -> float:
    section = [f"federated.fedprox.mu={mu}"] if strategy == "fedprox" else []
    run = FederatedRun(make_tiny_config(strategy, *section), run_dir=None)
    run.align()
    downloads = {c.name: run.server.rows(c.name)["entity_emb"] for c in run.clients}
    run.train_round(1)
    # the proximal term is gone after the fit: the module trains plainly outside a round
    assert all(c.module.regularizers == [] for c in run.clients)
    return sum(float((c.model.entity_emb.detach() - downloads[c.name]).norm()) for c in run.clients)


def test_the_proximal_term_keeps_local_rows_near_the_received_ones(one_thread):
    fede = distance_from_download("fede", 0.0)
    prox = distance_from_download("fedprox", 1.0)
    assert fede > 0 and prox < 0.8 * fede, (prox, fede)


def test_the_proximal_term_value_and_gradient():
    from types import SimpleNamespace

    from lightning_fedkg.methods.fedprox.strategy import FedProx, FedProxClient
    from lightning_fedkg.models.kge_module import KGEModule

    module = KGEModule("transe", num_entities=3, num_relations=1, dim=2)
    cfg = load_config(None, ["federated.strategy=fedprox", "federated.fedprox.mu=0.5"])
    party = SimpleNamespace(cfg=cfg, module=module, name="client_0", names={})
    client = FedProxClient(party, FedProx)
    client.before_fit(Message())
    (term,) = module.regularizers
    assert term().item() == 0.0  # at the anchor
    with torch.no_grad():
        module.model.entity_emb.add_(1.0)  # every one of the 3 x 2 entries moves by 1
    assert torch.isclose(term(), torch.tensor(0.5 * 0.5 * 6))
    term().backward()
    assert torch.allclose(module.model.entity_emb.grad, torch.full((3, 2), 0.5))  # mu · (E − E_global)
    assert module.model.relation_emb.grad is None  # relations are not pulled
    client.after_fit()
    assert module.regularizers == []
