"""Client state stays on its device between Trainer calls (ResidentSingleDeviceStrategy)."""

from types import SimpleNamespace
from unittest import mock

import torch

from lightning_fedkg.federated.party import ResidentSingleDeviceStrategy, resident_strategy


def test_teardown_leaves_module_and_optimizer_where_they_are():
    strategy = ResidentSingleDeviceStrategy(device=torch.device("cpu"))
    module = mock.MagicMock()
    strategy._lightning_module = module
    strategy.accelerator = mock.MagicMock()
    with mock.patch("lightning.pytorch.strategies.strategy._optimizers_to_device") as move:
        strategy.teardown()
    module.cpu.assert_not_called()
    move.assert_not_called()
    strategy.accelerator.teardown.assert_called_once()


def test_used_only_on_one_gpu_when_asked():
    cfg = SimpleNamespace(keep_on_device=True, devices=1, accelerator="auto")
    with mock.patch("torch.cuda.is_available", return_value=False):
        assert resident_strategy(cfg) is None  # CPU: Lightning's default strategy
    with mock.patch("torch.cuda.is_available", return_value=True):
        strategy = resident_strategy(cfg)
        assert isinstance(strategy, ResidentSingleDeviceStrategy) and strategy.root_device.type == "cuda"
        assert resident_strategy(SimpleNamespace(keep_on_device=False, devices=1, accelerator="auto")) is None
        assert resident_strategy(SimpleNamespace(keep_on_device=True, devices=2, accelerator="auto")) is None
        assert resident_strategy(SimpleNamespace(keep_on_device=True, devices=1, accelerator="cpu")) is None
