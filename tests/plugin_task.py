"""A task that is not KGE link prediction, from outside the package (``federated.task:
tests.plugin_task:RelationClassification``): each party classifies a triple's relation from
its two entities' rows with a small MLP, reports accuracy (its own metric and table column)
and has a ``task:`` config section of its own. Used by tests/test_task_plugin.py.

The entity rows are declared as the ``"entity"`` group, so FedE's holder-mean federates
them; the MLP stays private. Nothing here registers itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_fedkg.config import Range
from lightning_fedkg.federated.tasks import Task
from lightning_fedkg.models.shareable import InitSpec, SharedGroup

__all__ = ["RelationClassification", "RelationClassifier", "RelationTaskConfig"]

INIT = InitSpec("uniform", (-0.5, 0.5))


@dataclass
class RelationTaskConfig:
    """``task``: the classifier's hidden width."""

    hidden: int = field(default=32, metadata={"range": Range(min=1)})


class RelationClassifier(L.LightningModule):
    """``relation = MLP([e_h, e_t])``, trained with cross-entropy; not a KGE model."""

    def __init__(self, num_entities: int, num_relations: int, dim: int, hidden: int, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.entity_emb = nn.Parameter(INIT.draw(torch.rand(num_entities, dim)))
        self.mlp = nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, num_relations))
        self.results: dict[str, dict] = {}
        self._correct = self._total = 0

    def shareable_groups(self) -> dict[str, SharedGroup]:
        return {"entity": SharedGroup({"entity_emb": self.entity_emb}, "entity", {"entity_emb": INIT})}

    def forward(self, triples: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.entity_emb[triples[:, 0]], self.entity_emb[triples[:, 2]]], dim=1))

    def training_step(self, batch, batch_idx):
        (triples,) = batch
        loss = nn.functional.cross_entropy(self(triples), triples[:, 1])
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    def _count(self, batch) -> None:
        (triples,) = batch
        self._correct += int((self(triples).argmax(1) == triples[:, 1]).sum())
        self._total += int(triples.shape[0])

    def _close(self, split: str) -> None:
        accuracy = self._correct / max(self._total, 1)
        self.results[split] = {"accuracy": accuracy, "count": self._total}
        self.log(f"{split}/accuracy", accuracy)
        self._correct = self._total = 0

    def validation_step(self, batch, batch_idx):
        self._count(batch)

    def on_validation_epoch_end(self):
        self._close("val")

    def test_step(self, batch, batch_idx):
        self._count(batch)

    def on_test_epoch_end(self):
        self._close("test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class TripleBatches(L.LightningDataModule):
    """Shuffled training batches of a KG's triples (seeded), and its valid/test triples."""

    def __init__(self, kg, batch_size: int, seed: int) -> None:
        super().__init__()
        self.kg, self.batch_size = kg, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.num_train_batches = -(-kg.triples("train").shape[0] // batch_size)

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        return DataLoader(TensorDataset(self.kg.triples(split)), batch_size=self.batch_size, shuffle=shuffle,
                          generator=self.generator if shuffle else None)

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("valid")

    def test_dataloader(self):
        return self._loader("test")

    def state_dict(self):
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])


class RelationClassification(Task):
    """Relation classification: accuracy, weighted by evaluation triples."""

    name = "relation_classification"
    monitor = "accuracy"
    metric_keys = ("accuracy",)
    table_columns = (("ACC", "accuracy"),)
    config_class = RelationTaskConfig

    def build_module(self, cfg, kg):
        return RelationClassifier(kg.num_entities, kg.num_relations, cfg.model.dim, cfg.task.hidden, cfg.train.lr)

    def build_datamodule(self, cfg, kg, seed, party=None):
        return TripleBatches(kg, cfg.train.batch_size, seed)

    def evaluate(self, party, split):
        logged = party.run_evaluation(split)
        result = party.module.results[split]
        assert abs(logged[f"{split}/accuracy"] - result["accuracy"]) < 1e-6  # what Lightning logged
        return {**result, "triples": self.weight(party.kg, split)}

    def weight(self, kg, split):
        return int(kg.triples("valid" if split == "val" else split).shape[0])

    def train_size(self, kg):
        return int(kg.triples("train").shape[0])
