"""One training step counted under fake tensors: what the memory estimate (memory_estimate.py)
is built on.

    with FakeTensorMode():
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        trace = trace_step(net, torch.optim.SGD(net.parameters(), lr=0.1), (1024, 8))
    trace.backward_peak, trace.forward_kept, trace.optimizer_peak      # bytes

The counter is this module's own small ``TorchDispatchMode`` rather than
``torch.distributed._tools.MemTracker``: that one attributes memory module by module and refuses a
module called twice in one step (a pipeline's microbatches), and it made the trace of resnet50 at
224 px about 4x slower on two cores (1.8 s against 0.45 s a step). Autocast is traced with the
CPU's casting rules, which cast convolutions and matrix products as CUDA's do.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from contract.config import RunConfig


class EstimateError(ValueError):
    """A config whose memory cannot be estimated; the message names the value."""


# --- counting what exists on the fake devices ------------------------------------------------

# The operators CUDA runs through cuBLAS (and cuBLASLt): matrix products. A phase of the step that runs one
# gets a cuBLAS handle, and with it a workspace (memory_estimate.cublas_workspace_bytes).
BLAS_OPS = frozenset(getattr(torch.ops.aten, name) for name in (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "mv", "addmv", "dot", "vdot", "_scaled_mm",
    "_int_mm") if hasattr(torch.ops.aten, name))


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage created while it is active, until that storage is
    freed, and the most that were alive at once (with how much of it was parameter gradients)."""

    def __init__(self, params: list[nn.Parameter], existing: list[torch.Tensor] = ()):
        super().__init__()
        self.live = self.peak = self.grads = self.grads_at_peak = 0
        self.phase, self.blas_phases = "forward", set()  # the phases that ran a cuBLAS product
        # Storages made before (parameters, buffers) are not counted, views of them included.
        self._sizes: dict[int, int] = {t.untyped_storage()._cdata: 0 for t in existing}
        self._grad_keys: set[int] = set()
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params if p.requires_grad]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in BLAS_OPS:
            self.blas_phases.add(self.phase)
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._add(tensor.untyped_storage())
        return out

    def _add(self, storage) -> None:
        key = storage._cdata
        if key in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[key] = size
        self.live += size
        weakref.finalize(storage, self._free, key)
        if self.live > self.peak:
            self.peak, self.grads_at_peak = self.live, self.grads

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)
        if key in self._grad_keys:
            self._grad_keys.discard(key)
            self.grads = sum(self._sizes.get(k, 0) for k in self._grad_keys)

    def _grad_ready(self, param: nn.Parameter) -> None:
        key = param.grad.untyped_storage()._cdata
        if key in self._sizes and key not in self._grad_keys:
            self._grad_keys.add(key)
            self.grads += self._sizes[key]

    def restart_peak(self) -> None:
        self.peak, self.grads_at_peak = self.live, self.grads

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


@dataclass(frozen=True)
class StepTrace:
    """Bytes one training step of a module allocated beyond its parameters and buffers."""

    backward_peak: int      # most alive at once in forward and backward (gradients included)
    grads_at_peak: int      # of which parameter gradients
    forward_kept: int       # alive when forward ends: what backward needs, the output, the input
    optimizer_peak: int     # most alive in the optimizer step (its state, created then, included)
    input_bytes: int
    output_bytes: int
    optimizer_extra: int    # of which the step's own: its state and temporaries (the same at any batch)
    # The phases that run a cuBLAS product ("forward", "backward"): on CUDA forward runs in the calling
    # thread and backward in autograd's thread for the device, each with its own handle and workspace.
    blas_phases: frozenset[str] = frozenset()

    @property
    def blas_threads(self) -> int:
        return len(self.blas_phases)


# --- the fake model and its stages ----------------------------------------------------------

class FakeModel:
    """A model built under fake tensors: shapes and dtypes without memory or weights. One per
    (model, classes, channels), shared by every estimate (``fake_model``); its traces run one at
    a time (``TRACE_LOCK``), since each hooks the shared parameters."""

    def __init__(self, name: str, num_classes: int, in_chans: int, model_args: str = "{}"):
        from torch._subclasses.fake_tensor import FakeTensorMode

        from trainer_backend.rank.models import create_model

        self.name, self.num_classes, self.in_chans = name, num_classes, in_chans
        self.mode = FakeTensorMode()
        try:
            with self.mode:
                self.model = create_model(name, num_classes=num_classes, in_chans=in_chans,
                                          model_args=json.loads(model_args))
        except (ValueError, LookupError):
            raise
        except Exception as exc:
            # The architecture reads values off tensors as it is built, which no fake tensor has:
            # ViT, DeiT, BEiT, Swin and ConvNeXt take their drop-path rates from
            # torch.linspace(...).item(), RegNet its widths from a quantisation. Built again with
            # parameters and buffers on meta, the rest real; plain tensor attributes of such a
            # model stay real, and its step takes them as the constants they are.
            self.mode = FakeTensorMode(allow_non_fake_inputs=True)
            self.model = meta_built(name, num_classes, in_chans, self.mode, first_failure=exc, model_args=model_args)
        self.model.train()
        self._stages: dict[tuple[int, int], tuple[list[nn.Sequential], list[tuple[int, ...]]]] = {}

    def stages(self, n: int, image_size: int, strategy: str) -> tuple[list[nn.Sequential], list[tuple[int, ...]]]:
        """The stages mp and pp cut the model into (the same layers, balanced the same way), and
        each stage's input shape per image."""
        from trainer_backend.rank.models import ModelError, balanced_bounds, count_parameters, stage_layers

        if (n, image_size) not in self._stages:
            layers = stage_layers(self.model, self.name)
            if len(layers) < n:
                raise ModelError(f"model {self.name!r} has {len(layers)} layers in sequence, too few for {n} stages")
            shapes = self._shapes_in_sequence(layers, image_size)
            if shapes is None:
                raise ModelError(f"model {self.name!r} cannot be split into stages for {strategy}: "
                                 "its layers do not run in sequence")
            bounds = balanced_bounds([count_parameters(layer) for layer in layers], n)
            self._stages[(n, image_size)] = ([nn.Sequential(*layers[start:end]) for start, end in bounds],
                                             [shapes[start] for start, _ in bounds])
        return self._stages[(n, image_size)]

    def _shapes_in_sequence(self, layers: list[nn.Module], image_size: int) -> list[tuple[int, ...]] | None:
        """Each layer's input shape per image when run one after another, if that gives the
        model's output shape (the check split_into_stages makes, by shape); else None."""
        with self.mode, torch.no_grad():
            self.model.eval()
            try:
                probe = torch.empty(2, self.in_chans, image_size, image_size)
                expected = self.model(probe)
                shapes, got = [], probe
                for layer in layers:
                    shapes.append(tuple(got.shape[1:]))
                    got = layer(got)
                return shapes if got.shape == expected.shape else None
            except Exception:
                return None
            finally:
                self.model.train()

    def trace(self, module: nn.Module, config: RunConfig, shape: tuple[int, ...], amp_dtype: torch.dtype | None, *,
              first: bool = True, last: bool = True, optimizer_extra: int | None = None) -> StepTrace:
        """One training step of ``module`` on an input of ``shape`` with the run's optimizer."""
        from trainer_backend.rank.schedule import build_optimizer

        with TRACE_LOCK, self.mode:
            optimizer = build_optimizer(config, [p for p in module.parameters() if p.requires_grad])
            try:
                return trace_step(module, optimizer, shape, amp_dtype, first=first, last=last,
                                  label_smoothing=config.label_smoothing, optimizer_extra=optimizer_extra)
            except ValueError as exc:  # e.g. BatchNorm in training on one image
                raise EstimateError(f"one training step of {self.name!r} on {shape[0]} image(s) per device "
                                    f"fails: {exc}") from None
            except Exception as exc:  # an architecture fake tensors cannot step: one line, not a traceback
                raise EstimateError(f"one training step of {self.name!r} could not be counted under fake tensors: "
                                    f"{type(exc).__name__}: {exc}"[:400]) from None


_ON_META = threading.local()  # set in the thread building under parameters_on_meta()
_META_LOCK = threading.Lock()
_meta_builds = 0  # builds under way, in any thread: the patch stays while there is one
_registers: tuple = ()


def copy_once(copies: dict, tensor: torch.Tensor, make) -> torch.Tensor:
    """``make(tensor)`` the first time ``tensor`` is seen in ``copies``, the same copy after that, so
    that tied parameters and shared buffers stay one. The original is held beside its copy, so that
    its id is not reused by another tensor while ``copies`` lives."""
    if id(tensor) not in copies:
        data = make(tensor)
        copies[id(tensor)] = (tensor, nn.Parameter(data, requires_grad=tensor.requires_grad)
                              if isinstance(tensor, nn.Parameter) else data)
    return copies[id(tensor)][1]


def _to_meta(tensor: torch.Tensor | None) -> torch.Tensor | None:
    # One already on meta is a tied parameter assigned again (a head sharing the embedding): kept as it is.
    if tensor is None or tensor.device.type == "meta" or not getattr(_ON_META, "active", False):
        return tensor
    return copy_once(_ON_META.copies, tensor, lambda t: t.to("meta"))


def _parameter_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
    _registers[0](module, name, param)
    if param is not None:
        module._parameters[name] = _to_meta(module._parameters[name])


def _buffer_on_meta(module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
    _registers[1](module, name, tensor, persistent=persistent)
    if tensor is not None:
        module._buffers[name] = _to_meta(module._buffers[name])


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside (in this thread) put each parameter and buffer on the meta device as
    they register it: no memory, no initialisation work. Every other tensor of ``__init__`` stays
    real, so values read off those (``.item()``) are there. Models built at the same time in other
    threads (the dashboard's) are built as usual."""
    global _meta_builds, _registers
    with _META_LOCK:
        if _meta_builds == 0:
            _registers = (nn.Module.register_parameter, nn.Module.register_buffer)
            nn.Module.register_parameter, nn.Module.register_buffer = _parameter_on_meta, _buffer_on_meta
        _meta_builds += 1
    outer = getattr(_ON_META, "active", False)
    if not outer:
        _ON_META.copies = {}
    _ON_META.active = True
    try:
        yield
    finally:
        _ON_META.active = outer
        if not outer:
            _ON_META.copies = {}
        with _META_LOCK:
            _meta_builds -= 1
            if _meta_builds == 0:
                nn.Module.register_parameter, nn.Module.register_buffer = _registers


def faked(model: nn.Module, mode) -> nn.Module:
    """``model`` with each parameter and buffer replaced by a fake tensor of ``mode`` of the same
    shape, dtype and ``requires_grad`` (tied ones stay tied)."""
    copies: dict = {}
    with mode:
        for module in model.modules():
            for tensors in (module._parameters, module._buffers):
                for key, tensor in tensors.items():
                    if tensor is not None:
                        tensors[key] = copy_once(copies, tensor, lambda t: torch.empty(t.shape, dtype=t.dtype))
    return model


def meta_built(name: str, num_classes: int, in_chans: int, mode, *, first_failure: Exception,
               model_args: str = "{}") -> nn.Module:
    """timm's ``name`` built under ``parameters_on_meta``, then ``faked`` in ``mode``; a model that
    cannot be built so either is refused naming ``first_failure``, what the fake build met."""
    from trainer_backend.rank.models import create_model

    try:
        with parameters_on_meta():
            model = create_model(name, num_classes=num_classes, in_chans=in_chans, model_args=json.loads(model_args))
    except Exception:
        raise EstimateError(f"model {name!r} cannot be built without its weights to estimate its memory: "
                            f"{type(first_failure).__name__}: {first_failure}") from None
    return faked(model, mode)


TRACE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def fake_model(name: str, num_classes: int, in_chans: int, model_args: str = "{}") -> FakeModel:
    return FakeModel(name, num_classes, in_chans, model_args)


def trace_step(module: nn.Module, optimizer: torch.optim.Optimizer, shape: tuple[int, ...],
               amp_dtype: torch.dtype | None = None, *, first: bool = True, last: bool = True,
               label_smoothing: float = 0.0, optimizer_extra: int | None = None) -> StepTrace:
    """Count one training step of ``module`` (built under the active FakeTensorMode) on an input
    of ``shape``: as the training loop runs it, with the logits kept until the step ends. The
    first stage's input needs no gradient; a stage before the last is given its output's
    gradient as a pipeline's next stage sends it back. What the optimizer step adds does not
    depend on the batch: given as ``optimizer_extra`` (from a trace at another batch), the
    step is not run."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for group in optimizer.param_groups:
        # CUDA's default, whose temporaries are the larger (the host steps one tensor at a time),
        # and a tenth of the dispatches to trace.
        group["foreach"] = True
    tracker = LiveBytes(params, [*module.parameters(), *module.buffers()])
    try:
        with tracker:
            images = torch.empty(shape, requires_grad=not first)
            input_bytes = tracker.live
            context = (torch.autocast("cpu", dtype=amp_dtype) if amp_dtype is not None
                       else torch.autocast("cpu", enabled=False))
            with context:
                out = module(images)
                if last:
                    labels = torch.zeros(shape[0], dtype=torch.long)
                    loss = F.cross_entropy(out, labels, label_smoothing=label_smoothing)
            forward_kept, output_bytes = tracker.live, out.numel() * out.element_size()
            tracker.phase = "backward"
            if last:
                loss.backward()
                del loss, labels
            else:
                out.backward(torch.ones_like(out))
            del out, images
            backward_peak, grads_at_peak = tracker.peak, tracker.grads_at_peak
            after_backward = tracker.live
            if optimizer_extra is None:
                tracker.restart_peak()
                tracker.phase = "optimizer"
                optimizer.step()
                optimizer_extra = tracker.peak - after_backward
            optimizer.zero_grad()
    finally:
        tracker.close()
    return StepTrace(backward_peak, grads_at_peak, forward_kept, after_backward + optimizer_extra, input_bytes,
                     output_bytes, optimizer_extra, frozenset(tracker.blas_phases & {"forward", "backward"}))
