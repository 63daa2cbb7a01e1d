"""The ``model`` and ``train`` config sections: defaults that agree with the classes they
configure, and every option reaching the built module."""

import inspect
from pathlib import Path

import pytest

from lightning_fedkg.config import ConfigError, TrainConfig, config_from_yaml_text, file_layers, load_config

REPO = Path(__file__).resolve().parents[1]
UMLS_QUICK_START = [REPO / "configs" / s / f"umls_{s}.yaml" for s in ("fede", "single", "entire", "fedr")]


def test_reset_optimizer_default_agrees_with_kge_module():
    from lightning_fedkg.models import KGEModule
    from lightning_fedkg.builders import build_module

    module_default = inspect.signature(KGEModule).parameters["reset_optimizer"].default
    assert TrainConfig().reset_optimizer is True and module_default is True
    module = build_module(load_config(), num_entities=5, num_relations=2)
    assert module.hparams.reset_optimizer is True


@pytest.mark.parametrize("path", UMLS_QUICK_START, ids=lambda p: p.name)
def test_umls_quick_start_configs_share_one_optimizer_policy(path):
    # They take the default rather than each stating its own (nor does the base they share,
    # configs/base/umls.yaml), so they cannot drift apart.
    assert all("reset_optimizer" not in (layer.get("train") or {}) for layer, _ in file_layers(path))
    assert load_config(path).train.reset_optimizer is True


# ---------------------------------------------------------------------------- model / train options
def build(*overrides, num_entities=6, num_relations=3):
    from lightning_fedkg.builders import build_module

    return build_module(load_config(None, list(overrides)), num_entities, num_relations)


def test_model_options_reach_the_model():
    transr = build("model.name=transr", "model.dim=4", "model.relation_dim=3", "model.p_norm=2").model
    assert transr.relation_emb.shape == (3, 3) and transr.relation_matrix.shape == (3, 3 * 4)
    assert transr.p_norm == 2.0
    transd = build("model.name=transd", "model.dim=4", "model.relation_dim=5").model
    assert transd.entity_proj.shape == (6, 4) and transd.relation_proj.shape == (3, 5)
    transh = build("model.name=transh", "model.orthogonality_margin=0.25").model
    assert transh.orthogonality_margin == 0.25
    # null keeps each model's own default
    default = build("model.name=transh").model
    assert default.p_norm == 1.0 and default.orthogonality_margin == 1e-3


def test_p_norm_changes_the_score():
    import torch

    module = build("model.name=transe", "model.dim=2", "model.p_norm=2")
    with torch.no_grad():
        module.model.entity_emb.copy_(torch.tensor([[0.0, 0.0], [3.0, 4.0]]).repeat(3, 1))
        module.model.relation_emb.zero_()
    # gamma - ||e0 + 0 - e1||_2 = 10 - 5 (it would be 10 - 7 with the default L1)
    score = module.model(torch.tensor([0]), torch.tensor([0]), torch.tensor([1]))
    assert score.item() == pytest.approx(5.0)


def test_train_options_reach_the_module():
    import torch

    module = build("train.loss=margin", "train.margin=3.5", "train.eval_chunk_size=2")
    assert module.hparams.margin == 3.5 and module.hparams.eval_chunk_size == 2
    # the margin enters the loss: max(0, 3.5 - 1 + 0) = 2.5
    from lightning_fedkg.models.kge_module import kge_loss

    loss = kge_loss(torch.tensor([1.0]), torch.tensor([[0.0]]), module.hparams.loss, margin=module.hparams.margin)
    assert loss.item() == pytest.approx(2.5)
    assert build().hparams.eval_chunk_size is None and build().hparams.margin == 1.0


def test_eval_chunk_size_bounds_the_scored_queries():
    import torch

    module = build("model.dim=4", "train.eval_chunk_size=2")
    sizes = []
    score_tails = module.model.score_tails

    def spy(h, r, candidates=None):
        sizes.append(len(h))
        return score_tails(h, r, candidates)

    module.model.score_tails = spy
    empty = torch.zeros(0, dtype=torch.long)
    triples = torch.tensor([[0, 0, 1], [1, 1, 2], [2, 2, 3], [3, 0, 4], [4, 1, 5]])
    module.rank_batch({"triples": triples, "mode": "tail", "filter_row": empty, "filter_col": empty})
    assert sizes == [2, 2, 1]


def test_unknown_model_or_loss_lists_the_valid_names():
    with pytest.raises(ConfigError, match=r"model\.name: unknown KGE model 'transx'; valid: complex, distmult, "
                                          r"rotate, transd, transe, transh, transr"):
        load_config(None, ["model.name=transx"])
    with pytest.raises(ConfigError, match=r"train\.loss: unknown loss 'hinge'; valid: self_adversarial, uniform, margin"):
        load_config(None, ["train.loss=hinge"])
    # the same check guards a config.yaml read back when resuming
    text = "model:\n  name: transx\n"
    with pytest.raises(ConfigError, match="unknown KGE model"):
        config_from_yaml_text(text)


def test_option_the_model_does_not_take_is_an_error():
    with pytest.raises(ConfigError, match=r"model\.relation_dim: KGE model 'transe' does not take relation_dim "
                                          r"\(its options: p_norm\)"):
        load_config(None, ["model.relation_dim=3"])
    with pytest.raises(ConfigError, match=r"model\.p_norm: KGE model 'rotate' .*its options: none"):
        load_config(None, ["model.name=rotate", "model.p_norm=2"])
    # build_model says the same without the config layer
    from lightning_fedkg.models import build_model

    with pytest.raises(ValueError, match="does not take orthogonality_margin"):
        build_model("transr", 3, 1, 2, orthogonality_margin=0.1)


def test_model_named_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_kge.py").write_text(
        "from lightning_fedkg.models.kge import TransE\n"
        "class Scaled(TransE):\n"
        "    def __init__(self, *args, scale: float = 1.0, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        "        self.scale = scale\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = build("model.name=my_kge:Scaled", "model.p_norm=2")
    assert type(module.model).__name__ == "Scaled" and module.model.p_norm == 2.0
    with pytest.raises(ConfigError, match="not a subclass of KGEModel"):
        load_config(None, ["model.name=collections:OrderedDict"])


def test_a_user_models_own_option_is_a_typed_config_key(tmp_path, monkeypatch):
    (tmp_path / "my_kge_options.py").write_text(
        "from lightning_fedkg.models.kge import TransE\n"
        "class Scaled(TransE):\n"
        "    def __init__(self, num_entities, num_relations, dim, gamma=10.0, epsilon=2.0, p_norm=1.0,\n"
        "                 scale: float = 1.0):\n"
        "        super().__init__(num_entities, num_relations, dim, gamma, epsilon, p_norm=p_norm)\n"
        "        self.scale = scale\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["model.name=my_kge_options:Scaled", "model.scale=3"])
    assert cfg.model.scale == 3.0 and cfg.model.options() == {"scale": 3.0}
    assert load_config(None, ["model.name=my_kge_options:Scaled"]).model.scale is None  # the model's default
    module = build("model.name=my_kge_options:Scaled", "model.scale=3")
    assert module.model.scale == 3.0
    with pytest.raises(ConfigError, match=r"model\.scale"):
        load_config(None, ["model.name=my_kge_options:Scaled", "model.scale=big"])
    with pytest.raises(ConfigError, match=r"unknown config key 'model\.scale'"):
        load_config(None, ["model.scale=3"])  # TransE has no such option


def test_registry_is_dict_like():
    from lightning_fedkg.models import MODELS, TransR

    assert MODELS["transr"] is TransR and MODELS["TransR"] is TransR
    assert list(MODELS) == ["complex", "distmult", "rotate", "transd", "transe", "transh", "transr"]  # sorted
    assert "rotate" in MODELS and "transx" not in MODELS and len(MODELS) == 7
