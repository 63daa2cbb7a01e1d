"""Typed experiment configuration: dataclasses + omegaconf, YAML files and dotlist overrides.

* :mod:`~lightning_fedkg.config.schema`: the core sections as dataclasses, ranges and
  resume rules as field metadata;
* :mod:`~lightning_fedkg.config.sections`: the sections and model options the names a
  config gives add (a method's section is its ``methods/<name>/config.py``);
* :mod:`~lightning_fedkg.config.validation`: the checks, with errors that name the key,
  the file and its line;
* :mod:`~lightning_fedkg.config.loading`: YAML files, ``base:`` composition, overrides,
  moved-path hints; the entry point :func:`load_config`.

Everything is importable from here, ``from lightning_fedkg.config import load_config``.
The keys are listed in docs/usage.md.
"""

from .loading import (BASE_KEY, build_config, config_from_container, config_from_yaml_text, core_config,
                      file_layers, load_config, moved_hint, parse_yaml, resolve_auto_settings, save_config,
                      show_progress_bar)
from .schema import (LOSSES, MODEL_CORE_KEYS, MODEL_OPTION_KEYS, OPTIMIZERS, RELATION_PARTITIONS, SEED_RANGE,
                     ConfigError, DataConfig, DPConfig, ExperimentConfig, FederatedConfig, FlowerConfig,
                     ModelConfig, Range, SecureAggregationConfig, TrainConfig, TrainerConfig, too_many_clients)
from .sections import Section, experiment_class, model_option_fields, section_classes
from .validation import (PARTY_SECTIONS, RENAMED_KEYS, YamlSource, fingerprint_differences, party_config,
                         resume_differences, resume_fingerprint, trained_differences, validate_model_and_train,
                         validate_names, validate_ranges)

__all__ = [
    "ConfigError",
    "Range",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "TrainerConfig",
    "FederatedConfig",
    "SecureAggregationConfig",
    "DPConfig",
    "ExperimentConfig",
    "load_config",
    "build_config",
    "core_config",
    "experiment_class",
    "section_classes",
    "config_from_container",
    "resume_differences",
    "parse_yaml",
    "save_config",
    "config_from_yaml_text",
    "validate_model_and_train",
    "validate_names",
    "party_config",
    "validate_ranges",
    "resume_fingerprint",
    "fingerprint_differences",
    "show_progress_bar",
    "resolve_auto_settings",
]
