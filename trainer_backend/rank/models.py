"""Models: any timm architecture by name, pretrained weights without hanging offline, and the
cut into sequential stages that model parallel needs.

    model = create_model("resnet18", num_classes=10, in_chans=1)
    stages = split_into_stages(model, 2, in_chans=1, image_size=32)
"""

from __future__ import annotations

import difflib
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import timm
import torch
from timm.models import split_model_name_tag
from torch import nn

from contract.config import MAX_MODEL_NAME_LENGTH, shown, shown_length
from contract.model_source import ModelError, is_custom_model
from trainer_backend.rank.custom_model import REPEATED_TO

HUB_PROBE_TIMEOUT_S = 3.0


def check_model_name(name: str) -> None:
    """Raise ModelError naming ``name`` and the closest timm names when timm does not know it, or
    does not know the pretrained tag after its dot (``resnet18.a1_in1k``). A custom model's path
    (``pkg.module:Attr``) is checked by importing it (custom_model.py), not here."""
    if is_custom_model(name):
        return
    if len(name) > MAX_MODEL_NAME_LENGTH:  # before the closest-name search, whose cost grows with the name
        raise ModelError(f"model {shown_length(name)} is not allowed: a timm model name has at most "
                         f"{MAX_MODEL_NAME_LENGTH} characters, e.g. resnet18")
    if timm.is_model(name):
        arch, tag = split_model_name_tag(name)
        if not tag or name in timm.list_pretrained(f"{arch}.*"):
            return
        tags = [known.split(".", 1)[1] for known in timm.list_pretrained(f"{arch}.*")]
        known = f"its tags are {', '.join(tags[:8])}{', …' if len(tags) > 8 else ''}" if tags else "it has none"
        raise ModelError(f"model {shown(name)}: {shown(arch)} has no pretrained tag {shown(tag)} ({known}); "
                         f"give a known tag or the bare name {arch}")
    close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models() for the names"
    raise ModelError(f"unknown model {shown(name)}: not a timm architecture{hint}")


def create_model(name: str, *, num_classes: int, in_chans: int, pretrained: bool = False,
                 model_args: dict | None = None) -> nn.Module:
    """Build a timm model (or your own, ``pkg.module:Attr``) sized for the dataset, with ``model_args``
    as its keyword arguments. Pretrained weights come from the local cache first; the hub is only
    asked when it answers, so an offline machine fails in seconds, not after timm's ~46 s of retries."""
    return build_model(name, num_classes=num_classes, in_chans=in_chans, pretrained=pretrained,
                       model_args=model_args)[0]


def build_model(name: str, *, num_classes: int, in_chans: int, pretrained: bool = False,
                model_args: dict | None = None) -> tuple[nn.Module, dict]:
    """(the model, the keyword arguments its factory was called with): ``model_args`` and the sizes it was
    given, which is what a checkpoint needs to build it again (``timm.create_model(name, **kwargs)``)."""
    if is_custom_model(name):
        from trainer_backend.rank.custom_model import build_custom_model

        model, given = build_custom_model(name, model_args, num_classes=num_classes, in_chans=in_chans)
        sizes = {"num_classes": num_classes, "in_chans": in_chans}
        return model, {**(model_args or {}), **{n: sizes[n] for n in given}}
    check_model_name(name)
    for key, wanted, what in (("num_classes", num_classes, "classes"), ("in_chans", in_chans, "channels")):
        if key in (model_args or {}) and model_args[key] != wanted:
            raise ModelError(f"model {name!r}: model_args gives {key} {model_args[key]!r}, but the dataset has "
                             f"{wanted} {what}: give {wanted}, or leave {key} out (the dataset's is passed)")
    built_with: dict = {**(model_args or {}), "num_classes": num_classes, "in_chans": in_chans}
    kwargs = dict(built_with)
    if pretrained:
        local = _cached_weights(name)
        if local is not None:
            kwargs["pretrained_cfg_overlay"] = {"file": str(local), "hf_hub_id": None, "url": None}
        elif not _hub_reachable():
            raise ModelError(
                f"pretrained weights for {name!r} are not in the local cache "
                f"({_hf_cache_dir()}) and the model hub cannot be reached: "
                "run once with network access, copy the weights into the cache, or train without --pretrained"
            )
    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs), built_with
    except RuntimeError as exc:
        if pretrained and "pretrained" in str(exc).lower():
            raise ModelError(f"model {name!r} has no pretrained weights: {exc}") from None
        raise


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _cached_weights(name: str) -> Path | None:
    """The weights file for ``name`` if the Hugging Face or torch.hub cache already holds it."""
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:  # timm raises several types for names without a default config
        cfg = None
    if cfg is None:
        return None
    if cfg.hf_hub_id:
        from huggingface_hub import try_to_load_from_cache

        candidates = [cfg.hf_hub_filename] if cfg.hf_hub_filename else []
        candidates += ["model.safetensors", "pytorch_model.bin"]
        for filename in candidates:
            found = try_to_load_from_cache(cfg.hf_hub_id, filename)
            if isinstance(found, str) and os.path.exists(found):
                return Path(found)
    if cfg.url:
        path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(cfg.url).path)
        if path.exists():
            return path
    return None


def _hub_reachable() -> bool:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        with socket.create_connection((host, 443), timeout=HUB_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


ADD_STAGES = ("add a parallax_stages() method returning its sub-modules in the order they run (each one's output "
              "the next one's input, the last one's the logits)")


def stage_layers(model: nn.Module, label: str) -> list[nn.Module]:
    """The layers stages are cut from: the model's own ``parallax_stages()`` where it has one (a custom
    model says where it may be cut), else its top-level children with plain Sequentials opened up."""
    declared = getattr(model, "parallax_stages", None)
    if declared is None:
        return flatten_sequential(model)
    layers = list(declared())
    if not layers or not all(isinstance(layer, nn.Module) for layer in layers):
        raise ModelError(f"model {label!r}: parallax_stages() must return a list of its nn.Module parts in the "
                         f"order they run, got {shown([type(layer).__name__ for layer in layers])}")
    return layers


def flatten_sequential(module: nn.Module) -> list[nn.Module]:
    """Top-level children, with plain nn.Sequential containers opened up (their forward is just
    'one after another', so opening them keeps the computation and gives finer cut points)."""
    layers: list[nn.Module] = []
    for child in module.children():
        if isinstance(child, nn.Sequential) and type(child).forward is nn.Sequential.forward:
            layers.extend(flatten_sequential(child))
        else:
            layers.append(child)
    return layers


def split_into_stages(model: nn.Module, n_stages: int, *, in_chans: int, image_size: int, name: str = "") -> list[nn.Sequential]:
    """Cut ``model`` into ``n_stages`` consecutive stages balanced by parameter count.

    Only models whose children run one after another can be cut this way (ResNet, EfficientNet,
    MobileNet, ConvNeXt). We check that by running the layers in sequence on a probe batch and
    comparing with the whole model; a ViT, whose tokens are parameters outside its children,
    fails the check and gets a clear error instead of a silently different network.
    """
    label = name or type(model).__name__
    repeated = getattr(model, REPEATED_TO, None)
    if repeated is not None:
        raise ModelError(f"model {label!r} takes {repeated} channels and is given the dataset's grey images as "
                         f"{repeated} equal channels, which mp and pp cannot cut into stages: use single, dp, ddp or "
                         "fsdp, or a model that takes in_chans")
    layers = stage_layers(model, label)
    if len(layers) < n_stages:
        raise ModelError(f"model {label!r} has {len(layers)} layers in sequence, too few for {n_stages} stages"
                         + (f"; {ADD_STAGES}" if is_custom_model(label) else ""))
    if not _sequential_matches(model, layers, in_chans, image_size):
        if is_custom_model(label):
            raise ModelError(f"model {label!r} cannot be split into stages for mp and pp: its children do not run "
                             f"one after another; {ADD_STAGES}, or use single, dp, ddp or fsdp")
        raise ModelError(
            f"model {label!r} cannot be split into stages for mp: its layers do not run in sequence "
            "(e.g. ViT's class and position tokens). Use single, dp or ddp, or a ResNet, EfficientNet, "
            "MobileNet or ConvNeXt"
        )
    sizes = [count_parameters(layer) for layer in layers]
    bounds = balanced_bounds(sizes, n_stages)
    return [nn.Sequential(*layers[start:end]) for start, end in bounds]


@torch.no_grad()
def _sequential_matches(model: nn.Module, layers: list[nn.Module], in_chans: int, image_size: int) -> bool:
    was_training = model.training
    model.eval()  # BatchNorm in train mode would use batch statistics and update buffers
    try:
        probe = torch.randn(2, in_chans, image_size, image_size, generator=torch.Generator().manual_seed(0))
        expected = model(probe)
        got = probe
        for layer in layers:
            got = layer(got)
        return got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    except Exception:
        return False
    finally:
        model.train(was_training)


def balanced_bounds(sizes: list[int], parts: int) -> list[tuple[int, int]]:
    """Split ``sizes`` into ``parts`` non-empty consecutive runs minimising the largest sum
    (the classic linear-partition dynamic programme; a few dozen layers, so O(parts * n^2) is nothing)."""
    n = len(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    inf = float("inf")
    # best[k][i]: smallest possible largest part when the first i layers form k parts.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    bounds, end = [], n
    for k in range(parts, 0, -1):
        start = cut[k][end]
        bounds.append((start, end))
        end = start
    return bounds[::-1]


class StagedModel(nn.Module):
    """Model parallel: stage i lives on devices[i]; activations hop from device to device.
    Only one stage works at a time — the cost that pipeline parallel exists to remove."""

    def __init__(self, stages: list[nn.Sequential], devices: list[torch.device], source: nn.Module):
        super().__init__()
        self.stages = nn.ModuleList(stage.to(device) for stage, device in zip(stages, devices))
        self.devices = devices
        # A list, not an attribute, so the source model is not registered twice as a submodule;
        # its state_dict keeps timm's names, which is what a checkpoint should hold.
        self._source = [source]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage, device in zip(self.stages, self.devices):
            x = stage(x.to(device, non_blocking=True))
        return x

    @property
    def source(self) -> nn.Module:
        return self._source[0]
