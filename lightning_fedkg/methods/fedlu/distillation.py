"""FedLU's client learner: local entity embeddings and a global avatar that teach each other.

Zhu et al., "Heterogeneous Federated Knowledge Graph Embedding Learning and Unlearning",
WWW 2023, §4.2. :class:`DistillationModule` keeps a private local table and an avatar of the
global rows (the only shareable group, ``"avatar"``), both scored with one relation table.
Each batch makes a local step (KGE loss + μ·KL from the avatar) and then an avatar step
(the mirror, reaching only the avatar's rows); ``distill_local`` / ``distill_global`` switch
the directions. The local Adam persists across ``fit()`` calls, the avatar's is rebuilt.
A plain LightningModule. See docs/methods/fedlu.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.models.kge import KGEModel, build_model
from lightning_fedkg.models.kge_module import KGEModule, kge_loss
from lightning_fedkg.models.shareable import SharedGroup

__all__ = ["DistillationModule", "distillation_kl", "distribution_logits", "candidate_scores", "AVATAR_PREFIX"]

#: Wire names of the avatar's tensors start with this prefix (``avatar_entity_emb``), so a
#: channel log tells them apart from any other entity table at a glance.
AVATAR_PREFIX = "avatar_"

#: Where a masked (filtered) negative's logit goes: far below any score, but finite, so
#: that the KL of two masked entries is 0 rather than NaN.
_MASKED_LOGIT = -1e9

SIDES = ("local", "global")


def distillation_kl(student: Tensor, teacher: Tensor) -> Tensor:
    """``KL(softmax(teacher) ‖ softmax(student))``, summed over candidates, averaged over rows.

    ``student``/``teacher``: ``[B, c]`` scores of the same candidates; the teacher is
    detached here, so gradients reach the student only.
    """
    return F.kl_div(F.log_softmax(student, dim=1), F.softmax(teacher.detach(), dim=1), reduction="batchmean")


def candidate_scores(module: KGEModule, model: KGEModel, batch: dict) -> tuple[Tensor, Tensor]:
    """``(positive [B], negatives [B, n])`` scores of a training batch under ``model``."""
    positive = batch["positive"]
    return model(positive[:, 0], positive[:, 1], positive[:, 2]), module.negative_scores(batch, model)


def distribution_logits(positive: Tensor, negatives: Tensor, mask: Tensor | None) -> Tensor:
    """``[B, 1 + n]`` logits over the positive and its negatives (masked negatives excluded)."""
    if mask is not None:
        negatives = negatives.masked_fill(~mask, _MASKED_LOGIT)
    return torch.cat([positive.unsqueeze(1), negatives], dim=1)


class DistillationModule(KGEModule):
    """FedLU's learner: a :class:`KGEModule` (``self.model`` = local side) plus an avatar.

    Args (beyond :class:`KGEModule`'s):
        distill_mu: ``μ_distill``, the weight of each KL term (FedLU's script: 2.0).
        distill_local: initial value of the flag "the avatar teaches the local side".
        distill_global: initial value of the flag "the local side teaches the avatar".

    ``reset_optimizer`` is forced to False: the local optimizer persists (as in FedLU's
    client.py ``update_model``).

    Attributes:
        avatar: a :class:`KGEModel` whose relation-indexed tables *are* ``model``'s (the same
            ``Parameter`` objects) and whose entity tables are its own.
        eval_side: ``"local"`` (default) or ``"global"``: which side validation/test rank.
        distill_local, distill_global: the two flags (saved with the weights).
    """

    def __init__(self, model: str = "transe", *, distill_mu: float = 2.0, distill_local: bool = True,
                 distill_global: bool = True, **kwargs) -> None:
        kwargs["reset_optimizer"] = False
        if kwargs.get("optimizer", "adam") != "adam":
            # Its two optimizers and distillation terms are FedLU's dense Adam steps.
            raise ValueError(f"FedLU's learner trains with Adam (its code's); train.optimizer="
                             f"{kwargs['optimizer']} is for KGE learners (fede, fedr, fedprox, fedec, single, entire)")
        super().__init__(model, **kwargs)
        if distill_mu < 0:
            raise ValueError(f"distill_mu must be >= 0, got {distill_mu}")
        hp = self.hparams
        self.avatar: KGEModel = build_model(
            model, hp.num_entities, hp.num_relations, hp.dim, gamma=hp.gamma, epsilon=hp.epsilon,
            **(hp.model_kwargs or {}),
        )
        with torch.no_grad():
            for name in self.avatar.entity_parameter_names():
                getattr(self.avatar, name).copy_(getattr(self.model, name))
        for name in self.avatar.relation_parameter_names():
            # One relation table for both scorers (as in FedLU's model.py): tie the
            # Parameter itself.
            setattr(self.avatar, name, getattr(self.model, name))
        # Saved with the weights as a buffer; read through a host-side copy, because reading
        # a CUDA buffer in every training step would stall the host on the device twice a batch.
        self.register_buffer("flags", torch.tensor([bool(distill_local), bool(distill_global)]))
        self._flags = [bool(distill_local), bool(distill_global)]
        self.register_load_state_dict_post_hook(DistillationModule._reload_flags)
        #: True once the local table was initialised from a received avatar (saved, so a
        #: resumed client does not overwrite trained local rows).
        self.register_buffer("local_initialized", torch.tensor(False))
        self.eval_side = "local"
        self._global_optimizer: torch.optim.Optimizer | None = None

    # ------------------------------------------------------------------ flags and groups
    def _set_flag(self, index: int, value: bool) -> None:
        self._flags[index] = bool(value)
        self.flags[index] = bool(value)

    @staticmethod
    def _reload_flags(module: "DistillationModule", incompatible_keys) -> None:
        module._flags = [bool(v) for v in module.flags.tolist()]

    @property
    def distill_local(self) -> bool:
        return self._flags[0]

    @distill_local.setter
    def distill_local(self, value: bool) -> None:
        self._set_flag(0, value)

    @property
    def distill_global(self) -> bool:
        return self._flags[1]

    @distill_global.setter
    def distill_global(self, value: bool) -> None:
        self._set_flag(1, value)

    def avatar_parameters(self) -> list[torch.nn.Parameter]:
        """The avatar's own (entity-indexed) tensors: what its optimizer updates."""
        return [getattr(self.avatar, n) for n in self.avatar.entity_parameter_names()]

    def shareable_groups(self) -> dict[str, SharedGroup]:
        """Only ``"avatar"``: the avatar's entity tables under ``avatar_<name>`` wire names."""
        names = self.avatar.entity_parameter_names()
        return {"avatar": SharedGroup(
            {AVATAR_PREFIX + n: getattr(self.avatar, n) for n in names},
            "entity",
            {AVATAR_PREFIX + n: self.avatar.init_spec(n) for n in names},
        )}

    @torch.no_grad()
    def copy_avatar_to_local(self) -> None:
        """``E_loc ← E_glb`` (the official initialisation ``E_loc = E_glb = E_0[idx]``)."""
        for name in self.avatar.entity_parameter_names():
            getattr(self.model, name).copy_(getattr(self.avatar, name))
        self.local_initialized.fill_(True)

    def evaluation_model(self) -> KGEModel:
        if self.eval_side not in SIDES:
            raise ValueError(f"eval_side must be one of {SIDES}, got {self.eval_side!r}")
        return self.avatar if self.eval_side == "global" else self.model

    # ------------------------------------------------------------------ losses
    def side_losses(self, batch: dict, student: str) -> tuple[Tensor, Tensor]:
        """``(prediction loss, KL)`` of side ``student`` (``"local"``/``"global"``) on a batch.

        The KL is taken against the other side's current scores (detached); it is computed
        only when that direction's flag is on (else it is a zero).
        """
        hp = self.hparams
        mine, other = (self.model, self.avatar) if student == "local" else (self.avatar, self.model)
        positive, negatives = candidate_scores(self, mine, batch)
        mask = batch.get("negative_mask")
        prediction = kge_loss(positive, negatives, hp.loss, hp.adversarial_temperature, hp.margin,
                              negative_mask=mask, weight=batch.get("weight"))
        on = self.distill_local if student == "local" else self.distill_global
        if not on or hp.distill_mu == 0:
            return prediction, prediction.new_zeros(())
        with torch.no_grad():
            teacher_pos, teacher_neg = candidate_scores(self, other, batch)
        kl = distillation_kl(distribution_logits(positive, negatives, mask),
                             distribution_logits(teacher_pos, teacher_neg, mask))
        return prediction, kl

    def training_loss(self, batch: dict) -> Tensor:
        """The local side's objective (``L_pred + μ·KL`` plus any installed regularizer)."""
        prediction, kl = self.side_losses(batch, "local")
        loss = prediction + self.hparams.distill_mu * kl
        for term in self.regularizers:
            loss = loss + term()
        return loss

    def global_loss(self, batch: dict) -> Tensor:
        """The avatar's objective (``L_pred + μ·KL`` with the roles reversed)."""
        prediction, kl = self.side_losses(batch, "global")
        return prediction + self.hparams.distill_mu * kl

    def optimise_batch(self, batch: dict, optimizers: list, backward) -> dict[str, Tensor]:
        """The local side's step, then the avatar's (see :meth:`KGEModule.optimise_batch`)."""
        local_opt, global_opt = optimizers
        loss = self.compiled("training_loss")(batch)
        local_opt.zero_grad()
        backward(loss)
        local_opt.step()
        global_loss = self.compiled("global_loss")(batch)
        global_opt.zero_grad()
        # Only the avatar's tensors get gradients: the shared relations stay the local step's.
        backward(global_loss, inputs=self.avatar_parameters())
        global_opt.step()
        return {"train/loss": loss, "train/loss_global": global_loss}

    def capture_key(self) -> tuple:
        return (self.distill_local, self.distill_global)

    # ------------------------------------------------------------------ optimizers
    def local_parameters(self) -> list[torch.nn.Parameter]:
        """The local side: ``model``'s tables (entities and the shared relations)."""
        return list(self.model.parameters())

    def configure_optimizers(self):
        if self._optimizer is None:
            self._optimizer = torch.optim.Adam(self.local_parameters(), lr=self.hparams.lr)
        # A fresh Adam for the avatar at every fit(): its rows were just overwritten by the
        # aggregate, so moments of the previous rows would be stale (the official code too).
        self._global_optimizer = torch.optim.Adam(self.avatar_parameters(), lr=self.hparams.lr)
        return [self._ready_to_record(self._optimizer), self._ready_to_record(self._global_optimizer)]

    def load_optimizer_state_dict(self, state: dict | None) -> None:
        """Restore the local Adam (the avatar's is rebuilt by every ``fit()``)."""
        if state is None:
            self._optimizer = None
            return
        if self._optimizer is None:
            self._optimizer = torch.optim.Adam(self.local_parameters(), lr=self.hparams.lr)
        self._optimizer.load_state_dict(state)
