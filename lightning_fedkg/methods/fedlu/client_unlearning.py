"""FedLU's client-side unlearning: retroactive interference, then passive decay.

Zhu et al., "Heterogeneous Federated Knowledge Graph Embedding Learning and Unlearning",
WWW 2023, §4.3. :class:`ClientUnlearner` runs ``interference_epochs`` over the forgetting
set (hard and soft confusion; for the avatar, distillation from the local side), then at
most ``decay_epochs`` of mutual distillation over the retained triples, stopping at the
first epoch whose local validation does not improve. ``official_updates`` picks the
official code's update counts. Relations stay frozen; filtered negatives count in no loss.
The losses and where they differ from the paper: docs/methods/fedlu.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.methods.fedlu.distillation import (DistillationModule, candidate_scores, distillation_kl,
                                                        distribution_logits)
from lightning_fedkg.models.kge import KGEModel
from lightning_fedkg.models.kge_module import KGEModule, batch_mean, kge_loss, negative_loss_term

__all__ = ["UnlearningSettings", "confusion_loss", "ClientUnlearner"]


@dataclass
class UnlearningSettings:
    """Weights and budgets of one client's unlearning (``cfg.unlearn``)."""

    interference_epochs: int = 10
    decay_epochs: int = 10
    forget_weight: float = 10.0
    mu_soft: float = 0.05
    mu_distill: float = 2.0
    lr: float = 1e-4
    official_updates: bool = False


#: The official code's decay steps per retained batch: (student, with distillation).
OFFICIAL_DECAY_STEPS = (("local", False), ("global", False), ("global", True), ("global", False), ("local", True))


def confusion_loss(positive: Tensor, negatives: Tensor, forget_weight: float, mu_soft: float,
                   loss: str = "uniform", adversarial_temperature: float = 1.0,
                   weight: Tensor | None = None, negative_mask: Tensor | None = None) -> Tensor:
    """Hard + soft confusion of forgotten triples (``positive`` ``[B]``) and their
    negatives (``[B, n]``): ``½ (w·mean −log σ(−S(u)) + mean ℓ_neg) + μ_soft·mean_B ‖S(negs) − S(u)‖₂``.

    ``weight`` (``[B]``, optional: the batch's subsampling weights) turns the two means of
    the hard term into weighted means, as the official code does; the soft term stays a
    plain mean there too. ``negative_mask`` (``[B, n]`` bool, optional) leaves out the
    negatives that are known true triples: they get no weight in ``ℓ_neg`` and no entry in
    the gap norm."""
    neg_loss = "uniform" if loss == "margin" else loss
    negative_term = negative_loss_term(negatives, neg_loss, adversarial_temperature, negative_mask=negative_mask)
    hard = 0.5 * (forget_weight * batch_mean(-F.logsigmoid(-positive), weight) + batch_mean(negative_term, weight))
    gap = negatives - positive.unsqueeze(1)
    if negative_mask is not None:
        gap = gap * negative_mask.to(gap.dtype)
    soft = gap.norm(dim=1).mean()
    return hard + mu_soft * soft


class ClientUnlearner:
    """Runs both unlearning steps on one client's module, in place.

    Args:
        module: a trained :class:`DistillationModule` (FedLU) or :class:`KGEModule` (FedE).
        settings: :class:`UnlearningSettings`.
    """

    def __init__(self, module: KGEModule, settings: UnlearningSettings) -> None:
        self.module = module
        self.settings = settings
        self.has_avatar = isinstance(module, DistillationModule)
        self.local_params = [getattr(module.model, n) for n in module.model.entity_parameter_names()]
        self.global_params = module.avatar_parameters() if self.has_avatar else []
        self._fresh_optimizers()

    def _fresh_optimizers(self) -> None:
        # Each step starts with fresh Adams: momentum of the interference would otherwise
        # keep pushing the retained knowledge away during the decay.
        self.local_opt = torch.optim.Adam(self.local_params, lr=self.settings.lr)
        self.global_opt = torch.optim.Adam(self.global_params, lr=self.settings.lr) if self.has_avatar else None

    # ------------------------------------------------------------------ steps
    def _sides(self, student: str) -> tuple[KGEModel, KGEModel | None, list, torch.optim.Optimizer]:
        m = self.module
        if student == "local":
            return m.model, (m.avatar if self.has_avatar else None), self.local_params, self.local_opt
        return m.avatar, m.model, self.global_params, self.global_opt

    def _step(self, loss: Tensor, params: list, optimizer: torch.optim.Optimizer) -> float:
        optimizer.zero_grad()
        # Only the student's entity tables get gradients: relations stay frozen.
        loss.backward(inputs=params)
        optimizer.step()
        return float(loss.detach())

    def _distillation(self, positive: Tensor, negatives: Tensor, teacher: KGEModel | None, batch: dict) -> Tensor:
        if teacher is None or self.settings.mu_distill == 0:
            return positive.new_zeros(())
        with torch.no_grad():
            t_pos, t_neg = candidate_scores(self.module, teacher, batch)
        mask = batch.get("negative_mask")
        return self.settings.mu_distill * distillation_kl(distribution_logits(positive, negatives, mask),
                                                          distribution_logits(t_pos, t_neg, mask))

    def interference_step(self, batch: dict, student: str = "local") -> float:
        """One step of hard + soft confusion; the avatar's also distils from the local side."""
        hp, s = self.module.hparams, self.settings
        model, teacher, params, opt = self._sides(student)
        positive, negatives = candidate_scores(self.module, model, batch)
        loss = confusion_loss(positive, negatives, s.forget_weight, s.mu_soft, hp.loss, hp.adversarial_temperature,
                              weight=batch.get("weight"), negative_mask=batch.get("negative_mask"))
        if student == "global":
            loss = loss + self._distillation(positive, negatives, teacher, batch)
        return self._step(loss, params, opt)

    def decay_step(self, batch: dict, student: str = "local", distill: bool = True) -> float:
        """One step of prediction loss on retained triples (+ distillation from the other
        side unless ``distill`` is False)."""
        hp = self.module.hparams
        model, teacher, params, opt = self._sides(student)
        positive, negatives = candidate_scores(self.module, model, batch)
        loss = kge_loss(positive, negatives, hp.loss, hp.adversarial_temperature, hp.margin,
                        negative_mask=batch.get("negative_mask"), weight=batch.get("weight"))
        if distill:
            loss = loss + self._distillation(positive, negatives, teacher, batch)
        return self._step(loss, params, opt)

    # ------------------------------------------------------------------ loops
    def _to_device(self, batch: dict) -> dict:
        device = self.module.device
        return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}

    def _batches(self, make: Callable[[], Iterable[dict | list[dict]]]) -> Iterable[dict]:
        # a train loader yields lists of batches under train.batches_per_step > 1
        return (self._to_device(batch) for item in make() for batch in KGEModule.step_batches(item))

    def interfere(self, forget_batches: Callable[[], Iterable[dict]]) -> None:
        """``interference_epochs`` epochs over the forget batches (see the module doc for
        the steps per batch under ``official_updates``)."""
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

    def _decay_epoch(self, retain_batches: Callable[[], Iterable[dict]]) -> None:
        for i, batch in enumerate(self._batches(retain_batches)):
            if not self.has_avatar:
                self.decay_step(batch, "local")
            elif self.settings.official_updates:
                for student, distill in OFFICIAL_DECAY_STEPS:
                    self.decay_step(batch, student, distill)
            else:
                self.decay_step(batch, "local" if i % 2 == 0 else "global")

    def decay(self, retain_batches: Callable[[], Iterable[dict]], validate: Callable[[], float]) -> list[float]:
        """Passive decay until local validation stops improving; returns the validation
        scores (first: before decay). The tables of the best epoch are kept."""
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
