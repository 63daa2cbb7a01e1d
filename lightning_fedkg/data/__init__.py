"""Data layer: knowledge graphs, federated splits, negative samplers and the Lightning data module."""

from .datamodule import FilterIndex, KGDataModule, LoaderSettings
from .sampling import BernoulliSampler, NegativeSampler, UniformSampler, bernoulli_head_probability
from .federated import (
    FederatedKG,
    load_federated,
    load_federated_folder,
    load_fedlu_folder,
    partition_by_clusters,
    partition_by_relation,
    partition_randomly,
    relation_cooccurrence,
    resample_split,
    write_fedlu_folder,
)
from .kg import (
    BUNDLED_DATASETS,
    KGFormatError,
    KnowledgeGraph,
    clean_splits,
    load_kg,
    load_openke,
    load_pyg,
    load_triples_folder,
    triple_keys,
    unique_triples,
)

__all__ = [
    "BUNDLED_DATASETS",
    "BernoulliSampler",
    "FederatedKG",
    "FilterIndex",
    "KGDataModule",
    "KGFormatError",
    "KnowledgeGraph",
    "LoaderSettings",
    "NegativeSampler",
    "UniformSampler",
    "bernoulli_head_probability",
    "clean_splits",
    "load_federated",
    "load_federated_folder",
    "load_fedlu_folder",
    "load_kg",
    "load_openke",
    "load_pyg",
    "load_triples_folder",
    "partition_by_clusters",
    "partition_by_relation",
    "partition_randomly",
    "relation_cooccurrence",
    "resample_split",
    "triple_keys",
    "unique_triples",
    "write_fedlu_folder",
]
