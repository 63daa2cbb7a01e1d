"""FedLU's client-side unlearning: retroactive interference, then passive decay.

Zhu et al., "Heterogeneous Federated Knowledge Graph Embedding Learning and Unlearning",
WWW 2023, §4.3. :class:`UnlearningModule` is a LightningModule over the client's trained
module; :class:`ClientUnlearner` fits it with a Trainer (the party's own in a run):
``interference_epochs`` epochs over the forgetting set (hard and soft confusion; for the
avatar, distillation from the local side), then at most ``decay_epochs`` of mutual
distillation over the retained triples, one fit each, stopping at the first epoch whose
local validation does not improve. ``official_updates`` picks the official code's update
counts. Relations stay frozen; filtered negatives count in no loss. The losses and where
they differ from the paper: docs/methods/fedlu.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.federated.party import device_trainer, fit_epochs
from lightning_fedkg.methods.fedlu.distillation import (DistillationModule, candidate_scores, distillation_kl,
                                                        distribution_logits)
from lightning_fedkg.models.kge import KGEModel
from lightning_fedkg.models.kge_module import KGEModule, batch_mean, kge_loss, negative_loss_term

__all__ = ["UnlearningSettings", "confusion_loss", "Passes", "UnlearningModule", "ClientUnlearner"]


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


class Passes:
    """``passes`` passes per epoch over the batches of a fresh ``make()`` each, every item
    tagged with its pass: ``(pass, batch)``.

    ``make`` is called as the plain loops called it, once per pass (a data module's
    ``train_dataloader``: each pass draws its own negatives, and its DataLoader one seed
    of the global RNG). Nothing is made or drawn until the first batch is asked for
    (Lightning calls ``iter()`` once to check that a loader is iterable).
    """

    def __init__(self, make: Callable[[], Iterable], passes: int = 1) -> None:
        self.make, self.passes = make, passes

    def __len__(self) -> int:
        return self.passes * len(self.make())

    def __iter__(self) -> Iterator[tuple[int, dict | list[dict]]]:
        for index in range(self.passes):
            for item in self.make():
                yield index, item


class UnlearningModule(L.LightningModule):
    """Both unlearning steps over one client's module, as a LightningModule.

    ``module`` is a submodule, changed in place: only the entity tables of one side move in
    a step (``loss.backward(inputs=...)``: relations stay frozen), with that side's own Adam.
    Manual optimisation: a batch makes one to five steps of two optimizers, the interference
    several passes per epoch. :attr:`stage` says what :meth:`training_step` does with a batch
    of the loader :class:`ClientUnlearner` gives it (``(pass, batch)`` items, :class:`Passes`):

    * ``"interference"``: on a forgotten batch, :meth:`interference_step` for the sides that
      :meth:`interference_passes` lists for that pass;
    * ``"decay"``: on a retained batch, :meth:`decay_step`: the local side (FedE); the sides
      alternating by batch (FedLU); or the official code's five steps (``official_updates``).

    The optimizers outlive a fit: :meth:`configure_optimizers` returns the current pair at
    every fit (the decay is one fit per epoch), :meth:`fresh_optimizers` replaces them. The
    steps run outside autocast (at the tables' own precision, whatever the Trainer's).

    Args:
        module: a trained :class:`DistillationModule` (FedLU) or :class:`KGEModule` (FedE).
        settings: :class:`UnlearningSettings`.
    """

    def __init__(self, module: KGEModule, settings: UnlearningSettings) -> None:
        super().__init__()
        self.automatic_optimization = False  # several steps of two optimizers per batch
        self.module = module
        self.settings = settings
        self.has_avatar = isinstance(module, DistillationModule)
        self.local_params = [getattr(module.model, n) for n in module.model.entity_parameter_names()]
        self.global_params = module.avatar_parameters() if self.has_avatar else []
        #: ``"interference"`` or ``"decay"``: what :meth:`training_step` does.
        self.stage = "interference"
        self._decay_batches = 0
        self.fresh_optimizers()

    def fresh_optimizers(self) -> None:
        """New Adams for both sides. Each step starts with fresh ones: momentum of the
        interference would otherwise keep pushing the retained knowledge away during the decay."""
        self.local_opt = torch.optim.Adam(self.local_params, lr=self.settings.lr)
        self.global_opt = torch.optim.Adam(self.global_params, lr=self.settings.lr) if self.has_avatar else None

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.local_opt] + ([self.global_opt] if self.has_avatar else [])

    # ------------------------------------------------------------------ losses
    def _sides(self, student: str) -> tuple[KGEModel, KGEModel | None, list]:
        m = self.module
        if student == "local":
            return m.model, (m.avatar if self.has_avatar else None), self.local_params
        return m.avatar, m.model, self.global_params

    def _distillation(self, positive: Tensor, negatives: Tensor, teacher: KGEModel | None, batch: dict) -> Tensor:
        if teacher is None or self.settings.mu_distill == 0:
            return positive.new_zeros(())
        with torch.no_grad():
            t_pos, t_neg = candidate_scores(self.module, teacher, batch)
        mask = batch.get("negative_mask")
        return self.settings.mu_distill * distillation_kl(distribution_logits(positive, negatives, mask),
                                                          distribution_logits(t_pos, t_neg, mask))

    def interference_loss(self, batch: dict, student: str = "local") -> Tensor:
        """Hard + soft confusion (:func:`confusion_loss`) of a forgotten batch under side
        ``student``; the avatar's (``"global"``) also distils from the local side."""
        hp, s = self.module.hparams, self.settings
        model, teacher, _ = self._sides(student)
        positive, negatives = candidate_scores(self.module, model, batch)
        loss = confusion_loss(positive, negatives, s.forget_weight, s.mu_soft, hp.loss, hp.adversarial_temperature,
                              weight=batch.get("weight"), negative_mask=batch.get("negative_mask"))
        if student == "global":
            loss = loss + self._distillation(positive, negatives, teacher, batch)
        return loss

    def decay_loss(self, batch: dict, student: str = "local", distill: bool = True) -> Tensor:
        """Prediction loss of a retained batch under side ``student`` (+ distillation from the
        other side unless ``distill`` is False)."""
        hp = self.module.hparams
        model, teacher, _ = self._sides(student)
        positive, negatives = candidate_scores(self.module, model, batch)
        loss = kge_loss(positive, negatives, hp.loss, hp.adversarial_temperature, hp.margin,
                        negative_mask=batch.get("negative_mask"), weight=batch.get("weight"))
        if distill:
            loss = loss + self._distillation(positive, negatives, teacher, batch)
        return loss

    # ------------------------------------------------------------------ steps
    def _step(self, loss: Tensor, student: str) -> Tensor:
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        optimizer = optimizers[0 if student == "local" else 1]
        optimizer.zero_grad()
        # Only the student's entity tables get gradients: relations stay frozen.
        self.manual_backward(loss, inputs=self._sides(student)[2])
        optimizer.step()
        return loss.detach()

    def interference_step(self, batch: dict, student: str = "local") -> Tensor:
        """One step of :meth:`interference_loss` on side ``student``; returns the loss."""
        return self._step(self.interference_loss(batch, student), student)

    def decay_step(self, batch: dict, student: str = "local", distill: bool = True) -> Tensor:
        """One step of :meth:`decay_loss` on side ``student``; returns the loss."""
        return self._step(self.decay_loss(batch, student, distill), student)

    def interference_passes(self) -> tuple[tuple[str, ...], ...]:
        """The sides stepped on each forgotten batch, per pass of an interference epoch over
        the forgetting set. Ours: one pass, the local side then the avatar. The official
        code's (``official_updates``): an avatar pass, a local pass, then avatar and local per
        batch (without an avatar: two local passes)."""
        if not self.settings.official_updates:
            return (("local", "global") if self.has_avatar else ("local",),)
        if not self.has_avatar:
            return (("local",), ("local",))
        return (("global",), ("local",), ("global", "local"))

    def on_train_epoch_start(self) -> None:
        self._decay_batches = 0

    def training_step(self, item: tuple[int, dict | list[dict]], batch_idx: int) -> None:
        index, group = item
        # The tables' own precision: no autocast even where the Trainer's precision is mixed.
        with torch.autocast(device_type=self.device.type, enabled=False):
            # a train loader yields lists of batches under train.batches_per_step > 1
            for batch in KGEModule.step_batches(group):
                if self.stage == "interference":
                    for student in self.interference_passes()[index]:
                        self.interference_step(batch, student)
                elif self.stage == "decay":
                    self._decay_batch(batch)
                else:
                    raise ValueError(f"stage must be 'interference' or 'decay', got {self.stage!r}")

    def _decay_batch(self, batch: dict) -> None:
        i, self._decay_batches = self._decay_batches, self._decay_batches + 1
        if not self.has_avatar:
            self.decay_step(batch, "local")
        elif self.settings.official_updates:
            for student, distill in OFFICIAL_DECAY_STEPS:
                self.decay_step(batch, student, distill)
        else:
            self.decay_step(batch, "local" if i % 2 == 0 else "global")

    # ------------------------------------------------------------------ tables
    def snapshot(self) -> list[Tensor]:
        """Copies of the tables the steps move (local, then the avatar's)."""
        return [p.detach().clone() for p in self.local_params + self.global_params]

    @torch.no_grad()
    def restore(self, snapshot: list[Tensor]) -> None:
        """Put back the tables of a :meth:`snapshot`."""
        for p, saved in zip(self.local_params + self.global_params, snapshot):
            p.copy_(saved)


class ClientUnlearner:
    """Runs both unlearning steps on one client's module, in place: fits an
    :class:`UnlearningModule` over it with ``trainer``.

    Args:
        module: a trained :class:`DistillationModule` (FedLU) or :class:`KGEModule` (FedE).
        settings: :class:`UnlearningSettings`.
        trainer: the Trainer of the fits (:func:`~lightning_fedkg.methods.fedlu.phase.unlearn_client`
            passes the party's own); None: a fresh one on the module's device
            (:func:`~lightning_fedkg.federated.party.device_trainer`).

    Attributes:
        unlearning: the :class:`UnlearningModule`.
    """

    def __init__(self, module: KGEModule, settings: UnlearningSettings, trainer: L.Trainer | None = None) -> None:
        self.module = module
        self.settings = settings
        self.unlearning = UnlearningModule(module, settings)
        self.trainer = trainer if trainer is not None else device_trainer(module.device)

    def interfere(self, forget_batches: Callable[[], Iterable[dict | list[dict]]]) -> None:
        """``interference_epochs`` epochs over the forget batches, one fit (the passes and
        steps per batch: :meth:`UnlearningModule.interference_passes`)."""
        u = self.unlearning
        u.stage = "interference"
        if self.settings.interference_epochs > 0:
            fit_epochs(self.trainer, u, self.settings.interference_epochs,
                       Passes(forget_batches, len(u.interference_passes())))

    def decay(self, retain_batches: Callable[[], Iterable[dict | list[dict]]],
              validate: Callable[[], float]) -> list[float]:
        """Passive decay until local validation stops improving, one fit per epoch with fresh
        Adams kept across them; returns the validation scores (first: before decay). The
        tables of the best epoch are kept."""
        u = self.unlearning
        u.fresh_optimizers()
        u.stage = "decay"
        scores = [validate()]
        best = u.snapshot()
        for _ in range(self.settings.decay_epochs):
            fit_epochs(self.trainer, u, 1, Passes(retain_batches))
            scores.append(validate())
            if not scores[-1] > max(scores[:-1]):
                u.restore(best)
                break
            best = u.snapshot()
        return scores
