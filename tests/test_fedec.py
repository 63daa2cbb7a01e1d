"""FedEC: FedE's server, an embedding-contrastive term in every local fit (FedLU's baseline)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from lightning_fedkg.config import load_config
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.methods.fedec.strategy import FedEC, FedECClient, contrastive_term
from lightning_fedkg.run import fit
from lightning_fedkg.models.kge_module import KGEModule

from conftest import make_tiny_config, single_thread


def fedec_config(*dotlist):
    """The tiny federation (conftest) under FedEC."""
    return make_tiny_config("fedec", *dotlist)


@pytest.fixture(scope="module")
def fedec_run(tmp_path_factory):
    """``(metrics, run_dir)`` of the tiny FedEC run (mu 0.1), shared by the tests that only read it."""
    run_dir = tmp_path_factory.mktemp("fedec") / "run"
    with single_thread():
        return fit(fedec_config(), run_dir), run_dir


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
    # E_prev: the rows after the client's previous local fit, kept by the half
    client.load_state_dict({"previous": {"entity_emb": torch.tensor([[0.0, 1.0], [0.0, -1.0]])}})
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
    assert not client.has_previous() and client.state_dict() == {}
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
    run = FederatedRun(fedec_config(), run_dir=None)
    run.align()
    run.train_round(1)
    trained = {c.name: c.model.entity_emb.detach().clone() for c in run.clients}
    assert all(c.module.regularizers == [] for c in run.clients)  # the term is gone after the fit
    run.evaluate("val", 1)  # overwrites every module's rows with the aggregated ones
    states, best = run.party_states(), run.party_states(weights_only=True)
    for c in run.clients:
        assert not torch.equal(c.model.entity_emb.detach(), trained[c.name])
        half = run.client_halves[c.name]
        assert half.has_previous() and torch.equal(half.previous()["entity_emb"], trained[c.name])
        # the half's state travels in the client's checkpoints (round and best sets) ...
        for state in (states[c.name], best[c.name]):
            assert set(state["half"]) == {"previous"} and set(state["half"]["previous"]) == {"entity_emb"}
            assert torch.equal(state["half"]["previous"]["entity_emb"], trained[c.name])
        # ... and nothing of FedEC's is in the module's own state
        assert not [k for k in c.module.state_dict() if k.startswith("fedec")]
        assert not [k for k in states[c.name]["module"] if k.startswith("fedec")]


def test_two_rounds_on_umls_move_only_entity_rows(fedec_run):
    metrics, run_dir = fedec_run
    assert metrics["strategy"] == "fedec" and metrics["rounds"] == 2
    assert 0.0 < metrics["test"]["mrr"] <= 1.0
    records = [json.loads(line) for line in (run_dir / "channel_log.jsonl").read_text().splitlines()]
    assert records and metrics["bytes_sent"] == sum(r["bytes"] for r in records if r["round"] >= 1)
    for r in records:
        if r["round"] == 0:  # alignment: keyed hashes of entity names only
            assert set(r["dtypes"].values()) <= {"uint8"}, r
            continue
        # only entity rows cross: no relation table, no E_prev buffer, no triples
        assert set(r["shapes"]) <= {"entity_emb"}, r
        assert all(d.startswith("float") for d in r["dtypes"].values()), r
    assert any(r["shapes"] for r in records if r["round"] >= 1)


@pytest.mark.slow
def test_a_resumed_run_keeps_the_previous_rows(fedec_run, tmp_path, one_thread):
    straight, _ = fedec_run
    fit(fedec_config("federated.rounds=1"), tmp_path / "resumed")
    resumed = fit(fedec_config(), tmp_path / "resumed")  # round 2 after a resume
    assert resumed["test"] == straight["test"] and resumed["clients"] == straight["clients"]


@pytest.mark.slow
def test_fedec_with_mu_zero_is_fede_exactly(tiny_fede_run, tmp_path, one_thread):
    fede, _ = tiny_fede_run
    fedec = fit(fedec_config("federated.fedec.mu=0"), tmp_path / "fedec")
    assert fedec["test"] == fede["test"] and fedec["clients"] == fede["clients"]
    assert fedec["bytes_sent"] == fede["bytes_sent"]


@pytest.mark.slow
def test_fedec_with_mu_positive_differs_from_fede(tiny_fede_run, tmp_path, one_thread):
    fede, _ = tiny_fede_run
    fedec = fit(fedec_config("federated.fedec.mu=1.0"), tmp_path / "fedec")
    assert fedec["test"] != fede["test"]


def test_the_temperature_must_be_positive():
    from lightning_fedkg.config import ConfigError

    with pytest.raises(ConfigError, match="temperature"):
        load_config(None, ["federated.strategy=fedec", "federated.fedec.temperature=0"])


# ---------------------------------------------------------------- E_prev is the client half's state
def test_the_half_state_is_a_checked_snapshot():
    module, client = hand_client(mu=0.1, temperature=0.2)
    set_rows(module, [[1.0, 2.0], [3.0, 4.0]])
    client.remember()
    state = client.state_dict()
    set_rows(module, [[5.0, 6.0], [7.0, 8.0]])
    client.remember()
    # a copy of the rows at the time, not a view of the half's (or the module's) tensors
    assert torch.equal(state["previous"]["entity_emb"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert torch.equal(client.previous()["entity_emb"], torch.tensor([[5.0, 6.0], [7.0, 8.0]]))
    assert not [k for k in module.state_dict() if k.startswith("fedec")]
    with pytest.raises(ValueError, match="shape"):
        client.load_state_dict({"previous": {"entity_emb": torch.zeros(3, 2)}})
    with pytest.raises(KeyError, match="entity_emb"):
        client.load_state_dict({"previous": {"entity_proj": torch.zeros(2, 2)}})
    client.load_state_dict(state)
    assert torch.equal(client.previous()["entity_emb"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    client.load_state_dict({})  # the state before any local fit
    assert not client.has_previous() and client.state_dict() == {}


def record_terms(run) -> dict[str, list[torch.Tensor]]:
    """``{client: [contrastive term value of every training batch]}`` from now on."""
    values: dict[str, list[torch.Tensor]] = {}
    for name, half in run.client_halves.items():
        add = half.add_loss_term

        def recorded_add(term, _name=name, _add=add):
            def recorded():
                value = term()
                values.setdefault(_name, []).append(value.detach().clone())
                return value

            _add(recorded)

        half.add_loss_term = recorded_add
    return values


@pytest.mark.slow
def test_a_run_resumed_into_a_fresh_federation_computes_the_same_contrastive_terms(one_thread):
    import io

    from lightning_fedkg.federated.checkpoint import capture_rng, restore_rng

    cfg = ["trainer.threads=1", "federated.fedec.mu=0.5"]
    straight = FederatedRun(fedec_config(*cfg), run_dir=None)
    for r in (1, 2):
        straight.train_round(r)
        straight.evaluate("val", r)  # overwrites the rows: E_prev must come from the half
    buffer = io.BytesIO()
    torch.save({"parties": straight.party_states(), "rng": capture_rng()}, buffer)

    def resumed(keep_half: bool = True) -> FederatedRun:
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=False)
        run = FederatedRun(fedec_config(*cfg), run_dir=None)
        parties = saved["parties"]
        if not keep_half:  # the control: every client half as freshly built, the rest resumed
            fresh = FederatedRun(fedec_config(*cfg), run_dir=None).party_states()
            parties = {n: {**s, "half": fresh[n]["half"]} if "half" in s else s for n, s in parties.items()}
        run.load_party_states(parties.__getitem__)
        restore_rng(saved["rng"])
        return run

    runs = {"straight": straight, "resumed": resumed(), "no_half": resumed(keep_half=False)}
    terms = {}
    for label, run in runs.items():
        if label == "straight":
            buffer.seek(0)
            restore_rng(torch.load(buffer, weights_only=False)["rng"])
        terms[label] = record_terms(run)
        run.train_round(3)
    names = [c.name for c in straight.clients]
    mu_log2 = torch.tensor(0.5 * math.log(2.0))
    for name in names:
        a, b = terms["straight"][name], terms["resumed"][name]
        assert len(a) == len(b) > 0
        assert all(torch.equal(x, y) for x, y in zip(a, b)), name  # bit for bit, every batch
        # E_prev was a trained model, so the first batch's term is below μ·log 2 (at E = E_glb)
        assert a[0] < mu_log2 - 1e-4
        # without the half's state the resumed client would start over from μ·log 2
        assert torch.allclose(terms["no_half"][name][0], mu_log2)
    for c, r in zip(straight.clients, runs["resumed"].clients):
        for k, v in c.module.state_dict().items():
            assert torch.equal(v, r.module.state_dict()[k]), (c.name, k)
        assert torch.equal(straight.client_halves[c.name].previous()["entity_emb"],
                           runs["resumed"].client_halves[c.name].previous()["entity_emb"])
    for t, table in straight.server.table.items():
        assert torch.equal(table, runs["resumed"].server.table[t])
        assert not torch.equal(table, runs["no_half"].server.table[t])
