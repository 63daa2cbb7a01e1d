"""``scripts/benchmarks/bench_fedcqa.py retest``: a finished run evaluated again. With no overrides it
reproduces the run's own test figures exactly (same state, same query sets); with larger
test sets it evaluates the same best state on more queries; each run's result is saved
beside it and reused."""

import importlib.util
import json
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fedcqa", REPO / "scripts" / "benchmarks" / "bench_fedcqa.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_retest_reproduces_a_finished_run_then_evaluates_its_best_state_on_more_queries(bench, tmp_path, capsys):
    out, cache = tmp_path / "runs", tmp_path / "queries"
    small = [f"task.cache_dir={cache}", "task.train_per_type=300", "task.eval_per_type=30", "task.cross_per_type=20",
             "task.steps_per_epoch=3", "federated.rounds=2", "federated.eval_every=1", "model.dim=16",
             "trainer.threads=1"]
    bench.quality(Namespace(variants=["umls_fedcqa_gqe"], seeds=[0], out=str(out), json_out=None, overrides=small))
    run = out / "umls_fedcqa_gqe" / "seed0"
    trained = json.loads((run / "metrics.json").read_text())

    same = tmp_path / "same.json"
    bench.retest(Namespace(variants=["umls_fedcqa_gqe"], seeds=[0], out=str(out), tag="same", json_out=str(same),
                           overrides=[]))
    again = json.loads((run / "retest_same.json").read_text())
    assert again["round"] == trained["best_round"]
    for block in ("in_graph", "cross_graph"):
        assert again[block]["mrr"] == trained[block]["mrr"]
        assert again[block]["by_type"] == trained[block]["by_type"]
    summary = json.loads(same.read_text())["variants"]["umls_fedcqa_gqe"]
    assert summary["per_seed"][0]["in MRR"] == trained["in_graph"]["mrr"]

    bench.retest(Namespace(variants=["umls_fedcqa_gqe"], seeds=[0], out=str(out), tag="more", json_out=None,
                           overrides=["task.eval_per_type=60", "task.cross_per_type=40"]))
    more = json.loads((run / "retest_more.json").read_text())
    assert more["round"] == trained["best_round"]
    assert sum(v["queries"] for v in more["cross_graph"]["by_type"].values()) == \
        2 * sum(v["queries"] for v in trained["cross_graph"]["by_type"].values())
    assert sum(v["queries"] for v in more["in_graph"]["by_type"].values()) > \
        sum(v["queries"] for v in trained["in_graph"]["by_type"].values())
    # `fedkg test --from RUN key=value` is the same evaluation for one run
    from lightning_fedkg.cli import main

    capsys.readouterr()  # retest's printed tables
    assert main(["test", "--from", str(run), "--json", "task.eval_per_type=60", "task.cross_per_type=40"]) == 0
    cli = json.loads(capsys.readouterr().out)
    for block in ("in_graph", "cross_graph"):
        assert cli[block]["mrr"] == more[block]["mrr"] and cli[block]["by_type"] == more[block]["by_type"]
    # reused, not evaluated again: a cut-short batch resumes where it stopped
    (run / "retest_more.json").write_text(json.dumps({**more, "marker": 1}))
    bench.retest(Namespace(variants=["umls_fedcqa_gqe"], seeds=[0], out=str(out), tag="more", json_out=None,
                           overrides=["task.eval_per_type=60", "task.cross_per_type=40"]))
    assert json.loads((run / "retest_more.json").read_text())["marker"] == 1

    with pytest.raises(SystemExit, match="another --tag"):  # a tag names one set of overrides
        bench.retest(Namespace(variants=["umls_fedcqa_gqe"], seeds=[0], out=str(out), tag="more", json_out=None,
                               overrides=["task.eval_per_type=90"]))
    with pytest.raises(SystemExit, match="has not finished"):
        bench.retest(Namespace(variants=["umls_local_gqe"], seeds=[0], out=str(out), tag="x", json_out=None,
                               overrides=[]))
