"""FedEC: FedE's server, an embedding-contrastive term in every local fit (FedLU's baseline)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from lightning_fedkg.config import load_config
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.orchestrator import FederatedRun, run_federated
from lightning_fedkg.methods.fedec.strategy import (HAS_PREVIOUS, PREVIOUS_PREFIX, FedEC, FedECClient,
                                                        contrastive_term)
from lightning_fedkg.models.kge_module import KGEModule

BASE = ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared", "train.lr=0.05",
        "trainer.accelerator=cpu", "trainer.progress_bar=false", "federated.local_epochs=1",
        "federated.rounds=2", "federated.eval_every=1"]
FEDEC = BASE + ["federated.strategy=fedec"]


def hand_client(mu: float, temperature: float):
    """A FedEC client half on a 2-entity TransE module (dim 2), as FedProx's test builds one."""
    module = KGEModule("transe", num_entities=2, num_relations=1, dim=2)
    cfg = load_config(None, ["federated.strategy=fedec", f"federated.fedec.mu={mu}",
                             f"federated.fedec.temperature={temperature}"])
    party = SimpleNamespace(cfg=cfg, module=module, name="client_0", names={})
    return module, FedECClient(party, FedEC)


def set_rows(module, rows):
    with torch.no_grad():
        module.model.entity_emb.copy_(torch.tensor(rows))


def test_the_contrastive_term_value_by_hand():
    module, client = hand_client(mu=0.1, temperature=0.5)
    set_rows(module, [[3.0, 0.0], [1.0, 1.0]])  # the download E_glb
    with torch.no_grad():  # E_prev: the rows after the client's previous local fit
        getattr(module, PREVIOUS_PREFIX + "entity_emb").copy_(torch.tensor([[0.0, 1.0], [0.0, -1.0]]))
        getattr(module, HAS_PREVIOUS).fill_(True)
    client.before_fit(Message())
    (term,) = module.regularizers
    set_rows(module, [[1.0, 0.0], [0.0, 2.0]])  # E after some local steps
    # cos(E, E_glb) per entity: 1 and 1/√2; cos(E, E_prev): 0 and −1
    g = (1.0 + 1.0 / math.sqrt(2.0)) / 2 / 0.5
    p = (0.0 - 1.0) / 2 / 0.5
    expected = -0.1 * math.log(math.exp(g) / (math.exp(g) + math.exp(p)))
    assert term().item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.1 * math.log1p(math.exp(-1.0 - (1 + 0.5 ** 0.5))))  # μ·softplus(p − g)
    term().backward()
    assert module.model.entity_emb.grad is not None and module.model.relation_emb.grad is None
    client.after_fit()
    assert module.regularizers == []


def test_before_the_first_local_fit_the_previous_rows_are_the_download():
    # FedLU's client model starts from the server's rows, so E_prev = E_glb: the constant μ·log 2
    module, client = hand_client(mu=0.3, temperature=0.2)
    assert not bool(getattr(module, HAS_PREVIOUS))
    set_rows(module, [[1.0, 2.0], [-1.0, 0.5]])
    client.before_fit(Message())
    (term,) = module.regularizers
    set_rows(module, [[0.0, 1.0], [2.0, 2.0]])
    assert term().item() == pytest.approx(0.3 * math.log(2.0), rel=1e-6)
    term().backward()
    assert torch.allclose(module.model.entity_emb.grad, torch.zeros(2, 2), atol=1e-6)  # no pull either way
    client.after_fit()


def test_the_contrastive_term_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(0)
    local = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    glb, previous = torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g,
                                                                                       dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda e: contrastive_term(e, glb, previous, 0.1, 0.2), (local,))
    # a descent step turns the rows towards E_glb and away from E_prev
    cos = torch.nn.functional.cosine_similarity
    contrastive_term(local, glb, previous, 0.1, 0.2).backward()
    with torch.no_grad():
        stepped = local - 0.5 * local.grad
        assert cos(stepped, glb).mean() > cos(local, glb).mean()
        assert cos(stepped, previous).mean() < cos(local, previous).mean()


def test_previous_rows_are_the_end_of_local_training_not_the_evaluation_download(one_thread):
    run = FederatedRun(load_config(None, FEDEC), run_dir=None)
    run.align()
    run.train_round(1)
    trained = {c.name: c.model.entity_emb.detach().clone() for c in run.clients}
    assert all(c.module.regularizers == [] for c in run.clients)  # the term is gone after the fit
    run.evaluate("val", 1)  # overwrites every module's rows with the aggregated ones
    for c in run.clients:
        assert not torch.equal(c.model.entity_emb.detach(), trained[c.name])
        assert bool(getattr(c.module, HAS_PREVIOUS))
        assert torch.equal(getattr(c.module, PREVIOUS_PREFIX + "entity_emb"), trained[c.name])
        # and the buffers travel with the module's weights (checkpoints, resume)
        assert torch.equal(c.state_dict()["module"][PREVIOUS_PREFIX + "entity_emb"], trained[c.name])


def test_two_rounds_on_umls_move_only_entity_rows(tmp_path, one_thread):
    metrics = run_federated(load_config(None, FEDEC), tmp_path)
    assert metrics["strategy"] == "fedec" and metrics["rounds"] == 2
    assert 0.0 < metrics["test"]["mrr"] <= 1.0
    records = [json.loads(line) for line in (tmp_path / "channel_log.jsonl").read_text().splitlines()]
    assert records and metrics["bytes_sent"] == sum(r["bytes"] for r in records if r["round"] >= 1)
    for r in records:
        if r["round"] == 0:  # alignment: keyed hashes of entity names only
            assert set(r["dtypes"].values()) <= {"uint8"}, r
            continue
        # only entity rows cross: no relation table, no E_prev buffer, no triples
        assert set(r["shapes"]) <= {"entity_emb"}, r
        assert all(d.startswith("float") for d in r["dtypes"].values()), r
    assert any(r["shapes"] for r in records if r["round"] >= 1)


def test_a_resumed_run_keeps_the_previous_rows(tmp_path, one_thread):
    straight = run_federated(load_config(None, FEDEC), tmp_path / "straight")
    run_federated(load_config(None, FEDEC + ["federated.rounds=1"]), tmp_path / "resumed")
    resumed = run_federated(load_config(None, FEDEC), tmp_path / "resumed")  # round 2 after a resume
    assert resumed["test"] == straight["test"] and resumed["clients"] == straight["clients"]


def test_fedec_with_mu_zero_is_fede_exactly(tmp_path, one_thread):
    fede = run_federated(load_config(None, BASE + ["federated.strategy=fede"]), tmp_path / "fede")
    fedec = run_federated(load_config(None, FEDEC + ["federated.fedec.mu=0"]), tmp_path / "fedec")
    assert fedec["test"] == fede["test"] and fedec["clients"] == fede["clients"]
    assert fedec["bytes_sent"] == fede["bytes_sent"]


def test_fedec_with_mu_positive_differs_from_fede(tmp_path, one_thread):
    fede = run_federated(load_config(None, BASE + ["federated.strategy=fede"]), tmp_path / "fede")
    fedec = run_federated(load_config(None, FEDEC + ["federated.fedec.mu=1.0"]), tmp_path / "fedec")
    assert fedec["test"] != fede["test"]


def test_the_temperature_must_be_positive():
    from lightning_fedkg.config import ConfigError

    with pytest.raises(ConfigError, match="temperature"):
        load_config(None, ["federated.strategy=fedec", "federated.fedec.temperature=0"])
