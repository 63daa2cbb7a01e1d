"""``scripts/benchmarks/bench_fkge.py --merge``: seeds of one FKGE experiment run in separate calls
become one report whose summaries and controls are those of all the runs together; files of
another experiment, a seed twice, or another pre-training are refused."""

import json

import pytest


def _run(after_mrr: float, before_mrr: float = 0.25, schedule=(("a", 1, "b"),), before_accuracy=0.7) -> dict:
    kg = {"name": "kg0", "model": "transe",
          "before": {"accuracy": before_accuracy, "mrr": before_mrr, "hits@10": 0.4},
          "after": {"accuracy": 0.7, "mrr": after_mrr, "hits@10": 0.4}}
    return {"kgs": [kg], "schedule": [list(s) for s in schedule], "handshakes": 1, "accepted": 1,
            "seconds_ppat": [0.1], "seconds_update": [1.0], "translation_cosine": [0.2], "mismatched_cosine": [0.0],
            "heldout_cosine": [0.1], "heldout_hits1": [0.01], "heldout_hits10": [0.02], "bytes_per_ppat_batch": 10,
            "max_epsilon": 4.0, "generator_moved": [], "bytes_sent": 100, "wall_seconds": 5.0,
            "engine_wall_seconds": 4.0}


def _report(seeds, runs, overrides=("x=1",)) -> dict:
    return {"machine": "m", "python": "3.11", "config": "c.yaml", "seeds": list(seeds), "threads": 1,
            "overrides": list(overrides), "pretrain": None, "runs": runs}


def _write(tmp_path, name, report):
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return str(path)


def test_merged_seeds_summarize_as_one_run_would(tmp_path, load_script):
    module = load_script("benchmarks/bench_fkge.py")
    a = _write(tmp_path, "a.json", _report([0, 1], {"sup": [_run(0.30), _run(0.26)],
                                                    "random_sup": [_run(0.27), _run(0.27)]}))
    # triple classification draws its negatives by seed: its accuracy before may differ
    b = _write(tmp_path, "b.json", _report([2], {"sup": [_run(0.29, before_accuracy=0.71)], "random_sup": [_run(0.30)],
                                                 "exact": [_run(0.31)]}))
    merged = module.merge([a, b])
    assert merged["seeds"] == [0, 1, 2]
    assert merged["variant_seeds"] == {"sup": [0, 1, 2], "random_sup": [0, 1, 2], "exact": [2]}
    sup = next(s for s in merged["summaries"] if s["variant"] == "sup")
    assert sup["seeds"] == 3
    assert sup["kgs"]["kg0"]["after"]["mrr"]["mean"] == pytest.approx((0.30 + 0.26 + 0.29) / 3)
    per_seed = merged["versus_control"]["sup - random_sup"]["per_seed"]["mrr"]
    assert per_seed == pytest.approx([0.03, -0.01, -0.01])


def test_merge_refuses_another_experiment_a_repeated_seed_or_another_pretraining(tmp_path, load_script):
    module = load_script("benchmarks/bench_fkge.py")
    a = _write(tmp_path, "a.json", _report([0], {"sup": [_run(0.30)]}))
    other = _write(tmp_path, "o.json", _report([1], {"sup": [_run(0.30)]}, overrides=("x=2",)))
    again = _write(tmp_path, "g.json", _report([0], {"sup": [_run(0.31)]}))
    pretrained = _write(tmp_path, "p.json", _report([1], {"sup": [_run(0.30, before_mrr=0.2)]}))
    with pytest.raises(SystemExit, match="overrides"):
        module.merge([a, other])
    with pytest.raises(SystemExit, match=r"seeds \[0\]"):
        module.merge([a, again])
    with pytest.raises(SystemExit, match="not the same pre-training"):
        module.merge([a, pretrained])


def test_the_table_keeps_long_variant_and_kg_names_apart(load_script):
    """The old fixed 11-character column printed ``control_sup4_averagek-237-src0``: the variant
    ran into a KG name cut to its last 10 characters."""
    module = load_script("benchmarks/bench_fkge.py")
    block = {key: {"mean": 0.5} for key in ("accuracy", "mrr", "hits@10")}
    summaries = [{"variant": "control_sup4_average", "seeds": 1, "handshakes": 6.0, "accepted": 3.0,
                  "seconds_ppat": 0.1, "seconds_update": 1.0, "bytes_per_handshake": 10.0, "generator_moved": 0.0,
                  "translation_cosine": 0.3, "mismatched_cosine": 0.0, "max_epsilon": None, "wall_seconds": 5.0,
                  "gain": {"mrr": 0.0, "hits@10": 0.0, "accuracy": 0.0},
                  "kgs": {"FB15k-237-src0": {"before": block, "after": block, "gain_mrr": 0.0}}}]
    rows = module.table(summaries).splitlines()
    assert rows[2].split()[:2] == ["control_sup4_average", "FB15k-237-src0"]
    second = rows.index("") + 3
    assert rows[second].split()[:2] == ["control_sup4_average", "1"]
