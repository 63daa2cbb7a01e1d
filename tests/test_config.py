"""Typed configs: defaults, YAML + dotlist merging, errors that name the valid keys."""

import dataclasses
from pathlib import Path

import pytest

from lightning_fedkg.config import (
    ConfigError,
    ExperimentConfig,
    Range,
    config_from_yaml_text,
    fingerprint_differences,
    load_config,
    resume_fingerprint,
    save_config,
    validate_ranges,
)

REPO = Path(__file__).resolve().parents[1]


def test_defaults_and_overrides():
    cfg = load_config(None, ["model.dim=64", "federated.strategy=fede", "train.lr=0.5"])
    assert isinstance(cfg, ExperimentConfig)
    assert (cfg.model.dim, cfg.federated.strategy, cfg.train.lr) == (64, "fede", 0.5)
    assert cfg.model.name == "transe" and cfg.data.name == "umls"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  name: rotate\n  dim: 32\ntrain:\n  lr: 0.1\n")
    cfg = load_config(path, ["model.dim=48"])
    assert (cfg.model.name, cfg.model.dim, cfg.train.lr) == ("rotate", 48, 0.1)


def test_unknown_key_lists_valid_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.dimm.*Valid keys here: dim, epsilon, gamma, name"):
        load_config(None, ["model.dimm=3"])
    path = tmp_path / "bad.yaml"
    path.write_text("trian:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'trian'.*Valid keys here: data, federated, model"):
        load_config(path)


def test_bad_values_are_rejected():
    with pytest.raises(ConfigError, match="model.name"):
        load_config(None, ["model.name=transx"])
    with pytest.raises(ConfigError, match="model.dim"):
        load_config(None, ["model.dim=abc"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["model.dim"])
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/config.yaml")


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.name=complex", "federated.rounds=7"])
    save_config(cfg, tmp_path / "config.yaml")
    assert config_from_yaml_text((tmp_path / "config.yaml").read_text()) == cfg


# configs/base/ holds the parts shipped configs build on (`base:`), checked through them
SHIPPED = sorted(p for p in (REPO / "configs").rglob("*.yaml") if p.parent.name != "base")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    load_config(path)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.dim=-5", "model.dim: -5 is out of range (must be >= 1)"),
        ("train.batch_size=0", "train.batch_size: 0 is out of range (must be >= 1)"),
        ("federated.fraction=1.5", "federated.fraction: 1.5 is out of range (must be in (0, 1])"),
        ("federated.fraction=0", "federated.fraction: 0.0 is out of range (must be in (0, 1])"),
        ("data.num_clients=0", "data.num_clients: 0 is out of range (must be >= 1)"),
        ("train.lr=-0.01", "train.lr: -0.01 is out of range (must be > 0)"),
        ("train.lr=nan", "train.lr: nan is out of range (must be > 0)"),
        ("federated.rounds=0", "federated.rounds: 0 is out of range (must be >= 1)"),
        ("seed=-1", "seed: -1 is out of range (must be in [0, 4294967295])"),
        ("trainer.threads=0", "trainer.threads: 0 is out of range (must be >= 1)"),
    ],
)
def test_out_of_range_values_are_rejected(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message


def test_every_violation_is_listed_and_boundaries_are_accepted():
    with pytest.raises(ConfigError, match=r"^train\.lr: .*; federated\.patience: 0 is out of range"):
        load_config(None, ["federated.patience=0", "train.lr=0"])
    cfg = load_config(None, ["federated.fraction=1", "train.regularization=0", "model.epsilon=0", "model.dim=1"])
    assert (cfg.federated.fraction, cfg.model.dim) == (1.0, 1)


def test_saved_config_is_range_checked_too():
    cfg = load_config(None)
    cfg.model.dim = 0
    with pytest.raises(ConfigError, match="model.dim"):
        validate_ranges(cfg)
    with pytest.raises(ConfigError, match="model.dim: 0 is out of range"):
        config_from_yaml_text("model:\n  dim: 0\n")


def _numeric_fields(node, prefix=""):
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from _numeric_fields(value, f"{prefix}{f.name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{f.name}", f


def test_every_numeric_field_declares_a_range_that_holds_its_default():
    # A new numeric field must say what it accepts; its default must be acceptable.
    found = dict(_numeric_fields(ExperimentConfig()))
    assert {"model.dim", "train.lr", "federated.fraction", "data.num_clients", "seed"} <= set(found)
    missing = [key for key, f in found.items() if not isinstance(f.metadata.get("range"), Range)]
    assert missing == []
    validate_ranges(ExperimentConfig())


def test_range_description_and_membership():
    half_open = Range(min=0, max=1, min_exclusive=True)
    assert half_open.describe() == "in (0, 1]"
    assert [half_open.contains(v) for v in (0.0, 1e-9, 1.0, 1.0001)] == [False, True, True, False]
    assert Range(min=1).describe() == ">= 1" and Range(max=2.5, max_exclusive=True).describe() == "< 2.5"
    assert not Range(min=0).contains(float("inf"))


def _leaf_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys |= _leaf_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return keys


def test_resume_fingerprint_leaves_out_exactly_the_resume_free_fields():
    # FedE's and FKGE's sections, and the unlearn phase's (a saved config.yaml may hold several).
    cfg = config_from_yaml_text("federated: {strategy: fede, fkge: {pretrain_epochs: 50}}", sections=("unlearn",))
    everything = _leaf_keys(dataclasses.asdict(cfg))
    kept = _leaf_keys(resume_fingerprint(cfg))
    assert everything - kept == {
        "name", "out_dir", "train.max_epochs", "train.batches_per_step",
        "trainer.devices", "trainer.progress_bar", "trainer.threads", "trainer.keep_on_device", "trainer.compile", "trainer.compile_cpu",
        "trainer.native_l1",
        "trainer.capture",
        "federated.rounds", "federated.patience", "federated.fede.fusion", "federated.fede.fusion_epochs",
        "federated.fede.fusion_lr", "federated.fede.fusion_margin", "federated.fede.fusion_negatives",
        "federated.max_retries", "federated.client_timeout", "federated.record_payloads",
        "federated.backend", "federated.clients", "federated.fkge.handshakes_per_kg", "federated.fkge.max_seconds",
    } | {f"federated.flower.{f.name}" for f in dataclasses.fields(cfg.federated.flower)} | {f"unlearn.{f.name}" for f in dataclasses.fields(cfg.unlearn)}  # a phase: its own resume point
    # Precision and accelerator change what a round computes: they stay.
    assert {"trainer.precision", "trainer.accelerator", "trainer.deterministic", "seed"} <= kept


def test_resume_fingerprint_compares_what_matters():
    base = load_config(None, ["federated.strategy=fede"])
    budget = load_config(None, ["federated.strategy=fede", "federated.rounds=7", "name=other",
                                "trainer.progress_bar=false", "federated.fede.fusion=true"])
    assert resume_fingerprint(base) == resume_fingerprint(budget)
    changed = load_config(None, ["federated.strategy=fede", "model.dim=32", "trainer.precision=bf16-mixed"])
    assert fingerprint_differences(resume_fingerprint(base), resume_fingerprint(changed)) == [
        "model.dim: 128 -> 32",
        "trainer.precision: '32-true' -> 'bf16-mixed'",
    ]


def test_fingerprint_differences_reports_keys_missing_on_one_side():
    assert fingerprint_differences({"a": {"x": 1}}, {"a": {"x": 1, "y": 2}}) == ["a.y: None -> 2"]
    assert fingerprint_differences({"a": 1}, {"a": 1}) == []


def test_resume_metadata_uses_one_spelling():
    def walk(node):
        for f in dataclasses.fields(node):
            yield f
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                yield from walk(value)

    assert {f.metadata["resume"] for f in walk(ExperimentConfig()) if "resume" in f.metadata} == {"free"}


@pytest.mark.parametrize("overrides, message", [
    (["federated.strategy=fedx"], "federated.strategy: unknown federated strategy 'fedx'; valid: entire, fedcqa, fedcqa_fede, fedcqa_fedr, fede, fedec, fedlu, fedprox, fedr, fkge, single "),
    (["federated.strategy=fede", "federated.task=nope"], "federated.task: unknown task 'nope'; valid: link_prediction"),
    (["federated.strategy=fede", "federated.parties.client_1.model.name=transx"],
     "federated.parties.client_1: model.name: unknown KGE model 'transx'"),
    (["federated.strategy=fede", "federated.parties.client_1.model.dimm=3"],
     "federated.parties.client_1: unknown config key 'model.dimm'. Valid keys here: dim"),
    (["federated.strategy=fede", "federated.parties.client_1.model.dim=-3"],
     "federated.parties.client_1: model.dim: -3 is out of range"),
    (["federated.strategy=fede", "federated.parties.client_1.trainer.threads=3"],
     r"federated.parties.client_1: only \['model', 'train'\] may differ per party"),
])
def test_federated_names_and_party_overrides_are_checked_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_party_override_is_merged_into_that_party_only():
    from lightning_fedkg.config import party_config

    cfg = load_config(None, ["federated.strategy=fede", "federated.parties.client_1.model.name=transh",
                             "federated.parties.client_1.train.lr=0.5"])
    assert party_config(cfg, "client_1").model.name == "transh" and party_config(cfg, "client_1").train.lr == 0.5
    assert party_config(cfg, "client_0") is cfg and cfg.model.name == "transe"


def test_a_setting_added_after_a_run_was_written_reads_as_its_default_on_resume():
    from lightning_fedkg.config import resume_differences, resume_fingerprint

    cfg = load_config(None, ["federated.strategy=fedlu"])
    old = resume_fingerprint(cfg)
    del old["federated"]["evaluate"], old["train"]["valid_filter"], old["federated"]["fedlu"]["early_stopping"]
    assert resume_differences(old, cfg) == []  # the defaults are the behaviour the run had
    changed = load_config(None, ["federated.strategy=fedlu", "federated.evaluate=before_aggregation",
                                 "train.valid_filter=without_unlearn"])
    assert resume_differences(old, changed) == ["federated.evaluate: 'aggregated' -> 'before_aggregation'",
                                                "train.valid_filter: 'all' -> 'without_unlearn'"]


def test_the_old_engine_key_is_refused_naming_backend(tmp_path, capsys):
    """``federated.engine`` became ``federated.backend`` (same values): a config or an
    override with the old key stops with a message that names the new one, exit 2 at the CLI."""
    from lightning_fedkg.cli import main

    assert load_config(None, ["federated.backend=ray"]).federated.backend == "ray"
    with pytest.raises(ConfigError, match=r"command line: config key 'federated.engine' is now "
                                          r"'federated.backend' \(same values\)"):
        load_config(None, ["federated.engine=ray"])
    old = tmp_path / "old.yaml"
    old.write_text("federated:\n  strategy: fkge\n  engine: local\n")
    with pytest.raises(ConfigError, match=f"{old}: config key 'federated.engine' is now 'federated.backend'"):
        load_config(old)
    assert main(["fit", "-c", str(old), "--out", str(tmp_path / "run")]) == 2
    assert "'federated.engine' is now 'federated.backend'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, where, key, kind", [
    ("data: 5\nmodel:\n  dim: 8\n", ":1:7", "data", "a single value (5)"),
    ("model:\n  dim: 8\ntrainer: [cpu]\n", ":3:10", "trainer", "a list"),
    ("data:\nmodel:\n  dim: 8\n", ":1:6", "data", "null"),
    ("federated:\n  strategy: fede\n  dp: true\n", ":3:7", "federated.dp", "a single value (True)"),
    ("federated:\n  strategy: fede\n  fede: 3\n", ":3:9", "federated.fede", "a single value (3)"),
], ids=["scalar", "list", "null", "nested", "method"])
def test_a_section_given_as_a_value_names_the_file_line_and_its_keys(tmp_path, text, where, key, kind):
    """The old message: "None: Merge error: int is not a subclass of DataConfig" (no key, no
    line); a method's section as a value was "unknown config key 'federated.fede'"."""
    from lightning_fedkg.registry import STRATEGIES

    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}{where}: {key} is a section") and f"not {kind}" in message, message
    fede_keys = sorted(f.name for f in dataclasses.fields(STRATEGIES.get("fede").config_class))
    section = {"data": "format, name, num_clients", "trainer": "accelerator, capture", "federated.dp": "clip",
               "federated.fede": ", ".join(fede_keys)}
    assert section[key] in message and "Merge error" not in message and "unknown config key" not in message
    # A run directory's config.yaml, read back from its text: the line is that text's.
    with pytest.raises(ConfigError, match=r"^elsewhere/config\.yaml" + where.replace(":", r"\:") + f": {key} is"):
        config_from_yaml_text(text, source="elsewhere/config.yaml")


@pytest.mark.parametrize("override, key", [("data=5", "data"), ("federated.dp=5", "federated.dp"),
                                           ("federated.parties=5", "federated.parties"),
                                           ("federated.parties.client_0=5", "federated.parties.client_0"),
                                           ("federated.parties.client_0.model=3", "federated.parties.client_0.model")])
def test_a_section_set_to_a_value_on_the_command_line_says_how_to_set_its_keys(override, key):
    """The old messages: "None: Merge error: int is not a subclass of DataConfig", "Cannot
    assign int to Dict[str, Any]", and for a party or its model a TypeError traceback."""
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "configs" / "fede" / "umls_fede.yaml", [override])
    message = str(err.value)
    assert message.startswith(f"command line: {key} is a section"), message
    assert f"set its keys as {key}.KEY=VALUE" in message and f"not {override}" in message
