"""Differential privacy for FKGE's PPAT: PATE voting and its moments accountant.

Self-contained (no dependency on the rest of FKGE):

* :mod:`.pate` -- disjoint teacher partitions, hard teacher votes, and the noisy argmax
  ``argmax_j (n_j(x) + Lap(1/lambda))`` of Papernot et al., ICLR 2017 (PATE);
* :mod:`.accountant` -- :class:`PateMomentsAccountant`, PATE's per-query moments
  accountant (Thm 2 and 3 of PATE, composed as in Abadi et al., CCS 2016), which is what
  Peng et al., CIKM 2021 (FKGE) Eq. 8-10 transcribe;
* :mod:`.gaussian` -- the Poisson-subsampled Gaussian mechanism's log moments (exact at
  integer orders) and noise calibration for a target epsilon;
* :mod:`.ledger` -- :class:`PrivacyLedger`, one party's total over every mechanism it runs,
  with the releases no mechanism protects declared beside it.
"""

from .accountant import PateMomentsAccountant
from .gaussian import calibrate_gaussian_noise, epsilon_from_log_moments, sampled_gaussian_log_moments
from .ledger import PrivacyLedger
from .pate import noisy_argmax, split_teacher_partitions, teacher_votes

__all__ = ["PateMomentsAccountant", "PrivacyLedger", "calibrate_gaussian_noise", "epsilon_from_log_moments",
           "sampled_gaussian_log_moments", "noisy_argmax", "split_teacher_partitions", "teacher_votes"]
