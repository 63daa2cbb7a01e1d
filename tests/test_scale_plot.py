"""``scripts/benchmarks/bench_scale.py --plot``: the curves it draws are the recorded JSON's rows,
per optimizer, ordered by entity count, with the reference folder's batch as the dashed line."""

import json

import pytest

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)


def _row(optimizer, s, entities=None, **extra):
    row = {"optimizer": optimizer, "s_per_batch": s, "round_s_extrapolated": 10 * s, "peak_rss_mib": 100 * s,
           **extra}
    if entities is not None:
        row["entities"] = entities
    return row


def test_series_are_the_rows_of_each_optimizer_in_entity_order(load_script):
    report = {"settings": {"clients": 3},
              "rows": [_row("adam", 2.0, 1_000_000), _row("adam", 0.5, 10_000), _row("sparse_adam", 0.01, 10_000),
                       _row("sparse_adam", 0.3, 1_000_000, error="timeout"), _row("sparse_adam", 0.02, 1_000_000),
                       _row("sparse_adam", 0.004), _row("adam", 0.7)]}
    curves = load_script("benchmarks/bench_scale.py").series([("run", report)])
    assert [c["label"] for c in curves] == ["adam, 3 clients (run)", "sparse_adam, 3 clients (run)"]
    adam, sparse = curves
    assert adam["entities"] == [10_000, 1_000_000] and adam["s_per_batch"] == [0.5, 2.0]
    assert adam["round_s"] == [5.0, 20.0] and adam["peak_rss_mib"] == [50.0, 200.0]
    assert adam["reference_s_per_batch"] == 0.7
    # the failed run is not drawn; the reference row is the dashed line, not a point
    assert sparse["entities"] == [10_000, 1_000_000] and sparse["s_per_batch"] == [0.01, 0.02]
    assert sparse["reference_s_per_batch"] == 0.004


def test_the_committed_curves_are_drawn_from_the_committed_json(tmp_path, load_script):
    pytest.importorskip("matplotlib")
    module = load_script("benchmarks/bench_scale.py")
    path = REPO / "docs" / "results" / "scale" / "scale.json"
    report = json.loads(path.read_text())
    curves = module.series([("scale", report)])
    sparse = next(c for c in curves if c["label"].startswith("sparse_adam"))
    assert sparse["entities"] == [10_000, 100_000, 1_000_000]
    assert sparse["s_per_batch"] == [r["s_per_batch"] for r in report["rows"]
                                     if r["optimizer"] == "sparse_adam" and r.get("entities")]
    out = tmp_path / "curves.png"
    assert module.main(["--plot", str(path), "--plot-out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
