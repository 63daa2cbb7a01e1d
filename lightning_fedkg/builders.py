"""Build the parts of a KGE learner from a config: its module, datamodule and Trainer arguments.

Shared by the single-KG runner (:mod:`lightning_fedkg.training`), the federated parties
(:mod:`lightning_fedkg.federated`) and the methods, so that one config key means the same
thing everywhere.
"""

from __future__ import annotations

from lightning_fedkg.config import ExperimentConfig, TrainerConfig
from lightning_fedkg.data import KGDataModule, KnowledgeGraph
from lightning_fedkg.models import KGEModule

__all__ = ["trainer_kwargs", "datamodule_kwargs", "build_datamodule", "build_module"]


def trainer_kwargs(trainer: TrainerConfig) -> dict:
    """The ``lightning.Trainer`` arguments every Trainer of a run shares (``cfg.trainer``)."""
    return dict(
        accelerator=trainer.accelerator,
        devices=trainer.devices,
        precision=trainer.precision,
        deterministic=trainer.deterministic,
        enable_model_summary=False,
    )


def datamodule_kwargs(cfg: ExperimentConfig) -> dict:
    """The :class:`KGDataModule` arguments of ``cfg.train`` (sampling and evaluation), no seed."""
    t = cfg.train
    return dict(
        batch_size=t.batch_size,
        num_negatives=t.num_negatives,
        corruption=t.corruption,
        negative_sampler=t.negative_sampler,
        negative_mode=t.negative_mode,
        filter_negatives=t.filter_negatives,
        subsampling=t.subsampling,
        fixed_negatives=t.fixed_negatives,
        eval_batch_size=t.eval_batch_size,
        eval_sides=t.eval_sides,
        valid_filter=t.valid_filter,
        batches_per_step=t.batches_per_step,
    )


def build_datamodule(kg: KnowledgeGraph, cfg: ExperimentConfig, seed: int, **overrides) -> KGDataModule:
    """A :class:`KGDataModule` for ``kg`` with the sampling/evaluation settings of ``cfg.train``."""
    kwargs = datamodule_kwargs(cfg)
    kwargs["seed"] = seed
    kwargs.update(overrides)
    return KGDataModule(kg, **kwargs)


def build_module(cfg: ExperimentConfig, num_entities: int, num_relations: int,
                 module_class: type[KGEModule] = KGEModule, **extra) -> KGEModule:
    """A :class:`KGEModule` (or ``module_class``, a subclass that takes the ``extra`` keyword
    arguments too) with the model and optimisation settings of ``cfg`` (and its training
    loss compiled when ``trainer.compile`` is set)."""
    m, t = cfg.model, cfg.train
    module = module_class(
        model=m.name,
        num_entities=num_entities,
        num_relations=num_relations,
        dim=m.dim,
        gamma=m.gamma,
        epsilon=m.epsilon,
        lr=t.lr,
        loss=t.loss,
        adversarial_temperature=t.adversarial_temperature,
        margin=t.margin,
        regularization=t.regularization,
        ties=t.ties,
        reset_optimizer=t.reset_optimizer,
        eval_chunk_size=t.eval_chunk_size,
        model_kwargs=m.options(),
        **extra,
    )
    module.compile_training = cfg.trainer.compile
    return module
