"""A federated run in which one client's valid split is emptied by the input policy."""

import json
import math
from pathlib import Path

import pytest

from lightning_fedkg.config import load_config

UMLS = Path(__file__).resolve().parents[1] / "lightning_fedkg" / "data" / "bundled" / "umls"


def write_clients(root: Path) -> None:
    """UMLS split by relation into 3 client folders; client 1's valid heads are all renamed
    to entities no train split mentions, so loading drops every one of them."""
    lines = {s: (UMLS / f"{s}.txt").read_text().splitlines() for s in ("train", "valid", "test")}
    relations = sorted({line.split("\t")[1] for line in lines["train"]})
    for c in range(3):
        folder = root / f"client_{c}"
        folder.mkdir(parents=True)
        mine = set(relations[c::3])
        for split, split_lines in lines.items():
            rows = [line.split("\t") for line in split_lines if line.split("\t")[1] in mine]
            if c == 1 and split == "valid":
                rows = [[f"unseen_{i}", r, t] for i, (_, r, t) in enumerate(rows)]
            (folder / f"{split}.tsv").write_text("".join("\t".join(row) + "\n" for row in rows))


@pytest.mark.parametrize("strategy", ["fede", "single"])
@pytest.mark.slow
def test_federated_run_with_an_empty_valid_split(tmp_path, strategy, one_thread):
    from lightning_fedkg.run import fit

    write_clients(tmp_path / "kg")
    cfg = load_config(None, [
        f"data.name={tmp_path / 'kg'}", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
        "trainer.accelerator=cpu", "trainer.progress_bar=false", f"federated.strategy={strategy}",
        "federated.rounds=2", "federated.local_epochs=1", "federated.eval_every=1",
    ])
    metrics = fit(cfg, tmp_path / "run")
    # validation averaged over the two clients that have valid triples: a real number
    assert len(metrics["validation"]) == 2
    assert all(0 < v["mrr"] < 1 for v in metrics["validation"])
    # every client still has a test split and is tested
    assert all(c["count"] > 0 for c in metrics["clients"])
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["rounds"] == 2
    assert not math.isnan(metrics["test"]["mrr"])


def test_single_kg_run_with_an_empty_valid_split_is_a_clear_error(tmp_path):
    from lightning_fedkg.config import ConfigError
    from lightning_fedkg.training import run_kge

    write_clients(tmp_path)
    cfg = load_config(None, [f"data.name={tmp_path / 'client_1'}", "model.dim=8", "train.max_epochs=1",
                             "trainer.accelerator=cpu", "trainer.progress_bar=false"])
    with pytest.raises(ConfigError, match="valid split is empty"):
        run_kge(cfg, tmp_path / "run")
