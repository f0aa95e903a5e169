"""Build your own network from ``pkg.module:Attr`` or ``path/to/file.py:Attr`` (an nn.Module class or a
function returning one), sized for the dataset the way timm models are, and check it before a run starts.

    model, names = build_custom_model("mynet.py:Net", {"width": 16}, num_classes=10, in_chans=1)
    check_custom_model("mynet.py:Net", {"width": 16}, num_classes=10, in_chans=1, image_size=16)  # or ModelError

The dataset's class count and channels go in as ``num_classes`` and ``in_chans`` where the callable takes
those names, or ``**kwargs`` (timm's and torchvision's factories: ``torchvision.models:resnet18``); a callable
that takes neither has its output's width checked against the classes. A model that is not given in_chans and
whose first convolution takes 3 channels is given a grey dataset's images as 3 equal channels.
Every failure is one ``ModelError`` line naming the path, what went wrong and the last line of the user's
file the traceback passed through.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from typing import Any

import torch
from torch import nn

from contract.model_source import ModelError, is_file_path, source_file, split_model_spec

SIZED_BY = ("num_classes", "in_chans")  # timm's names for what the dataset decides
# Set on a model whose grey input is repeated to its first convolution's channels (fit_input_channels).
REPEATED_TO = "parallax_channels_repeated_to"
PROBE_BATCH = 2


def load_callable(name: str):
    """The class or function ``name`` points at, imported (a file is imported under a private module name)."""
    location, attr = split_model_spec(name)
    path = source_file(name)
    try:
        if is_file_path(location):
            module_name = f"parallax_user_model_{abs(hash(path)):x}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # dataclasses and pickling look a class's module up here
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(location)
    except Exception as exc:  # SyntaxError, ImportError, anything its top level raises
        raise ModelError(f"model {name!r}: not importable: {_why(exc, path)}") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ModelError(f"model {name!r}: not importable: {os.path.basename(path)} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"model {name!r}: not a module: {attr} is a {type(target).__name__}, not an nn.Module "
                           "class or a function returning one")
    return target


def sized_by(factory) -> tuple[str, ...]:
    """Which of num_classes and in_chans ``factory`` may be given: those it names as parameters, or both where
    it takes ``**kwargs`` (timm's and torchvision's factories pass those on to the model's class)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: give it nothing
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return SIZED_BY
    return tuple(n for n in SIZED_BY if n in parameters
                 and parameters[n].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


def named_parameters(factory) -> tuple[str, ...]:
    """The names of SIZED_BY that ``factory`` declares itself (not only through ``**kwargs``)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return ()
    return tuple(n for n in SIZED_BY if n in parameters and parameters[n].kind is not inspect.Parameter.VAR_KEYWORD)


def check_sizes_against_dataset(name: str, model_args: dict, *, num_classes: int, in_chans: int) -> None:
    """num_classes or in_chans given in the model's arguments must be the dataset's: ModelError in one line."""
    for key, wanted, what in (("num_classes", num_classes, "classes"), ("in_chans", in_chans, "channels")):
        if key in model_args and model_args[key] != wanted:
            raise ModelError(f"model {name!r}: model_args gives {key} {model_args[key]!r}, but the dataset has "
                             f"{wanted} {what}: give {wanted}, or leave {key} out (the dataset's is passed where the "
                             "model takes it)")


def build_custom_model(name: str, model_args: dict | None, *, num_classes: int,
                       in_chans: int) -> tuple[nn.Module, tuple[str, ...]]:
    """(the network, the names of SIZED_BY it was given). Where the callable takes ``**kwargs`` it is offered
    both sizes, and built again without one its model's class refuses (torchvision's take num_classes, not
    in_chans), or without both where it raises otherwise with them (its output's width is then checked); sizes
    given in ``model_args`` are the user's and always passed, once checked against the dataset.
    A model not given in_chans whose first convolution takes more channels than a 1-channel dataset has sees
    each grey image as that many equal channels (``fit_input_channels``)."""
    factory = load_callable(name)
    path = source_file(name)
    args = dict(model_args or {})
    check_sizes_against_dataset(name, args, num_classes=num_classes, in_chans=in_chans)
    insisted = set(SIZED_BY) & set(args)
    declared = named_parameters(factory)
    args.update({n: v for n, v in (("num_classes", num_classes), ("in_chans", in_chans))
                 if n in sized_by(factory) and n not in insisted})
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as exc:
        what = "takes arguments it was not given" if "missing" in str(exc) else "does not take the arguments given"
        raise ModelError(f"model {name!r}: {what} ({exc}); give its keyword arguments in --model-args as a JSON "
                         'object, e.g. {"depth": 34} (num_classes and in_chans come from the dataset)') from None
    except ValueError:
        pass  # no signature to check against
    failure: str | None = None  # its first failure that no refused size explains: what the user is shown
    while True:
        try:
            model = factory(**args)
            break
        except Exception as exc:
            offered = [n for n in SIZED_BY if n in args and n not in declared and n not in insisted]
            refused = [n for n in offered if isinstance(exc, TypeError)
                       and f"unexpected keyword argument '{n}'" in str(exc)]
            if refused:  # offered through **kwargs and refused by the class they reach: built again without it
                del args[refused[0]]
                continue
            failure = failure or f"model {name!r}: raises when built with {args}: {_why(exc, path)}"
            if not offered:
                raise ModelError(failure) from None
            # Refused some other way (a ValueError naming unknown options, say): the sizes were only offered,
            # so it is built once more without them, and its output's width is checked instead.
            for size in offered:
                del args[size]
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {name!r}: not a module: calling it gave a {type(model).__name__}, not an "
                           "nn.Module")
    if "in_chans" in args and "in_chans" not in declared and "in_chans" not in insisted:
        conv = stem_convolution(model, in_chans)
        if conv is not None and conv.in_channels != in_chans:
            del args["in_chans"]  # taken by a **kwargs that drops it (torchvision's MobileNetV3): not given
    given = tuple(n for n in SIZED_BY if n in args)
    if "in_chans" not in given:
        fit_input_channels(model, in_chans)
    return model, given


def first_convolution(model: nn.Module) -> nn.Conv2d | None:
    """The model's first 2-D convolution in the order its modules were made: its stem in every torchvision
    and timm CNN (and ViT's patch projection)."""
    return next((m for m in model.modules() if isinstance(m, nn.Conv2d) and m.in_channels > 0), None)


class _StemReached(Exception):
    """Raised by ``stem_convolution``'s probe where the forward reaches its first convolution."""


STEM_PROBE_SIZE = 64  # pixels a side: what the layers before a stem may check (a patch size, a minimum) pass


def stem_convolution(model: nn.Module, in_chans: int) -> nn.Conv2d | None:
    """The convolution that takes the model's input. The first one made is that in every torchvision and timm
    CNN; where it does not take the dataset's ``in_chans`` (a model may make its head before its stem), a
    forward of a zero batch is run up to the first convolution it reaches, and stopped there, so that nothing
    past the layers before the stem runs. Where that forward fails first, the first one made stands."""
    first = first_convolution(model)
    if first is None or first.in_channels == in_chans:
        return first
    reached: list[nn.Conv2d] = []

    def stop(module: nn.Module, args: tuple) -> None:
        reached.append(module)
        raise _StemReached

    handles = [m.register_forward_pre_hook(stop) for m in model.modules()
               if isinstance(m, nn.Conv2d) and m.in_channels > 0]
    weight = first.weight
    try:
        with torch.no_grad():
            model(torch.zeros(1, in_chans, STEM_PROBE_SIZE, STEM_PROBE_SIZE, device=weight.device, dtype=weight.dtype))
    except Exception:  # _StemReached, or the forward failed before any convolution
        pass
    finally:
        for handle in handles:
            handle.remove()
    return reached[0] if reached else first


def input_channels(model: nn.Module, in_chans: int) -> int:
    """The channels ``model`` takes: ``in_chans`` (the dataset's), or more where grey images are repeated."""
    return getattr(model, REPEATED_TO, in_chans)


def repeat_channels(channels: int, module: nn.Module, args: tuple) -> tuple:
    """A forward pre-hook: (N, 1, H, W) -> (N, channels, H, W), the one channel seen ``channels`` times (no copy)."""
    return (args[0].expand(-1, channels, -1, -1), *args[1:])


def fit_input_channels(model: nn.Module, in_chans: int) -> None:
    """Make ``model``, not given in_chans, take a grey dataset's images: where its stem convolution takes C
    channels and the dataset has 1, each image is given as C equal channels (what torchvision's
    Grayscale(num_output_channels=C) does). Any other difference is left to the forward check, which names it
    (``check_output``)."""
    if in_chans != 1:
        return
    conv = stem_convolution(model, in_chans)
    if conv is None or conv.in_channels == in_chans:
        return
    model.register_forward_pre_hook(functools.partial(repeat_channels, conv.in_channels))
    setattr(model, REPEATED_TO, conv.in_channels)


def check_custom_model(name: str, model_args: dict | None, *, num_classes: int, in_chans: int,
                       image_size: int) -> tuple[str, ...]:
    """Import ``name``, build it on the meta device (no memory, no weights initialised) and run one
    fake forward at the run's size; ModelError in one line where any step fails. Returns the names
    of SIZED_BY it takes."""
    with torch.device("meta"):
        model, given = build_custom_model(name, model_args, num_classes=num_classes, in_chans=in_chans)
    try:
        check_output(name, model, num_classes=num_classes, in_chans=in_chans, image_size=image_size,
                     device=torch.device("meta"))
    except ModelError:
        # An op without a meta kernel, or one that reads a value (.item()), fails on meta where it
        # works on real tensors: the model is built again on the CPU, whose verdict stands.
        model, given = build_custom_model(name, model_args, num_classes=num_classes, in_chans=in_chans)
        check_output(name, model, num_classes=num_classes, in_chans=in_chans, image_size=image_size)
    return given


@torch.no_grad()
def check_output(name: str, model: nn.Module, *, num_classes: int, in_chans: int, image_size: int,
                 device: torch.device | None = None) -> None:
    """One forward of a fake batch in evaluation mode, then one in training mode (which leaves BatchNorm's
    running statistics moved: the model checked is not the one trained); each output must be
    (batch, num_classes) logits. Some models return more in training: torchvision's googlenet and
    inception_v3 add their auxiliary classifiers' logits, which the loss cannot take."""
    path = source_file(name)
    probe = torch.zeros(PROBE_BATCH, in_chans, image_size, image_size, device=device)
    batch = f"a {PROBE_BATCH}x{in_chans}x{image_size}x{image_size} batch"
    expected = (PROBE_BATCH, num_classes)
    was_training = model.training
    model.eval()
    try:
        out = model(probe)
    except Exception as exc:
        conv = first_convolution(model)
        hint = (f"; its first convolution takes {conv.in_channels} channel(s) and the dataset has {in_chans}: choose "
                f"{conv.in_channels} bands with --bands (multi-band files), a dataset of that many channels, or a "
                "model that takes in_chans" if conv is not None and conv.in_channels != in_chans
                and input_channels(model, in_chans) == in_chans else _too_small_hint(exc))
        raise ModelError(f"model {name!r}: raises in forward on {batch}: {_why(exc, path)}{hint}") from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"model {name!r}: wrong output shape: {batch} gave {got}, the dataset needs {expected} "
                         f"(batch, {num_classes} classes); take num_classes in its arguments or size its last layer "
                         "for the dataset")
    # torchvision's GoogLeNet and Inception3: auxiliary classifiers that run in training only, on the middle layers.
    aux = ('; turn its auxiliary classifiers off with {"aux_logits": false} in its model arguments'
           if getattr(model, "aux_logits", None) is True else "")
    model.train()
    try:
        with torch.random.fork_rng(devices=[]):  # its dropout's draws leave the run's seeded ones as they were
            out = model(probe)
    except Exception as exc:
        raise ModelError(f"model {name!r}: raises in forward in training mode on {batch} (evaluation mode works): "
                         f"{_why(exc, path)}{aux or _too_small_hint(exc)}") from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"model {name!r}: in training mode {batch} gives {got}, not the {expected} logits it gives "
                         "in evaluation mode, and the loss takes those alone"
                         f"{aux or '; return the logits alone in training too (wrap it in a module of your own)'}")


# What torch says where the images are smaller than a model's layers take.
TOO_SMALL = ("Kernel size can't be greater than actual input size", "Output size is too small")


def _too_small_hint(exc: BaseException) -> str:
    return "; the images are too small for it: try a larger image size" if any(
        text in str(exc) for text in TOO_SMALL) else ""


def _why(exc: BaseException, path: str) -> str:
    """'TypeError: ... (at mynet.py:12 in forward)': the error and the last frame in the user's file."""
    text = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == path]
    if isinstance(exc, SyntaxError) and exc.filename and os.path.abspath(exc.filename) == path:
        return f"{what} (at {os.path.basename(path)}:{exc.lineno})"
    if frames:
        last = frames[-1]
        return f"{what} (at {os.path.basename(path)}:{last.lineno} in {last.name})"
    return what
