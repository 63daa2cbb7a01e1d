"""Data layer: knowledge graphs (files and PyG datasets in and out), federated splits,
negative samplers and the Lightning data module."""

from .datamodule import FilterIndex, KGDataModule, LoaderSettings
from .sampling import BernoulliSampler, NegativeSampler, UniformSampler, bernoulli_head_probability
from .federated import FederatedKG
from .federated_io import load_federated, load_federated_folder, load_fedlu_folder, write_fedlu_folder
from .partition import (
    PARTITIONERS,
    partition_by_clusters,
    partition_by_relation,
    partition_randomly,
    relation_cooccurrence,
    resample_split,
)
from .kg import KGFormatError, KnowledgeGraph, clean_splits, triple_keys, unique_triples
from .kg_io import BUNDLED_DATASETS, load_openke, load_triples_folder
from .loading import load_kg
from .pyg import UMLS, KGDataset, Kinship, Nations, kg_from_pyg, kg_to_pyg, load_pyg, save_kg_dataset

__all__ = [
    "BUNDLED_DATASETS",
    "BernoulliSampler",
    "FederatedKG",
    "FilterIndex",
    "KGDataModule",
    "KGDataset",
    "KGFormatError",
    "Kinship",
    "KnowledgeGraph",
    "LoaderSettings",
    "Nations",
    "NegativeSampler",
    "PARTITIONERS",
    "UMLS",
    "UniformSampler",
    "bernoulli_head_probability",
    "clean_splits",
    "kg_from_pyg",
    "kg_to_pyg",
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
    "save_kg_dataset",
    "triple_keys",
    "unique_triples",
    "write_fedlu_folder",
]
