"""Every published number is what the code prints today (issue 58).

* ``test_the_pages_are_rendered_from_the_results_json``: the marked blocks of README.md and
  docs/ equal what ``scripts/reproduce.py render`` makes of the committed JSONs (fast: no run);
* ``drift`` tests rerun what the numbers came from and compare: the README's quick-start
  table with what ``fedkg fit -c configs/fede/umls_fede.yaml`` prints, exactly, and seed 0
  of every quick-tier experiment with its JSON, to 1e-4 of test MRR (the runs are
  deterministic on the CPU, so this only absorbs the last printed digit). They take minutes:
  ``pytest -m drift tests/test_drift.py`` (CI runs them after the README's command). A change
  that moves a number regenerates the tier (``python scripts/reproduce.py run --tier quick``)
  and says so in its commit.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-4


def _reproduce():
    spec = importlib.util.spec_from_file_location("reproduce", REPO / "scripts" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pages_are_rendered_from_the_results_json():
    reproduce = _reproduce()
    differ = [p.relative_to(REPO) for p in reproduce.pages()
              if "<!-- reproduce:" in (text := p.read_text(encoding="utf-8")) and reproduce.render_text(text) != text]
    assert not differ, f"{differ} differ from the results JSON: run python scripts/reproduce.py render"


def test_the_readme_shows_the_quick_start_from_the_json():
    """The README's quick-start block is the printed table the quick tier recorded, and its
    sentence the tier's means (so the two checks above and below cover the whole chain)."""
    text = (REPO / "README.md").read_text()
    assert "<!-- reproduce:quick.printed.umls_fede -->" in text
    assert "<!-- reproduce:quick.umls_fede.mean -->" in text


@pytest.mark.drift
def test_the_quick_start_prints_the_readmes_table(tmp_path):
    reproduce = _reproduce()
    block = re.search(r"<!-- reproduce:quick\.printed\.umls_fede -->\n```\n(.*?)\n```\n",
                      (REPO / "README.md").read_text(), re.S).group(1)
    run = reproduce.run_one("configs/fede/umls_fede.yaml", 0, [], tmp_path / "quick_start", fresh=True)
    # the README's command gives no seed: seed 0 is the default, so the two are the same run
    assert run["printed"] == block


@pytest.mark.drift
@pytest.mark.parametrize("experiment", list(_reproduce().TIERS["quick"]["experiments"]))
def test_seed_0_of_each_quick_start_is_its_json(tmp_path, experiment):
    reproduce = _reproduce()
    recorded = json.loads((reproduce.RESULTS / "quick.json").read_text())["results"][experiment]
    config, overrides = reproduce.TIERS["quick"]["experiments"][experiment]
    run = reproduce.run_one(config, 0, overrides, tmp_path / experiment, fresh=True)
    (seed0,) = [r for r in recorded["runs"] if r["seed"] == 0]
    assert abs(run["test"]["mrr"] - seed0["test"]["mrr"]) <= TOLERANCE, (run["test"]["mrr"], seed0["test"]["mrr"])


def test_a_page_number_renders_from_a_json_pointer(tmp_path, monkeypatch):
    """``json:PATH#/pointer:FORMAT`` and the ratio of two (hand-checked values)."""
    reproduce = _reproduce()
    monkeypatch.setattr(reproduce, "REPO", tmp_path)
    (tmp_path / "r.json").write_text(json.dumps({"a": {"s": 419.1, "t": [67.9]}, "m": 0.74123}))
    assert reproduce.render_block("json:r.json#/a/s:.1f") == "419.1"
    assert reproduce.render_block("json:r.json#/m:m") == ".7412"
    assert reproduce.render_block("json:r.json#/a/s / r.json#/a/t/0:.1f") == "6.2"
    text = "x <!-- reproduce:json:r.json#/a/t/0:.1f -->?<!-- /reproduce:json:r.json#/a/t/0:.1f --> y"
    assert reproduce.render_text(text) == "x <!-- reproduce:json:r.json#/a/t/0:.1f -->67.9<!-- /reproduce:json:r.json#/a/t/0:.1f --> y"


def test_a_pointer_gathers_reduces_and_combines(tmp_path, monkeypatch):
    """``*``, the reductions, ``-`` element by element, a typed number, signed metrics and a
    page's named source (hand-checked values)."""
    reproduce = _reproduce()
    monkeypatch.setattr(reproduce, "REPO", tmp_path)
    runs = {"runs": [{"kgs": [{"a": 0.5, "b": 0.4}, {"a": 0.7, "b": 0.6}]},
                     {"kgs": [{"a": 0.5, "b": 0.6}, {"a": 0.7, "b": 0.7}]}],
            "by key": {"x - y": [0.02, -0.01, 0.03]}}
    (tmp_path / "r.json").write_text(json.dumps(runs))
    # per run: the mean over its kgs of a, minus that of b
    assert reproduce.pointer("mean(r.json#/runs/*/kgs/*/a) - mean(r.json#/runs/*/kgs/*/b):+m3") == "+.100 \u2212.050"
    assert reproduce.pointer("r.json#/runs/*/kgs/0/a:m3") == ".500 .500"
    assert reproduce.pointer("positive(r.json#/by%20key/x%20-%20y):d") == "2"
    assert reproduce.pointer("mean(r.json#/by%20key/x%20-%20y):+m") == "+.0133"
    assert reproduce.pointer("max(r.json#/by%20key/x%20-%20y) - 0.01:.2f") == "0.02"
    assert reproduce.pointer("7 / r.json#/runs/0/kgs/1/a:.1f") == "10.0"
    text = "<!-- reproduce-source: R = r.json -->\n<!-- reproduce:json:R#/runs/1/kgs/0/b:m -->?<!-- /reproduce:json:R#/runs/1/kgs/0/b:m -->"
    assert reproduce.render_text(text).endswith("-->.6000<!-- /reproduce:json:R#/runs/1/kgs/0/b:m -->")
    with pytest.raises(ValueError, match="needs a"):
        reproduce.pointer("mean(r.json#/runs/0/kgs/0/a)")


@pytest.mark.parametrize("name", list(_reproduce().LARGER_TIERS))
def test_a_larger_tier_names_what_exists(name):
    """Each larger tier's configs parse, its scripts and the JSONs it rewrites exist, and its
    cost adds up from those JSONs (so ``tiers`` lists what a user can run as written)."""
    from lightning_fedkg.config import load_config

    reproduce = _reproduce()
    tier = reproduce.LARGER_TIERS[name]
    for config in tier["configs"]:
        load_config(REPO / config)
    scripts = {word for command in tier["commands"] for word in command.split()
               if word.startswith("scripts/") and word.endswith((".py", ".sh"))}
    assert scripts, f"{name}: no script in its commands"
    missing = [path for path in [*scripts, *tier["writes"]] if not (REPO / path).is_file()]
    assert not missing, f"{name}: {missing} missing"
    cost = reproduce.tier_cost_s(tier)
    assert (cost is None and tier["cost_note"]) or cost > 60, (name, cost)
