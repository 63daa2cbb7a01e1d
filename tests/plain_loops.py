"""The plain torch loops that FedE's fusion fit and FedLU's client unlearning ran before they
became LightningModules fit by a Trainer (``FusionModule``, ``UnlearningModule``), kept
as the reference those modules reproduce bit for bit (tests/test_fusion.py,
tests/test_fusion_runner.py, tests/test_unlearning.py).

Only the loops are copied: the losses, samplers and layers are the library's own, so a
change to those changes both sides alike; what the comparison pins is the order of the
batches, steps, optimizer updates and random draws.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor, nn

from lightning_fedkg.methods.fede.fusion import (ScoreFusion, _frozen_scores, _model_device, fusion_loss,
                                                 sample_fusion_negatives)
from lightning_fedkg.methods.fedlu.client_unlearning import OFFICIAL_DECAY_STEPS, UnlearningSettings, confusion_loss
from lightning_fedkg.methods.fedlu.distillation import (DistillationModule, candidate_scores, distillation_kl,
                                                        distribution_logits)
from lightning_fedkg.models.kge_module import KGEModule, kge_loss


def plain_fit_fusion(single_model: nn.Module, fed_model: nn.Module, valid_triples: Tensor, num_entities: int, *,
                     num_negatives: int = 256, margin: float = 10.0, lr: float = 0.01, epochs: int = 500,
                     batch_size: int = 512, generator: torch.Generator | None = None,
                     score_chunk_size: int = 1024) -> ScoreFusion:
    """``fit_fusion`` as a plain loop: one Adam step per shuffled slice of the positives."""
    device = _model_device(single_model)
    triples = valid_triples.detach().to("cpu", torch.long)
    negatives = sample_fusion_negatives(triples, num_entities, num_negatives, generator=generator)
    h, r, t = triples.unbind(dim=1)
    single_pos, single_neg = _frozen_scores(single_model, h, r, t, negatives, score_chunk_size)
    fed_pos, fed_neg = _frozen_scores(fed_model, h, r, t, negatives, score_chunk_size)
    fed_pos, fed_neg = fed_pos.to(device), fed_neg.to(device)

    fusion = ScoreFusion(generator=generator).to(device)
    fusion.train()
    optimizer = torch.optim.Adam(fusion.parameters(), lr=lr)
    num_valid = triples.shape[0]
    history = torch.zeros(epochs, dtype=torch.float32, device=device)
    for epoch in range(epochs):
        order = torch.randperm(num_valid, generator=generator).to(device)
        total = torch.zeros((), device=device)
        for start in range(0, num_valid, batch_size):
            idx = order[start : start + batch_size]
            loss = fusion_loss(
                fusion(single_pos[idx], fed_pos[idx]),
                fusion(single_neg[idx], fed_neg[idx]),
                margin,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach() * idx.numel()
        history[epoch] = total / num_valid
    fusion.eval()
    fusion.loss_history = history.cpu()
    return fusion


class PlainClientUnlearner:
    """``ClientUnlearner`` as a plain loop: ``interfere`` and ``decay`` step the module's
    sides with their own Adams, batch by batch."""

    def __init__(self, module: KGEModule, settings: UnlearningSettings) -> None:
        self.module = module
        self.settings = settings
        self.has_avatar = isinstance(module, DistillationModule)
        self.local_params = [getattr(module.model, n) for n in module.model.entity_parameter_names()]
        self.global_params = module.avatar_parameters() if self.has_avatar else []
        self._fresh_optimizers()

    def _fresh_optimizers(self) -> None:
        self.local_opt = torch.optim.Adam(self.local_params, lr=self.settings.lr)
        self.global_opt = torch.optim.Adam(self.global_params, lr=self.settings.lr) if self.has_avatar else None

    def _sides(self, student: str):
        m = self.module
        if student == "local":
            return m.model, (m.avatar if self.has_avatar else None), self.local_params, self.local_opt
        return m.avatar, m.model, self.global_params, self.global_opt

    def _step(self, loss: Tensor, params: list, optimizer: torch.optim.Optimizer) -> float:
        optimizer.zero_grad()
        loss.backward(inputs=params)
        optimizer.step()
        return float(loss.detach())

    def _distillation(self, positive: Tensor, negatives: Tensor, teacher, batch: dict) -> Tensor:
        if teacher is None or self.settings.mu_distill == 0:
            return positive.new_zeros(())
        with torch.no_grad():
            t_pos, t_neg = candidate_scores(self.module, teacher, batch)
        mask = batch.get("negative_mask")
        return self.settings.mu_distill * distillation_kl(distribution_logits(positive, negatives, mask),
                                                          distribution_logits(t_pos, t_neg, mask))

    def interference_step(self, batch: dict, student: str = "local") -> float:
        hp, s = self.module.hparams, self.settings
        model, teacher, params, opt = self._sides(student)
        positive, negatives = candidate_scores(self.module, model, batch)
        loss = confusion_loss(positive, negatives, s.forget_weight, s.mu_soft, hp.loss, hp.adversarial_temperature,
                              weight=batch.get("weight"), negative_mask=batch.get("negative_mask"))
        if student == "global":
            loss = loss + self._distillation(positive, negatives, teacher, batch)
        return self._step(loss, params, opt)

    def decay_step(self, batch: dict, student: str = "local", distill: bool = True) -> float:
        hp = self.module.hparams
        model, teacher, params, opt = self._sides(student)
        positive, negatives = candidate_scores(self.module, model, batch)
        loss = kge_loss(positive, negatives, hp.loss, hp.adversarial_temperature, hp.margin,
                        negative_mask=batch.get("negative_mask"), weight=batch.get("weight"))
        if distill:
            loss = loss + self._distillation(positive, negatives, teacher, batch)
        return self._step(loss, params, opt)

    def _to_device(self, batch: dict) -> dict:
        device = self.module.device
        return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}

    def _batches(self, make: Callable[[], Iterable]) -> Iterable[dict]:
        return (self._to_device(batch) for item in make() for batch in KGEModule.step_batches(item))

    def interfere(self, forget_batches: Callable[[], Iterable]) -> None:
        self.module.train()
        for _ in range(self.settings.interference_epochs):
            if not self.settings.official_updates:
                for batch in self._batches(forget_batches):
                    self.interference_step(batch, "local")
                    if self.has_avatar:
                        self.interference_step(batch, "global")
                continue
            if self.has_avatar:
                for batch in self._batches(forget_batches):
                    self.interference_step(batch, "global")
            for batch in self._batches(forget_batches):
                self.interference_step(batch, "local")
            for batch in self._batches(forget_batches):
                if self.has_avatar:
                    self.interference_step(batch, "global")
                self.interference_step(batch, "local")

    def _decay_epoch(self, retain_batches: Callable[[], Iterable]) -> None:
        for i, batch in enumerate(self._batches(retain_batches)):
            if not self.has_avatar:
                self.decay_step(batch, "local")
            elif self.settings.official_updates:
                for student, distill in OFFICIAL_DECAY_STEPS:
                    self.decay_step(batch, student, distill)
            else:
                self.decay_step(batch, "local" if i % 2 == 0 else "global")

    def decay(self, retain_batches: Callable[[], Iterable], validate: Callable[[], float]) -> list[float]:
        self._fresh_optimizers()
        scores = [validate()]
        best = self._snapshot()
        for _ in range(self.settings.decay_epochs):
            self.module.train()
            self._decay_epoch(retain_batches)
            scores.append(validate())
            if not scores[-1] > max(scores[:-1]):
                self._restore(best)
                break
            best = self._snapshot()
        return scores

    def _snapshot(self) -> list[Tensor]:
        return [p.detach().clone() for p in self.local_params + self.global_params]

    @torch.no_grad()
    def _restore(self, snapshot: list[Tensor]) -> None:
        for p, saved in zip(self.local_params + self.global_params, snapshot):
            p.copy_(saved)


def plain_unlearn_client(party, forget: Tensor, cfg) -> list[float]:
    """The phase's ``unlearn_client`` with :class:`PlainClientUnlearner`: the same data
    modules and seeds, validation through the party."""
    from lightning_fedkg.builders import build_datamodule
    from lightning_fedkg.methods.fedlu.phase import _settings, _view
    from lightning_fedkg.seeding import derive_seed

    kg = party.kg
    retain = kg.triples("train")
    batch_size = cfg.unlearn.batch_size or cfg.train.batch_size
    seed = derive_seed(cfg.seed, party.name, "unlearn")
    forget_dm = build_datamodule(_view(kg, forget, {}), cfg, seed=seed, batch_size=batch_size)
    retain_dm = build_datamodule(_view(kg, retain, {}), cfg, seed=seed + 1, batch_size=batch_size)
    unlearner = PlainClientUnlearner(party.module, _settings(cfg.unlearn, cfg.train.lr))
    unlearner.interfere(forget_dm.train_dataloader)
    return unlearner.decay(retain_dm.train_dataloader, lambda: party.evaluate("val")["mrr"])
