"""FedCQA under the query-answering task: retrieval plans, distributed retrieval against a
central oracle, what crosses the Channel, the hidden aggregate against plain averaging,
and end-to-end learning on UMLS."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_fedkg.config import ConfigError, load_config
from lightning_fedkg.methods.fedcqa.queries import STRUCTURES, num_slots
from lightning_fedkg.methods.fedcqa.query_sets import cross_query_sets
from lightning_fedkg.federated.message import decode
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.run import fit
from lightning_fedkg.methods.fedcqa.config import query_settings
from lightning_fedkg.methods.fedcqa.retrieval import stage_plan
from lightning_fedkg.methods.fedcqa.encoders import GQE, Q2P, DeepSetsGQE, TreeLSTM, run_plan

from conftest import make_small_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "fedcqa"

pytest.importorskip("cryptography")

KEY = "test-federation-secret"


def cqa_config(tmp_path, **overrides):
    """The small federation (conftest) answering queries with GQE under FedCQA-FedE, dim 32."""
    settings = {
        "model.dim": 32, "train.lr": 0.01, "train.batch_size": 64, "train.eval_batch_size": 64,
        "task.encoder": "gqe", "task.steps_per_epoch": 10, "task.train_per_type": 1500,
        "task.eval_per_type": 150, "task.cross_per_type": 60, "task.cache_dir": str(tmp_path / "queries"),
        "federated.task": "query_answering", "federated.rounds": 2,
        "federated.local_epochs": 1, "federated.eval_every": 1, "federated.federation_key": KEY,
    }
    return make_small_config("fedcqa_fede", **{**settings, **overrides})


def fedcqa(tmp_path, **overrides):
    return cqa_config(tmp_path, federated__strategy="fedcqa", federated__secure_aggregation__enabled="true",
                      federated__secure_aggregation__hide_aggregate="true", **overrides)


# ---------------------------------------------------------------- plans
def test_stage_plan_splits_projections_into_hops_by_depth():
    # ip = [a1, r1, a2, r2, r3]: two first hops, then r3 on their intersection
    hops, root = stage_plan(GQE.plan("ip"))
    assert hops == [[(0, ("a", 0), 1), (1, ("a", 2), 3)], [(2, ("i", [("s", 0), ("s", 1)]), 4)]]
    assert root == ("s", 2)
    # pi = [a1, r1, r2, a2, r3]: the 2p branch needs two hops, the root intersects
    hops, root = stage_plan(GQE.plan("pi"))
    assert [len(h) for h in hops] == [2, 1] and root == ("i", [("s", 1), ("s", 2)])
    # up under DNF: both alternatives end with r3 (slot 5), joined at the root
    hops, root = stage_plan(GQE.plan("up"))
    assert [[slot for _, _, slot in h] for h in hops] == [[1, 3], [5, 5]] and root[0] == "u"
    # the tree-LSTM keeps the union as a node: r3 projects the union of two branches
    hops, root = stage_plan(TreeLSTM.plan("up"))
    assert hops[1] == [(2, ("u", [("s", 0), ("s", 1)]), 5)] and root == ("s", 2)


@pytest.mark.parametrize("encoder", [GQE, Q2P, TreeLSTM, DeepSetsGQE])
def test_plans_compute_what_embed_computes(encoder):
    torch.manual_seed(0)
    enc = encoder(20, 8, 16).eval()
    for name, structure in STRUCTURES.items():
        rows = torch.randint(0, 8, (6, num_slots(structure)))
        expected = enc.embed(name, rows)
        assert torch.allclose(enc.output(run_plan(enc, enc.plan(name), rows)), expected, atol=1e-6), name


# ---------------------------------------------------------------- retrieval
@pytest.mark.slow
def test_distributed_retrieval_of_a_central_model_ranks_as_the_model_itself(tmp_path):
    """Under *Entire* every client holds views of one global model, so the holder-mean of
    their score tables is the central model's score of every entity: cross-graph metrics
    by retrieval must equal the central module's own evaluation of the same queries."""
    cfg = cqa_config(tmp_path, federated__strategy="entire", federated__rounds=1)
    run = FederatedRun(cfg, tmp_path / "run")
    run.train_round(1)
    run.evaluate("test", 1)
    cross = run.server.cross_graph()
    central = run.server.central
    expected = central.module.evaluate(cross_query_sets(run.fkg, query_settings(cfg.task), tmp_path / "queries"))
    assert cross["unanswered"] == 0 and set(cross["by_type"]) == set(expected["by_type"])
    for name, m in expected["by_type"].items():
        assert cross["by_type"][name]["queries"] == m["queries"]
        for key in ("mrr", "hits@1", "hits@3", "hits@10"):
            assert cross["by_type"][name][key] == pytest.approx(m[key], abs=1e-5), (name, key)
    run.close()


@pytest.mark.slow
def test_retrieval_moves_states_and_scores_never_rows(tmp_path):
    cfg = cqa_config(tmp_path, federated__record_payloads="true", federated__rounds=1, task__retrieval="paper")
    fit(cfg, tmp_path / "run")
    run = FederatedRun(cfg, None)  # the same clients' rows, to look for them in the payloads
    tables = [p.module.encoder.entity_emb.detach() for p in run.clients]
    steps = sorted((tmp_path / "run" / "payloads").glob("r*_cq_step*.safetensors"))
    assert steps
    kinds = set()
    for path in steps:
        arrays = decode(path.read_bytes()).arrays
        assert not {n for n in arrays if "emb" in n or "bias" in n}
        for name, tensor in arrays.items():
            kinds.add(name.split(":")[-1][0] if ":" in name else name)
            if tensor.is_floating_point() and tensor.dim() == 2 and tensor.shape[1] == tables[0].shape[1]:
                # a state is never a bare entity row (the anchor is projected where it lives)
                for table in tables:
                    assert not (torch.cdist(tensor, table) < 1e-6).any()
    assert {"scores", "entity", "relation"} <= kinds


# ---------------------------------------------------------------- FedCQA
@pytest.mark.slow
def test_fedcqa_refuses_to_run_with_a_visible_aggregate(tmp_path):
    with pytest.raises(ConfigError, match="hide_aggregate"):
        FederatedRun(cqa_config(tmp_path, federated__strategy="fedcqa"), None)


@pytest.mark.slow
def test_fedcqa_hidden_aggregate_equals_plain_averaging(tmp_path, monkeypatch):
    """One round of FedCQA against the same round with the same groups averaged in clear:
    the clients end with the same entity rows and operators, up to fixed-point rounding."""
    from lightning_fedkg.federated.holder_mean import HolderMeanServer
    from lightning_fedkg.methods.fedcqa import FedCQA

    secure_run = FederatedRun(fedcqa(tmp_path), None)
    monkeypatch.setattr(FedCQA, "Server", HolderMeanServer)
    plain_run = FederatedRun(cqa_config(tmp_path, federated__strategy="fedcqa"), None)
    for run in (secure_run, plain_run):
        run.train_round(1)
        run.load_evaluation_state(1)
    for a, b in zip(secure_run.clients, plain_run.clients):
        ga, gb = a.module.shareable_groups(), b.module.shareable_groups()
        for group in ("entity", "operators"):
            for name, t in ga[group].tensors.items():
                assert torch.allclose(t, gb[group].tensors[name], atol=2 ** -14), (group, name)
        # relations are never aggregated: each client keeps its own, bit for bit the same in
        # both runs (the secure aggregate's fixed point would have rounded them)
        assert torch.equal(ga["relation"].tensors["relation_emb"], gb["relation"].tensors["relation_emb"])
    secure_run.close()
    plain_run.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fedcqa_trains_and_answers_on_cuda(tmp_path):
    """FedCQA's first CUDA run failed every client's first upload: the secure-aggregation
    masks (host tensors) met the module's rows on the device. A round on CUDA, validated,
    then the test with cross-graph retrieval."""
    cfg = fedcqa(tmp_path, federated__rounds=1, task__steps_per_epoch=3, trainer__accelerator="gpu")
    metrics = fit(cfg, tmp_path / "run")
    assert metrics["rounds"] == 1 and not metrics["failures"], metrics["failures"]
    assert metrics["in_graph"]["mrr"] > 0 and metrics["cross_graph"]["unanswered"] == 0


@pytest.mark.slow
def test_fedcqa_learns_on_umls_in_graph_and_across_graphs(tmp_path):
    cfg = fedcqa(tmp_path, federated__rounds=4, federated__eval_every=2, task__steps_per_epoch=30,
                 model__dim=128, train__lr=0.005, train__batch_size=128, federated__record_payloads="true")
    metrics = fit(cfg, tmp_path / "run")
    # a random ranking of UMLS's 135 entities has an MRR near .04
    assert metrics["in_graph"]["mrr"] > 0.3, metrics["in_graph"]
    assert metrics["cross_graph"]["mrr"] > 0.25 and metrics["cross_graph"]["unanswered"] == 0
    assert set(metrics["cross_graph"]["by_type"]) == {"2p", "3p", "2i", "3i", "ip", "pi", "2u", "up"}
    # no plaintext float of training ever reaches the server
    upward = (tmp_path / "run" / "payloads").glob("r*_client_*_to_server_upload.safetensors")
    assert {str(t.dtype) for p in upward for t in decode(p.read_bytes()).arrays.values()} == {"torch.int32"}
    # the server's TensorBoard has the cross-graph test, per type, at the best round
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "run" / "tb" / "server"))
    acc.Reload()
    (event,) = acc.Scalars("test/cross_graph/2i/mrr")
    assert event.step == metrics["best_round"]
    assert event.value == pytest.approx(metrics["cross_graph"]["by_type"]["2i"]["mrr"])
    # fedkg test --from answers the cross-graph queries again from the best state, as the run did
    from lightning_fedkg.federated.entry import evaluate_federated_checkpoint

    again = evaluate_federated_checkpoint(cfg, tmp_path / "run")
    assert again["cross_graph"]["mrr"] == pytest.approx(metrics["cross_graph"]["mrr"])
    assert again["in_graph"]["mrr"] == pytest.approx(metrics["in_graph"]["mrr"])
    # the printed table has the cross-graph test below the clients
    from lightning_fedkg.cli import format_metrics_table

    table = format_metrics_table(metrics, cfg).splitlines()
    mean = next(line for line in table if line.startswith("cross mean")).split()
    queries = sum(m["queries"] for m in metrics["cross_graph"]["by_type"].values())
    assert mean[2:4] == [str(queries), f"{metrics['cross_graph']['mrr']:.4f}"]
    assert sum(line.startswith("cross ") for line in table) == 9


# ---------------------------------------------------------------- fedkg query
def test_parse_query_knows_every_structure_and_says_where_a_query_breaks():
    from lightning_fedkg.methods.fedcqa.query_text import QuerySyntaxError, parse_query

    b = "(e:a, (r:x))"
    typed = {"1p": b, "2p": "(e:a, (r:x, r-:y))", "3p": "(e:a, (r:x, r:y, r:z))", "2i": f"i({b}, {b})",
             "3i": f"i({b},{b},{b})", "ip": f"(i({b}, {b}), (r:z))", "pi": f"i((e:a, (r:x, r:y)), {b})",
             "2u": f"u({b}, {b})", "up": f"(u({b}, {b}), (r:z))"}
    for name, text in typed.items():
        structure, slots = parse_query(text)
        assert structure == name and len(slots) == num_slots(STRUCTURES[name])
    assert parse_query('(e:"New York, NY", (r-:born_in))')[1] == [("e", "New York, NY"), ("r-", "born_in")]
    assert parse_query("(e:a, (r:x,))") == parse_query(b)  # Python's one-tuple comma is fine
    with pytest.raises(QuerySyntaxError, match="character 12"):
        parse_query("(e:a, (r:x)")
    with pytest.raises(QuerySyntaxError, match="character 10"):
        parse_query("(e:a, (r:,))")
    with pytest.raises(QuerySyntaxError, match="not one the encoders answer"):
        parse_query("i((e:a, (r:x, r:y, r:z)), (e:b, (r:y)))")


@pytest.mark.slow
def test_answer_query_by_retrieval_matches_the_central_model(tmp_path):
    from lightning_fedkg.methods.fedcqa.queries import anchors_and_relations
    from lightning_fedkg.methods.fedcqa.query_text import QuerySyntaxError, answer_query

    cfg = cqa_config(tmp_path, federated__strategy="entire", federated__rounds=1)
    run = FederatedRun(cfg, None)
    run.train_round(1)
    run.load_evaluation_state(1)
    qs = cross_query_sets(run.fkg, query_settings(cfg.task), tmp_path / "queries")["pi"]
    row = qs.queries[0]
    ent, rel = run.fkg.entity_names, run.fkg.relation_names
    (a1, a2), (r1, r2, r3) = [[int(row[i]) for i in s] for s in anchors_and_relations(STRUCTURES["pi"])]

    def r(x):
        return f"{'r-' if x % 2 else 'r'}:{rel[x // 2]}"

    text = f"i((e:{ent[a1]}, ({r(r1)}, {r(r2)})), (e:{ent[a2]}, ({r(r3)})))"
    structure, answers = answer_query(cfg, run, text, top=5)
    central = run.server.central.module.encoder.eval()
    with torch.no_grad():
        expected = central.score(central.embed("pi", row[None])).squeeze(0).topk(5)
    assert structure == "pi"
    assert [name for name, _ in answers] == [ent[int(i)] for i in expected.indices]
    assert [s for _, s in answers] == pytest.approx(expected.values.tolist(), abs=1e-4)
    with pytest.raises(QuerySyntaxError, match="did you mean"):
        answer_query(cfg, run, f"(e:{ent[a1]}x, ({r(r1)}))")
    run.close()


@pytest.mark.slow
def test_data_stats_of_a_query_config_counts_each_set(tmp_path, capsys):
    from lightning_fedkg.cli import main
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.methods.fedcqa.query_sets import federated_query_sets, query_stats

    overrides = [f"task.cache_dir={tmp_path}", "task.train_per_type=60", "task.eval_per_type=30",
                 "task.cross_per_type=20", "task.types=[1p,2p,2i,up]", "task.train_types=[1p,2p]"]
    assert main(["data", "stats", "-c", str(CONFIGS / "umls_fedcqa_gqe.yaml"), *overrides]) == 0
    lines = capsys.readouterr().out.splitlines()
    cfg = load_config(CONFIGS / "umls_fedcqa_gqe.yaml", overrides)
    sets = federated_query_sets(load_federated_kg(cfg), query_settings(cfg.task), tmp_path)
    rows = query_stats(sets)
    assert [r["set"] for r in rows] == ["client_0"] * 3 + ["client_1"] * 3 + ["client_2"] * 3 + ["cross-graph"]
    assert rows[-1]["2p"] == len(sets["cross"]["2p"]) == 20 and "1p" not in rows[-1]
    assert rows[0]["2p"] == 60 // 3 and rows[1]["up"] == 30 // 3
    hard = sets["clients"][1]["test"]["2i"].hard_offsets.diff().double().mean()
    assert rows[5]["2i/hard"] == pytest.approx(float(hard))
    cross = next(line for line in lines if line.startswith("cross-graph"))
    assert cross.split()[2:] == ["-", "20", f"({rows[-1]['2p/hard']:.1f})", "20", f"({rows[-1]['2i/hard']:.1f})",
                                 "20", f"({rows[-1]['up/hard']:.1f})"]


def test_data_stats_refuses_what_is_not_a_query_config(capsys):
    from lightning_fedkg.cli import main

    assert main(["data", "stats", "-c", str(CONFIGS.parent / "fede" / "umls_fede.yaml")]) == 2
    assert "is a 'link_prediction' config, whose task builds no data beyond the graphs" in capsys.readouterr().err
    assert main(["data", "stats"]) == 2
    assert "give one dataset" in capsys.readouterr().err


@pytest.mark.slow
def test_query_sets_sampled_in_processes_are_those_of_one_process(tmp_path, capsys):
    """``fedkg data stats --workers 3``: the cache its processes fill holds, file for file,
    the bytes one process writes (each set's sampler is seeded by its own key), and the
    printed table is the same; several processes need a cache, and --workers at least 1."""
    import filecmp

    from lightning_fedkg.cli import main
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.methods.fedcqa.query_sets import federated_query_sets

    common = ["task.train_per_type=90", "task.eval_per_type=30", "task.cross_per_type=20",
              "task.types=[1p,2p,2i,up]", "task.train_types=[1p,2p]"]
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    assert main(["data", "stats", "-c", str(CONFIGS / "umls_fedcqa_gqe.yaml"), f"task.cache_dir={serial}", *common]) == 0
    one = capsys.readouterr().out
    assert main(["data", "stats", "--workers", "3", "-c", str(CONFIGS / "umls_fedcqa_gqe.yaml"),
                 f"task.cache_dir={parallel}", *common]) == 0
    assert capsys.readouterr().out == one  # the same table
    names = sorted(p.name for p in serial.iterdir())
    assert len(names) == 3 * (2 + 4 + 4) + 3  # 3 clients x (train, valid, test types) + cross-graph (no 1p)
    assert sorted(p.name for p in parallel.iterdir()) == names
    assert all(filecmp.cmp(serial / n, parallel / n, shallow=False) for n in names)
    cfg = load_config(CONFIGS / "umls_fedcqa_gqe.yaml", [f"task.cache_dir={parallel}", *common])
    with pytest.raises(ValueError, match="needs a cache_dir"):
        federated_query_sets(load_federated_kg(cfg), query_settings(cfg.task), None, workers=2)
    assert main(["data", "stats", "--workers", "0", "-c", str(CONFIGS / "umls_fedcqa_gqe.yaml")]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


def test_a_sampling_worker_leaves_cached_sets_unread(tmp_path, monkeypatch):
    """A worker of ``--workers`` only fills the cache: on a full cache it reads no set (the
    parent process loads each set once, after the workers)."""
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.methods.fedcqa import query_sets

    cfg = load_config(CONFIGS / "umls_fedcqa_gqe.yaml", [
        f"task.cache_dir={tmp_path}", "task.train_per_type=60", "task.eval_per_type=30", "task.cross_per_type=10",
        "task.types=[1p,2p,2i]", "task.train_types=[1p,2p]"])
    fkg, settings = load_federated_kg(cfg), query_settings(cfg.task)
    query_sets.federated_query_sets(fkg, settings, tmp_path)  # fills the cache
    files = sorted(tmp_path.iterdir())
    loads, load = [], query_sets._load
    monkeypatch.setattr(query_sets, "_load", lambda path: loads.append(path) or load(path))
    for client in (*range(len(fkg.clients)), None):
        query_sets._sample_part(client, settings, fkg, str(tmp_path))
    assert loads == [] and sorted(tmp_path.iterdir()) == files
    assert len(query_sets.graph_query_sets(fkg.clients[0], settings, 3, tmp_path)["test"]) == 3
    assert len(loads) == 2 + 3 + 3  # a plain call still loads: train 1p 2p, valid and test 1p 2p 2i


# ---------------------------------------------------------------- named rows (the FedCQA code's partial update)
@pytest.mark.slow
def test_named_rows_averages_a_row_over_the_clients_that_named_it(tmp_path, monkeypatch):
    """``federated.aggregation=named_rows`` against a brute-force oracle over one round: a
    client's upload marks exactly the anchors, relations and answers of its batches; the
    server averages each row over the clients that named it and keeps the others; after the
    download a client holds the averaged rows and its own values of every other row."""
    from lightning_fedkg.federated.strategy import ClientHalf
    from lightning_fedkg.methods.fedcqa.module import QueryAnsweringModule
    from lightning_fedkg.methods.fedcqa.queries import anchors_and_relations

    batches, uploads = {}, {}
    step, upload = QueryAnsweringModule.training_step, ClientHalf.upload

    def recording_step(module, batch, batch_idx):
        batches.setdefault(id(module), []).append({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()})
        return step(module, batch, batch_idx)

    def recording_upload(half):
        out = upload(half)
        uploads[half.party.name] = {k: v.clone() for k, v in out.items()}
        return out

    monkeypatch.setattr(QueryAnsweringModule, "training_step", recording_step)
    monkeypatch.setattr(ClientHalf, "upload", recording_upload)
    cfg = cqa_config(tmp_path, federated__aggregation="named_rows", federated__rounds=1, task__steps_per_epoch=3)
    run = FederatedRun(cfg, None)
    run.align()
    before = run.server.table["entity_emb"].clone()
    run.train_round(1)
    after = run.server.table["entity_emb"]
    index = run.server.alignments["entity"].index
    sums, counts = torch.zeros_like(before, dtype=torch.float64), torch.zeros(before.shape[0])
    for party in run.clients:
        named, relations = set(), set()  # the oracle: every batch, one query at a time
        for batch in batches[id(party.module)]:
            anchors, slots = anchors_and_relations(STRUCTURES[batch["structure"]])
            for query, answer in zip(batch["queries"].tolist(), batch["positive"].tolist()):
                named |= {query[s] for s in anchors} | {answer}
                relations |= {query[s] // 2 for s in slots}  # a row holds a relation and its inverse
        sent = uploads[party.name]
        assert sorted(sent["named:entity"].nonzero().flatten().tolist()) == sorted(named)
        assert sorted(sent["named:relation"].nonzero().flatten().tolist()) == sorted(relations)
        assert 0 < len(named) < party.module.hparams.num_entities  # some rows named, some not
        rows = torch.tensor(sorted(named))
        sums.index_add_(0, index[party.name][rows], sent["entity_emb"][rows].double())
        counts.index_add_(0, index[party.name][rows], torch.ones(len(rows)))
    averaged = counts > 0
    assert torch.allclose(after[averaged], (sums[averaged] / counts[averaged, None]).float(), atol=1e-6)
    assert torch.equal(after[~averaged], before[~averaged])  # nobody named them: the table keeps them
    run.evaluate("valid", 1)  # the download: averaged rows only
    for party in run.clients:
        held = party.module.encoder.entity_emb.detach()
        taken = averaged[index[party.name]]
        assert torch.equal(held[taken], after[index[party.name]][taken])
        assert torch.equal(held[~taken], uploads[party.name]["entity_emb"][~taken])
        assert not torch.equal(held[~taken], after[index[party.name]][~taken])  # they moved locally
    assert torch.equal(run.server.named["entity"], averaged)
    run.close()


def test_named_rows_is_refused_where_the_server_must_not_see_rows_or_the_module_names_none(tmp_path):
    with pytest.raises(ConfigError, match="named_rows"):
        FederatedRun(fedcqa(tmp_path, federated__aggregation="named_rows"), None)
    with pytest.raises(ConfigError, match="named_rows"):
        FederatedRun(cqa_config(tmp_path, federated__aggregation="named_rows", federated__dp__noise_multiplier="1.0",
                                federated__dp__enabled="true"), None)
    with pytest.raises(ConfigError, match="records the rows"):
        FederatedRun(make_small_config("fede", federated__aggregation="named_rows"), None)


# ---------------------------------------------------------------- every entity at every client
def test_client_entities_all_gives_every_client_every_row_and_the_same_queries(tmp_path):
    """``data.client_entities=all`` (the FedCQA code's setup): each client holds its own triples
    in global ids with a table of every entity; its query sets are the ``own`` sets mapped to
    global ids, one query at a time, read from the same cache files; a run trains with every
    row at every client."""
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.methods.fedcqa.queries import anchors_and_relations
    from lightning_fedkg.methods.fedcqa.query_sets import graph_query_sets

    own_cfg, all_cfg = cqa_config(tmp_path), cqa_config(tmp_path, data__client_entities="all")
    own, wide = load_federated_kg(own_cfg), load_federated_kg(all_cfg)
    n = own.num_entities
    assert any(kg.num_entities < n for kg in own.clients)  # some client lacks some entity
    settings, cache = query_settings(own_cfg.task), tmp_path / "queries"
    for k, (kg, big) in enumerate(zip(own.clients, wide.clients)):
        assert big.num_entities == n and torch.equal(wide.entity_index[k], torch.arange(n))
        for split in kg.split_names:  # entities in global ids, relations the client's own
            g, t = own.global_triples(k, split), kg.triples(split)
            assert torch.equal(big.triples(split), torch.stack([g[:, 0], t[:, 1], g[:, 2]], 1))
        sets = graph_query_sets(kg, settings, 3, cache)
        files = sorted(cache.iterdir())
        mapped = graph_query_sets(big, settings, 3, cache)
        assert sorted(cache.iterdir()) == files  # the same keys: read, not sampled anew
        ent = own.entity_index[k].tolist()
        for split, by_type in sets.items():
            for name, qs in by_type.items():
                wqs = mapped[split][name]
                anchors, relations = anchors_and_relations(STRUCTURES[name])
                assert len(wqs) == len(qs)
                for i in range(len(qs)):
                    q, w = qs.queries[i].tolist(), wqs.queries[i].tolist()
                    assert [w[s] for s in anchors] == [ent[q[s]] for s in anchors]
                    assert [w[s] for s in relations] == [q[s] for s in relations]
                    assert wqs.hard(i).tolist() == [ent[e] for e in qs.hard(i).tolist()]
                    assert wqs.easy(i).tolist() == [ent[e] for e in qs.easy(i).tolist()]
    run = FederatedRun(all_cfg, None)
    run.align()
    assert all(party.module.encoder.entity_emb.shape[0] == n for party in run.clients)
    run.train_round(1)
    tables = [party.module.encoder.entity_emb.detach().clone() for party in run.clients]
    run.evaluate("valid", 1)  # the download: every client takes the mean of every row
    held = [party.module.encoder.entity_emb.detach() for party in run.clients]
    assert all(torch.equal(h, held[0]) for h in held)
    assert torch.allclose(held[0], torch.stack(tables).double().mean(0).float(), atol=1e-6)
    run.close()


def test_client_entities_all_is_refused_where_clients_load_their_own_entities(tmp_path):
    from lightning_fedkg.backends.flower.data import write_client_folders
    from lightning_fedkg.methods.fkge.federation import FKGE

    with pytest.raises(ConfigError, match="client_entities"):
        write_client_folders(cqa_config(tmp_path, data__client_entities="all"), tmp_path / "flower")
    with pytest.raises(ConfigError, match="client_entities"):
        FKGE.sources(make_small_config("fkge", data__client_entities="all"))
