"""Models: timm by name, fast offline failure for pretrained weights, and the cut for mp."""

from __future__ import annotations

import time

import pytest
import torch

from trainer_backend.rank.models import (
    ModelError,
    StagedModel,
    balanced_bounds,
    create_model,
    split_into_stages,
)


def test_create_model_sizes_head_and_stem_for_the_dataset():
    model = create_model("resnet18", num_classes=10, in_chans=1)
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 10)


def test_unknown_model_is_named_with_suggestions():
    with pytest.raises(ModelError) as info:
        create_model("resnet19", num_classes=10, in_chans=3)
    assert "'resnet19'" in str(info.value) and "resnet18" in str(info.value)


def test_pretrained_offline_fails_fast_naming_the_model(monkeypatch, tmp_path):
    from huggingface_hub import constants

    # An empty cache and a hub that refuses connections: what an offline machine sees.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    start = time.perf_counter()
    with pytest.raises(ModelError) as info:
        create_model("resnet18", num_classes=10, in_chans=3, pretrained=True)
    assert time.perf_counter() - start < 10
    assert "'resnet18'" in str(info.value) and "cache" in str(info.value)


def test_balanced_bounds_minimise_the_largest_stage():
    assert balanced_bounds([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert balanced_bounds([8, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert balanced_bounds([1, 2, 3], 3) == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv3_small_100", "efficientnet_b0"])
def test_stages_compute_exactly_what_the_whole_model_computes(name):
    torch.manual_seed(0)
    model = create_model(name, num_classes=10, in_chans=3).eval()
    stages = split_into_stages(model, 2, in_chans=3, image_size=32, name=name)
    staged = StagedModel(stages, [torch.device("cpu")] * 2, source=model).eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(staged(x), model(x))
    sizes = [sum(p.numel() for p in s.parameters()) for s in stages]
    assert min(sizes) > 0
    # The checkpoint keeps timm's own parameter names.
    assert set(staged.source.state_dict()) == set(model.state_dict())


def test_models_that_do_not_run_in_sequence_are_refused_by_name():
    model = create_model("vit_tiny_patch16_224", num_classes=10, in_chans=3, )
    with pytest.raises(ModelError, match="'vit_tiny_patch16_224' cannot be split"):
        split_into_stages(model, 2, in_chans=3, image_size=224, name="vit_tiny_patch16_224")


def test_pretrained_weights_in_the_local_cache_load_offline(monkeypatch, tmp_path):
    from huggingface_hub import constants
    from safetensors.torch import save_file

    # Lay out a Hugging Face cache entry holding known weights for timm's default resnet18 tag.
    repo = tmp_path / "hf" / "models--timm--resnet18.a1_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    source = create_model("resnet18", num_classes=1000, in_chans=3)
    torch.nn.init.constant_(source.conv1.weight, 0.125)
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, snapshot / "model.safetensors")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")

    model = create_model("resnet18", num_classes=10, in_chans=3, pretrained=True)
    assert torch.all(model.conv1.weight == 0.125)
    assert model.fc.out_features == 10  # the 1000-class head is replaced for the dataset


def test_an_unknown_strategy_name_fails_naming_the_strategies_there_are():
    from contract.config import STRATEGIES
    from trainer_backend.rank.strategies.registry import strategy_class

    assert {name: strategy_class(name).name for name in STRATEGIES} == {name: name for name in STRATEGIES}
    with pytest.raises(ValueError, match=r"Unknown strategy \('zero3'\); allowed: single, dp, ddp, mp, pp, fsdp"):
        strategy_class("zero3")
