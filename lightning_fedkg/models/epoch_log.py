"""Training scalars kept on the device during an epoch and logged once at its end.

``LightningModule.log(..., on_step=True)`` in every training step costs host work per
step and, for a tensor on a GPU, turns into reads of device values; at the small batches
of KGE training that is a visible share of a step. :class:`EpochMeanLogging` sums each
scalar on the module's device instead (an in-place add, nothing read back) and logs the
weighted mean once per epoch, which is what every federated round reports anyway
(``Party.fit`` returns the epoch's ``train/loss``; TensorBoard gets per-round curves).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["EpochMeanLogging"]


class EpochMeanLogging:
    """Mixin for a ``LightningModule``: :meth:`log_epoch_mean` in a training step, one
    ``self.log`` per name in ``on_train_epoch_end``."""

    def log_epoch_mean(self, name: str, value: Tensor, weight: int) -> None:
        """Add ``value`` (a scalar tensor) with ``weight`` (a Python number: the batch size)
        to ``name``'s running sum; no host synchronisation."""
        sums = self.__dict__.setdefault("_epoch_sums", {})
        term = value.detach().float() * weight
        if name in sums:
            total, weights = sums[name]
            sums[name] = (total + term, weights + weight)
        else:
            sums[name] = (term, weight)

    def on_train_epoch_end(self) -> None:
        for name, (total, weights) in self.__dict__.pop("_epoch_sums", {}).items():
            self.log(name, total / weights, on_step=False, on_epoch=True)
