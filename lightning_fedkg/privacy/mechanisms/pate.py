"""PATE voting: disjoint teacher partitions, hard votes, the Laplace noisy argmax.

Papernot et al., "Semi-supervised Knowledge Transfer for Deep Learning from Private
Training Data", ICLR 2017, §2.1: teachers on disjoint partitions cast hard votes and the
answer is ``argmax_j (n_j(x) + Lap(1/lambda))``, a ``2 lambda``-DP answer that
:class:`~lightning_fedkg.privacy.mechanisms.pate_moments.PateMomentsAccountant` charges from the vote gap
:func:`noisy_argmax` returns. The official FKGE code sums probabilities with noise of scale
0.05 instead; the differences are listed in docs/methods/fkge.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["teacher_votes", "noisy_argmax", "split_teacher_partitions", "laplace"]


def split_teacher_partitions(n: int, num_teachers: int, generator: torch.Generator) -> list[Tensor]:
    """Disjoint index sets ``D_1 .. D_T`` covering ``range(n)``, one per teacher.

    A random permutation (drawn from ``generator``) cut into ``num_teachers`` pieces whose
    sizes differ by at most one (``|D_i| = n / T`` as in FKGE §3.2). Disjointness is what
    PATE's sensitivity argument needs: a change to one record changes one teacher's vote.
    """
    if num_teachers < 1:
        raise ValueError(f"num_teachers must be >= 1, got {num_teachers}")
    if n < num_teachers:
        raise ValueError(f"cannot give each of {num_teachers} teachers data from only {n} records")
    perm = torch.randperm(n, generator=generator)
    return [part.clone() for part in torch.tensor_split(perm, num_teachers)]


def teacher_votes(teacher_out: Tensor, num_classes: int | None = None) -> Tensor:
    """Hard vote counts ``n_j(x)``: ``int64 [B, C]``, each teacher voting once per query.

    ``teacher_out`` is one of

    * float ``[T, B, C]``: per-class scores (probabilities or logits); a teacher votes for
      its argmax class;
    * float ``[T, B]``: a binary discriminator's probability of class 1 ("real"); a teacher
      votes 1 iff ``p > 0.5`` (hard votes with threshold 0.5, as FKGE §3.2 describes them);
    * integer ``[T, B]``: class ids, with ``num_classes`` (default 2).

    Each row of the result sums to ``T``.
    """
    if teacher_out.dim() == 3:
        if not teacher_out.is_floating_point():
            raise ValueError("a [T, B, C] input must hold float scores")
        num_classes = teacher_out.shape[-1] if num_classes is None else num_classes
        if num_classes != teacher_out.shape[-1]:
            raise ValueError(f"num_classes={num_classes} but scores have {teacher_out.shape[-1]} classes")
        preds = teacher_out.argmax(dim=-1)
    elif teacher_out.dim() == 2:
        if teacher_out.is_floating_point():
            if num_classes not in (None, 2):
                raise ValueError("a float [T, B] input is a binary probability; num_classes must be 2")
            preds = (teacher_out > 0.5).long()
            num_classes = 2
        else:
            num_classes = 2 if num_classes is None else num_classes
            preds = teacher_out.long()
            if preds.numel() and (preds.min() < 0 or preds.max() >= num_classes):
                raise ValueError(f"class ids must lie in [0, {num_classes})")
    else:
        raise ValueError(f"teacher_out must be [T, B, C] or [T, B], got shape {tuple(teacher_out.shape)}")
    one_hot = torch.nn.functional.one_hot(preds, num_classes)  # [T, B, C]
    return one_hot.sum(dim=0)


def laplace(shape: tuple[int, ...], scale: float, generator: torch.Generator) -> Tensor:
    """``float64`` Laplace(0, ``scale``) noise by the inverse CDF of the generator's uniforms
    (on the generator's device).

    ``X = -scale * sign(u) * log(1 - 2|u|)`` with ``u = p - 1/2``, ``p ~ U(0, 1)``. ``p``
    is clamped away from 0 (``torch.rand`` can return exactly 0, which would give -inf);
    this moves a ``2**-53``-probability atom and nothing else.
    """
    p = torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device)
    u = p.clamp_min(torch.finfo(torch.float64).tiny) - 0.5
    return -scale * torch.sign(u) * torch.log1p(-2.0 * u.abs())


def noisy_argmax(votes: Tensor, lam: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """PATE's noisy aggregation: ``(labels int64 [B], gaps int64 [B])``.

    ``labels[b] = argmax_j (votes[b, j] + V_bj)``, ``V_bj ~ iid Lap(1/lam)`` drawn from
    ``generator`` (PATE Eq. 1; FKGE Eq. 6). ``gaps[b]`` = top vote - second vote of the
    *noise-free* counts (``|n_0 - n_1|`` for two classes): the quantity the accountant's
    data-dependent bound (PATE Thm 3) needs. Ties of the noisy values have probability 0.
    """
    if lam <= 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    if votes.dim() != 2 or votes.shape[1] < 2:
        raise ValueError(f"votes must be [B, C] with C >= 2, got shape {tuple(votes.shape)}")
    noise = laplace(tuple(votes.shape), 1.0 / lam, generator).to(votes.device)
    labels = (votes.to(torch.float64) + noise).argmax(dim=1)
    top2 = votes.long().topk(2, dim=1).values
    gaps = top2[:, 0] - top2[:, 1]
    return labels, gaps
