"""Build the parts of a KGE learner from a config: its module, datamodule and Trainer arguments.

Shared by the single-KG runner (:mod:`lightning_fedkg.training`), the federated parties
(:mod:`lightning_fedkg.federated`) and the methods, so that one config key means the same
thing everywhere.
"""

from __future__ import annotations

from dataclasses import replace

from lightning_fedkg.config import ExperimentConfig, TrainerConfig
from lightning_fedkg.data import (BernoulliSampler, KGDataModule, KnowledgeGraph, LoaderSettings, NegativeSampler,
                                  UniformSampler)
from lightning_fedkg.models import KGEModule
from lightning_fedkg.models.kge.families import TranslationalModel

__all__ = ["trainer_kwargs", "negative_sampler", "datamodule_kwargs", "build_datamodule", "build_module"]


def trainer_kwargs(trainer: TrainerConfig) -> dict:
    """The ``lightning.Trainer`` arguments every Trainer of a run shares (``cfg.trainer``)."""
    return dict(
        accelerator=trainer.accelerator,
        devices=trainer.devices,
        precision=trainer.precision,
        deterministic=trainer.deterministic,
        enable_model_summary=False,
    )


def negative_sampler(cfg: ExperimentConfig) -> NegativeSampler:
    """The negative sampler ``cfg.train`` selects (``train.negative_sampler``)."""
    t = cfg.train
    common = dict(num_negatives=t.num_negatives, mode=t.negative_mode, filtered=t.filter_negatives)
    if t.negative_sampler == "bernoulli":
        return BernoulliSampler(**common)
    return UniformSampler(corruption=t.corruption, **common)


def datamodule_kwargs(cfg: ExperimentConfig) -> dict:
    """The :class:`KGDataModule` arguments of ``cfg.train`` (sampling and evaluation), no seed."""
    t = cfg.train
    loader = LoaderSettings(batch_size=t.batch_size, eval_batch_size=t.eval_batch_size, eval_sides=t.eval_sides,
                            subsampling=t.subsampling, fixed_negatives=t.fixed_negatives,
                            batches_per_step=t.batches_per_step)
    # train.valid_filter is a strategy's rule (Strategy.prepare_datamodule), not the datamodule's
    return dict(sampler=negative_sampler(cfg), loader=loader)


def build_datamodule(kg: KnowledgeGraph, cfg: ExperimentConfig, seed: int,
                     batch_size: int | None = None) -> KGDataModule:
    """A :class:`KGDataModule` for ``kg`` with the sampling/evaluation settings of ``cfg.train``
    (and another training ``batch_size`` if given)."""
    kwargs = datamodule_kwargs(cfg)
    if batch_size is not None:
        kwargs["loader"] = replace(kwargs["loader"], batch_size=batch_size)
    return KGDataModule(kg, seed=seed, **kwargs)


def build_module(cfg: ExperimentConfig, num_entities: int, num_relations: int,
                 module_class: type[KGEModule] = KGEModule, **extra) -> KGEModule:
    """A :class:`KGEModule` (or ``module_class``, a subclass that takes the ``extra`` keyword
    arguments too) with the model and optimisation settings of ``cfg`` (and its training
    loss compiled when ``trainer.compile`` is true, its Trans* L1 distances compiled on CUDA
    (and on a CPU with ``trainer.compile_cpu``) when it is unset, its step recorded per
    ``trainer.capture``)."""
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
        optimizer=t.optimizer,
        eval_candidates=t.eval_candidates,
        model_kwargs=m.options(),
        **extra,
    )
    module.compile_training = bool(cfg.trainer.compile)
    for model in module.modules():  # FedLU's avatar too
        if isinstance(model, TranslationalModel):
            model.compile_distances = cfg.trainer.compile
            model.compile_on_cpu = cfg.trainer.compile_cpu
            model.native_l1 = cfg.trainer.native_l1
    module.capture_steps = cfg.trainer.capture
    return module
