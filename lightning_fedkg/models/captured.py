"""A training step recorded once as a CUDA graph and replayed for every batch of its shape.

A KGE batch is little arithmetic, so on a GPU an eager step waits on the host: the Python of
the losses, autograd and Adam launches tens of small kernels per batch. :class:`StepGraphs`
records one batch's whole step (losses, backward, optimizer updates) with
:class:`torch.cuda.CUDAGraph` and then, per batch, copies the batch into the recorded input
buffers and replays the recording: a handful of launches instead of hundreds.

A recording is only valid while nothing it read from Python changes, so each is keyed by the
batch's shapes, dtypes and plain values, and by :meth:`StepGraphs.watch` (the optimizers'
identity, the parameters' storage, flags a module reads); a changed key records afresh and a
changed watch drops every recording. The first ``warmup`` batches of a key run eagerly (on a
side stream on CUDA, which capture needs; they are real training steps). :class:`EagerRecorder`
tests it without CUDA; :class:`RecordedSteps` decides when ``KGEModule`` records its step.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable

import torch
from torch import Tensor

log = logging.getLogger("lightning_fedkg")

__all__ = ["CudaRecorder", "EagerRecorder", "StepGraphs", "make_capturable"]

Step = Callable[[dict], dict]


class CudaRecorder:
    """Records ``step`` on a CUDA graph (eager warm-up on a side stream, as capture needs)."""

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None

    def _autocast(self):
        # Autocast's weight-cast cache must be off while recording: a cached cast would be
        # made once at capture and never again (PyTorch's CUDA-graph notes).
        if torch.is_autocast_enabled("cuda"):
            return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
        return contextlib.nullcontext()

    def warm(self, step: Step, batch: dict) -> dict:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        current = torch.cuda.current_stream()
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream), self._autocast():
            out = step(batch)
        current.wait_stream(self._stream)
        return out

    def record(self, step: Step, inputs: dict) -> tuple[Callable[[], None], dict]:
        graph = torch.cuda.CUDAGraph()
        with self._autocast(), torch.cuda.graph(graph):
            out = step(inputs)
        return graph.replay, out


class EagerRecorder:
    """Stands in for :class:`CudaRecorder` where there is no CUDA (tests): "recording" keeps
    the step, and a replay calls it on the same input buffers, as a graph reads them."""

    def warm(self, step: Step, batch: dict) -> dict:
        return step(batch)

    def record(self, step: Step, inputs: dict) -> tuple[Callable[[], None], dict]:
        holder: dict = {}  # filled by the first replay: a recording does not run the step

        def replay() -> None:
            for name, value in step(inputs).items():
                if name in holder:
                    holder[name].copy_(value)
                else:
                    holder[name] = value.detach().clone()

        return replay, holder


def _signature(batch: dict) -> tuple:
    parts = []
    for name in sorted(batch):
        value = batch[name]
        if isinstance(value, Tensor):
            parts.append((name, tuple(value.shape), value.dtype, value.device))
        else:
            parts.append((name, value))
    return tuple(parts)


class StepGraphs:
    """Replays one recorded step per batch signature (see the module docstring).

    Args:
        step: the whole step of one batch dict: losses, backward, optimizer steps; returns
            ``{name: scalar tensor}``. It must read only tensors of the batch and state that
            :attr:`watch` covers, and may not synchronise with the host.
        watch: returns a hashable summary of everything besides the batch that the step's
            Python reads (optimizers, parameter storage, flags); a change drops the recordings.
        recorder: :class:`CudaRecorder` (default) or :class:`EagerRecorder`.
        warmup: eager batches of a signature before it is recorded (capture needs the
            optimizer state and the libraries' lazy set-up to exist already).
        max_graphs: recordings kept at once (a full and a last short batch need two).

    The returned tensors of :meth:`run` are the recording's output buffers: the next replay
    overwrites them, so use them before the next batch.
    """

    def __init__(self, step: Step, watch: Callable[[], tuple], recorder=None, warmup: int = 2,
                 max_graphs: int = 4) -> None:
        self.step, self.watch = step, watch
        self.recorder = CudaRecorder() if recorder is None else recorder
        self.warmup, self.max_graphs = warmup, max_graphs
        self._watched: tuple | None = None
        self._seen: dict[tuple, int] = {}
        self._graphs: dict[tuple, tuple[dict, Callable[[], None], dict]] = {}
        #: Batches run eagerly / replayed / recordings made, since construction.
        self.counts = {"eager": 0, "replayed": 0, "recorded": 0}
        #: Why recording failed (every batch runs eagerly after that), or None.
        self.failed: str | None = None

    def reset(self) -> None:
        """Drop every recording (their memory goes with them)."""
        self._graphs.clear()
        self._seen.clear()

    def run(self, batch: dict) -> dict:
        watched = self.watch()
        if watched != self._watched:
            self.reset()
            self._watched = watched
        key = _signature(batch)
        recorded = self._graphs.get(key)
        if recorded is not None:
            inputs, replay, out = recorded
            for name, buffer in inputs.items():
                if isinstance(buffer, Tensor):
                    buffer.copy_(batch[name])
            replay()
            self.counts["replayed"] += 1
            return out
        seen = self._seen.get(key, 0)
        if self.failed is not None or seen < self.warmup or len(self._graphs) >= self.max_graphs:
            self._seen[key] = seen + 1
            self.counts["eager"] += 1
            return self.recorder.warm(self.step, batch)
        inputs = {name: value.clone() if isinstance(value, Tensor) else value for name, value in batch.items()}
        try:
            replay, out = self.recorder.record(self.step, inputs)
        except Exception as err:  # noqa: BLE001 - any failed recording means: train eagerly
            # A recording runs no kernel, so this batch has not been trained yet.
            self.failed = f"{type(err).__name__}: {err}"
            log.warning("recording the training step failed (%s); this module trains eagerly from now on",
                        self.failed)
            self.counts["eager"] += 1
            return self.recorder.warm(self.step, batch)
        self._graphs[key] = (inputs, replay, out)
        self.counts["recorded"] += 1
        replay()  # recording only recorded: this batch's step happens now
        self.counts["replayed"] += 1
        return out


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Turn an Adam built without ``capturable`` into one that may be recorded: the flag on
    every group and each parameter's step count as a float tensor on its device (what
    ``torch.optim.Adam(..., capturable=True)`` keeps). Moments are untouched."""
    for group in optimizer.param_groups:
        if group.get("capturable"):
            continue
        group["capturable"] = True
        # One fused kernel per update instead of a foreach pass per arithmetic operation.
        if not group.get("foreach") and not group.get("differentiable") and all(
                p.is_cuda and p.is_floating_point() for p in group["params"]):
            group["fused"] = True
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state and "step" in state:
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(param.device)


def _bare_backward(loss: Tensor, **kwargs) -> None:
    loss.backward(**kwargs)


class RecordedSteps:
    """The recorded training step of a module with ``optimise_batch(batch, optimizers,
    backward)``, ``regularizers``, ``compile_training`` and ``row_sparse`` (a mixin of
    :class:`~lightning_fedkg.models.kge_module.KGEModule`): whether a fit records its step
    (:meth:`captures`), the :class:`StepGraphs` that replay it, what makes a recording stale
    (:meth:`capture_key`, the optimizers' tensors), and optimizers made capturable."""

    #: Record each batch's step as a CUDA graph (``trainer.capture``): None records on a CUDA
    #: device at ``32-true`` or ``bf16-mixed`` without ``compile``, False never, True as None
    #: (elsewhere the eager step runs: there is nothing to record on a CPU).
    capture_steps: bool | None = None
    #: A stand-in recorder (:class:`~lightning_fedkg.models.captured.EagerRecorder`) that
    #: makes :meth:`step_graphs` active on any device; tests only.
    step_recorder = None

    def captures(self) -> bool:
        """Whether this step is recorded (see :attr:`capture_steps`). A regularizer a client
        half installs (FedProx's term) reads tensors that change every fit, so such fits run
        eagerly; so does a row-sparse step (``optimizer="sparse_adam"``), whose gradients'
        shapes follow each batch's distinct rows."""
        if self.capture_steps is False or self.compile_training or self.regularizers or self.row_sparse:
            return False
        if self.step_recorder is not None:
            return True
        if self.device.type != "cuda":
            return False
        return str(self._trainer.precision) in ("32-true", "bf16-mixed") if self._trainer is not None else False

    def step_graphs(self):
        """The :class:`~lightning_fedkg.models.captured.StepGraphs` of this module's step, or
        None when the step runs eagerly (:meth:`captures`)."""
        if not self.captures():
            return None
        graphs = self.__dict__.get("_step_graphs")  # not a submodule, not saved
        if graphs is None:
            graphs = StepGraphs(self._bare_step, self._recording_watch, recorder=self.step_recorder)
            self.__dict__["_step_graphs"] = graphs
        return graphs

    def _bare_step(self, batch: dict) -> dict[str, Tensor]:
        return self.optimise_batch(batch, self._optimizer_list(wrapped=False), _bare_backward)

    def capture_key(self) -> tuple:
        """Plain values besides the batch that :meth:`optimise_batch`'s Python reads and that
        may change between fits (a subclass's flags); a change records the step afresh."""
        return ()

    def _recording_watch(self) -> tuple:
        # Objects compare by identity here, and holding them keeps a dropped optimizer's id
        # from being reused by the next one while a recording still points at its state.
        # Run before every batch, so it walks the optimizers (which hold every trained
        # table) rather than the module tree.
        watched: list = [self.capture_key()]
        for optimizer in self._optimizer_list(wrapped=False):
            watched.append(optimizer)
            for group in optimizer.param_groups:
                watched.append(group["lr"])
                watched.extend(p.data_ptr() for p in group["params"])
            watched.extend(value.data_ptr() for state in optimizer.state.values()
                           for value in state.values() if isinstance(value, Tensor))
        return tuple(watched)

    def _optimizer_list(self, wrapped: bool) -> list:
        optimizers = self.optimizers(use_pl_optimizer=wrapped)
        return list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]

    def _ready_to_record(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``optimizer``, made capturable when this fit may record its step (CUDA)."""
        if self.capture_steps is not False and self.device.type == "cuda" and not self.row_sparse:
            make_capturable(optimizer)
        return optimizer
