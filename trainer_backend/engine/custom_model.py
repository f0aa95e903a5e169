"""Build your own network from ``pkg.module:Attr`` or ``path/to/file.py:Attr`` (an nn.Module class or a
function returning one), sized for the dataset the way timm models are, and check it before a run starts.

    model, names = build_custom_model("mynet.py:Net", {"width": 16}, num_classes=10, in_chans=1)
    check_custom_model("mynet.py:Net", {"width": 16}, num_classes=10, in_chans=1, image_size=16)  # or ModelError

The dataset's class count and channels go in as ``num_classes`` and ``in_chans`` where the callable takes
those names (timm's); a callable that takes neither has its output's width checked against the classes.
Every failure is one ``ModelError`` line naming the path, what went wrong and the last line of the user's
file the traceback passed through.
"""

from __future__ import annotations

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
    """Which of num_classes and in_chans ``factory`` takes by name."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: give it nothing
        return ()
    return tuple(n for n in SIZED_BY if n in parameters
                 and parameters[n].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


def build_custom_model(name: str, model_args: dict | None, *, num_classes: int,
                       in_chans: int) -> tuple[nn.Module, tuple[str, ...]]:
    """(the network, the names of SIZED_BY it was given)."""
    factory = load_callable(name)
    path = source_file(name)
    args = dict(model_args or {})
    given = sized_by(factory)
    args.update({n: v for n, v in (("num_classes", num_classes), ("in_chans", in_chans)) if n in given})
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as exc:
        what = "takes arguments it was not given" if "missing" in str(exc) else "does not take the arguments given"
        raise ModelError(f"model {name!r}: {what} ({exc}); give its keyword arguments in --model-args as a JSON "
                         'object, e.g. {"depth": 34} (num_classes and in_chans come from the dataset)') from None
    except ValueError:
        pass  # no signature to check against
    try:
        model = factory(**args)
    except Exception as exc:
        raise ModelError(f"model {name!r}: raises when built with {args}: {_why(exc, path)}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {name!r}: not a module: calling it gave a {type(model).__name__}, not an "
                           "nn.Module")
    return model, given


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
    """One forward of a fake batch; the output must be (batch, num_classes) logits."""
    path = source_file(name)
    probe = torch.zeros(PROBE_BATCH, in_chans, image_size, image_size, device=device)
    was_training = model.training
    model.eval()
    try:
        out = model(probe)
    except Exception as exc:
        raise ModelError(f"model {name!r}: raises in forward on a {PROBE_BATCH}x{in_chans}x{image_size}x"
                           f"{image_size} batch: {_why(exc, path)}") from None
    finally:
        model.train(was_training)
    expected = (PROBE_BATCH, num_classes)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"model {name!r}: wrong output shape: a {PROBE_BATCH}x{in_chans}x{image_size}x{image_size} "
                           f"batch gave {got}, the dataset needs {expected} (batch, {num_classes} classes); take "
                           "num_classes in its arguments or size its last layer for the dataset")


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
