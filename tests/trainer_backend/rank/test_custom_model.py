"""Your own model (``path/file.py:Attr``, ``pkg.module:Attr``): built sized for the dataset, checked on the
meta device with one fake forward, and every way it can be wrong refused in one line naming the path, what
went wrong and the line of the user's file; mp and pp cut it where it says (``parallax_stages()``)."""

from __future__ import annotations

import hashlib
import sys
import textwrap

import pytest
import torch
from torch import nn

from tests.plugins.user_net import NET_SOURCE
from contract.config import ConfigError, RunConfig
from contract.model_source import ModelError, model_source, with_model_source
from trainer_backend.rank.custom_model import build_custom_model, check_custom_model, sized_by
from trainer_backend.rank.models import create_model, split_into_stages

NETS = "import torch\n" + NET_SOURCE + textwrap.dedent('''


    class Fixed(nn.Module):
        """Takes neither num_classes nor in_chans: 7 logits from 1-channel 16 px images."""
        def __init__(self):
            super().__init__()
            self.flat = nn.Flatten()
            self.head = nn.Linear(16 * 16, 7)

        def forward(self, x):
            return self.head(self.flat(x))


    class Branchy(nn.Module):
        """Its children do not run one after another (a residual sum in forward)."""
        def __init__(self, num_classes=10, in_chans=3):
            super().__init__()
            self.stem = nn.Conv2d(in_chans, 4, 3, padding=1)
            self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.head = nn.Linear(4, num_classes)

        def forward(self, x):
            y = self.stem(x)
            return self.head(self.pool(y + y.relu()))


    class Staged(Branchy):
        """The same, saying where it may be cut."""
        def __init__(self, num_classes=10, in_chans=3):
            super().__init__(num_classes, in_chans)
            self.block = Residual(self.stem)

        def forward(self, x):
            return self.head(self.pool(self.block(x)))

        def parallax_stages(self):
            return [self.block, self.pool, self.head]


    class Residual(nn.Module):
        def __init__(self, stem):
            super().__init__()
            self.stem = stem

        def forward(self, x):
            y = self.stem(x)
            return y + y.relu()


    def make_net(width=8, num_classes=10, in_chans=3):
        return Net(width, num_classes, in_chans)


    def not_a_module(num_classes=10):
        return "a string"


    class Explodes(nn.Module):
        def __init__(self, num_classes=10, in_chans=3):
            super().__init__()
            self.head = nn.Linear(in_chans, num_classes)

        def forward(self, x):
            return self.head(x.mean((2, 3))) + undefined_name


    NOT_CALLABLE = 3
''')

LINE_OF_UNDEFINED = next(n for n, line in enumerate(NETS.splitlines(), 1) if "undefined_name" in line)


@pytest.fixture
def nets(tmp_path):
    path = tmp_path / "mynet.py"
    path.write_text(NETS)
    return path


def check(spec: str, args: dict | None = None, **size):
    return check_custom_model(spec, args, **{"num_classes": 10, "in_chans": 1, "image_size": 16, **size})


def test_a_class_from_a_file_is_built_with_its_args_and_the_datasets_sizes(nets):
    model, given = build_custom_model(f"{nets}:Net", {"width": 6}, num_classes=10, in_chans=1)
    assert given == ("num_classes", "in_chans")
    assert model.head.out_features == 10 and model.head.in_features == 6 and model.features[0].in_channels == 1
    assert model(torch.zeros(3, 1, 16, 16)).shape == (3, 10)


def test_a_function_and_an_importable_module_path_are_built_too(nets):
    assert check(f"{nets}:make_net", {"width": 4}) == ("num_classes", "in_chans")
    model = create_model("tests.plugins.tiny_net:TinyNet", num_classes=5, in_chans=1)
    assert model.head.out_features == 5
    assert sized_by(type(model)) == ("num_classes", "in_chans")


def test_the_check_builds_on_the_meta_device_and_takes_no_real_memory(nets):
    # 50k x 50k floats would be 10 GB on the CPU; on meta it costs nothing.
    assert check(f"{nets}:Net", {"width": 50_000}) == ("num_classes", "in_chans")


def test_a_model_taking_neither_size_has_its_output_width_checked(nets):
    assert check(f"{nets}:Fixed", num_classes=7) == ()
    with pytest.raises(ModelError) as caught:
        check(f"{nets}:Fixed")
    assert str(caught.value) == (f"model '{nets}:Fixed': wrong output shape: a 2x1x16x16 batch gave (2, 7), the "
                                 "dataset needs (2, 10) (batch, 10 classes); take num_classes in its arguments or "
                                 "size its last layer for the dataset")


@pytest.mark.parametrize("attr, args, says", [
    ("Net", None, "takes arguments it was not given (missing a required argument: 'width')"),
    ("Net", {"width": 4, "depth": 3}, "does not take the arguments given (got an unexpected keyword argument 'depth')"),
    ("not_a_module", None, "not a module: calling it gave a str, not an nn.Module"),
    ("NOT_CALLABLE", None, "not a module: NOT_CALLABLE is a int"),
    ("Missing", None, "not importable: mynet.py has no 'Missing'"),
    ("Explodes", None, "raises in forward on a 2x1x16x16 batch: NameError: name 'undefined_name' is not defined "
                       f"(at mynet.py:{LINE_OF_UNDEFINED} in forward)"),
])
def test_each_broken_model_is_refused_in_one_line_naming_the_path(nets, attr, args, says):
    with pytest.raises(ModelError) as caught:
        check(f"{nets}:{attr}", args)
    message = str(caught.value)
    assert message.startswith(f"model '{nets}:{attr}': ") and "\n" not in message
    assert says in message


def test_a_file_that_does_not_import_is_refused_at_its_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\nraise ImportError('needs the gpu extras')\n")
    with pytest.raises(ModelError, match=r"not importable: ImportError: needs the gpu extras \(at bad.py:3 in <module>\)"):
        check(f"{bad}:Net")
    typo = tmp_path / "typo.py"
    typo.write_text("class Net(:\n")
    with pytest.raises(ModelError, match=r"not importable: SyntaxError: .* \(at typo.py:1\)"):
        check(f"{typo}:Net")
    with pytest.raises(ModelError, match=r"not importable: .*nope.py is not a file"):
        check(f"{tmp_path}/nope.py:Net")
    with pytest.raises(ModelError, match=r"model 'no_such_pkg.nets:Net': not importable: no module named"):
        check("no_such_pkg.nets:Net")


def test_mp_cuts_a_model_where_parallax_stages_says_and_refuses_one_it_cannot_cut(nets):
    staged = create_model(f"{nets}:Staged", num_classes=10, in_chans=1)
    stages = split_into_stages(staged, 2, in_chans=1, image_size=16, name=f"{nets}:Staged")
    probe = torch.randn(2, 1, 16, 16)
    assert torch.allclose(stages[1](stages[0](probe)), staged.eval()(probe))
    assert staged.block in list(stages[0]) + list(stages[1])
    branchy = create_model(f"{nets}:Branchy", num_classes=10, in_chans=1)
    with pytest.raises(ModelError) as caught:
        split_into_stages(branchy, 2, in_chans=1, image_size=16, name=f"{nets}:Branchy")
    assert "add a parallax_stages() method returning its sub-modules in the order they run" in str(caught.value)
    # The plain sequential children of Net are cut the way timm models are.
    net = create_model(f"{nets}:Net", num_classes=10, in_chans=1, model_args={"width": 4})
    assert len(split_into_stages(net, 2, in_chans=1, image_size=16, name=f"{nets}:Net")) == 2


def test_model_args_must_be_a_json_object_whose_sizes_are_whole_numbers():
    assert RunConfig(model="a.py:Net", model_args='{ "depth": 34, "b": [1] }').model_args == '{"b": [1], "depth": 34}'
    assert RunConfig(model="a.py:Net", model_args={"depth": 34}).model_kwargs == {"depth": 34}
    assert RunConfig(model="a.py:Net", model_args={"num_classes": 10, "in_chans": 1}).model_kwargs["num_classes"] == 10
    for bad, says in [("[34]", "is not allowed: give the model's keyword arguments as a JSON object"),
                      ("{depth: 34}", "is not JSON"),
                      ('{"num_classes": "ten"}', "model_args gives num_classes 'ten', which is not allowed: give the "
                                                 "dataset's class count as a whole number, or leave it out"),
                      ('{"in_chans": 0}', "model_args gives in_chans 0, which is not allowed")]:
        with pytest.raises(ConfigError) as caught:
            RunConfig(model="a.py:Net", model_args=bad)
        assert caught.value.field == "model_args" and says in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="pretrained is not allowed with model 'a.py:Net'"):
        RunConfig(model="a.py:Net", pretrained=True)
    with pytest.raises(ConfigError, match="model 'a.py:' is not allowed: give a timm name"):
        RunConfig(model="a.py:")


def test_the_launch_records_the_absolute_file_and_its_sha256(nets, monkeypatch):
    monkeypatch.chdir(nets.parent)
    config = with_model_source(RunConfig(model="mynet.py:Net", model_args={"width": 4}))
    digest = hashlib.sha256(nets.read_bytes()).hexdigest()
    assert config.model == f"{nets}:Net"
    assert config.model_source == f"{nets} sha256={digest}"
    assert RunConfig.from_dict(config.to_dict()) == config
    assert model_source("resnet18") == "" and with_model_source(RunConfig()) == RunConfig()
    with pytest.raises(ConfigError, match="model_source 'x' is not allowed"):
        RunConfig(model_source="x")


def test_timm_names_still_take_model_args():
    model = create_model("resnet18", num_classes=3, in_chans=1, model_args={"drop_rate": 0.5})
    assert isinstance(model, nn.Module) and model.drop_rate == 0.5


def test_the_launcher_finds_a_modules_file_without_running_its_package(tmp_path, monkeypatch):
    """What the dashboard's process does (record the source) imports nothing: a package whose __init__
    crashes is found, and only the child check (and the supervisor) import it."""
    package = tmp_path / "crashing_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('would end the dashboard')\n")
    (package / "nets.py").write_text("from torch import nn\nNet = nn.Identity\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert model_source("crashing_pkg.nets:Net").startswith(f"{package / 'nets.py'} sha256=")
    assert "crashing_pkg" not in sys.modules


def test_the_memory_estimate_sizes_a_custom_model_with_its_args(nets):
    from trainer_backend.rank.forecast.memory_estimate import estimate_memory

    sizes = {}
    for width in (8, 4096):
        config = RunConfig(model=f"{nets}:Net", model_args={"width": width}, image_size=16, batch_size=8)
        sizes[width] = estimate_memory(config, num_classes=10, in_chans=1).largest.parameters
    params_4096 = (1 * 9 * 4096 + 4096) + (4096 * 10 + 10)  # conv weight + bias, linear weight + bias
    assert sizes[4096] == params_4096 * 4 and sizes[8] < sizes[4096]


def test_the_supervisor_refuses_a_file_changed_after_launch(nets):
    from types import SimpleNamespace

    from trainer_backend.supervisor.preflight import check_custom_before_training

    config = with_model_source(RunConfig(model=f"{nets}:Net", model_args={"width": 4}, image_size=16))
    model = create_model(config.model, num_classes=10, in_chans=1, model_args=config.model_kwargs)
    info = SimpleNamespace(num_classes=10, in_chans=1)
    check_custom_before_training(config, model, info)  # the file as launched: accepted
    nets.write_text(NETS + "\n# edited\n")
    with pytest.raises(ModelError, match=r"its file changed after the run was launched \(recorded sha256=[0-9a-f]{64}, "
                                         r"now sha256=[0-9a-f]{64}\): launch it again"):
        check_custom_before_training(config, model, info)


def test_compare_shows_which_code_each_run_trained(nets):
    from reports.scaling import config_differences

    first = with_model_source(RunConfig(model=f"{nets}:Net", model_args={"width": 4}))
    nets.write_text(NETS + "\n# edited\n")
    second = with_model_source(RunConfig(model=f"{nets}:Net", model_args={"width": 8}))
    table = config_differences([{"id": 1, "config": first.to_dict()}, {"id": 2, "config": second.to_dict()}])
    assert list(table.index) == ["model_args", "model_source"]
    assert table.loc["model_source", "#1"] == first.model_source != table.loc["model_source", "#2"]


# A model from another library: torchvision's factories take **kwargs (passed on to the model's class), which
# takes num_classes but not in_chans.
TORCHVISION_RESNET = "torchvision.models:resnet18"


def test_a_factory_taking_kwargs_is_given_the_classes_and_built_again_without_what_its_class_refuses():
    model, given = build_custom_model(TORCHVISION_RESNET, None, num_classes=10, in_chans=3)
    assert given == ("num_classes",) and model.fc.out_features == 10 and model.conv1.in_channels == 3
    assert check(TORCHVISION_RESNET, in_chans=3) == ("num_classes",)  # the check before launch: meta, 16 px
    timm_style, given = build_custom_model("timm.models:resnet18", None, num_classes=7, in_chans=1)  # takes both
    assert given == ("num_classes", "in_chans") and timm_style.conv1.in_channels == 1


def test_a_grey_dataset_is_given_to_a_three_channel_model_as_three_equal_channels():
    from trainer_backend.rank.custom_model import input_channels

    model, given = build_custom_model(TORCHVISION_RESNET, None, num_classes=10, in_chans=1)
    assert given == ("num_classes",) and input_channels(model, 1) == 3
    grey = torch.rand(2, 1, 16, 16)
    with torch.no_grad():
        assert torch.equal(model.eval()(grey), model(grey.expand(-1, 3, -1, -1)))
    assert list(model.state_dict()) == list(build_custom_model(TORCHVISION_RESNET, None, num_classes=10,
                                                               in_chans=3)[0].state_dict())  # torchvision's names
    assert check(TORCHVISION_RESNET) == ("num_classes",)  # 1 channel, 10 classes
    # A **kwargs that takes in_chans and drops it (torchvision's MobileNetV3) did not take it: its stem is fitted too.
    mobilenet, given = build_custom_model("torchvision.models:mobilenet_v3_small", None, num_classes=10, in_chans=1)
    assert given == ("num_classes",) and input_channels(mobilenet, 1) == 3
    assert mobilenet.eval()(grey).shape == (2, 10)
    with pytest.raises(ModelError, match="given the dataset's grey images as 3 equal channels, which mp and pp cannot"):
        split_into_stages(model, 2, in_chans=1, image_size=16, name=TORCHVISION_RESNET)
    with pytest.raises(ModelError) as caught:
        check(TORCHVISION_RESNET, in_chans=13)
    message = str(caught.value)
    assert message.startswith(f"model '{TORCHVISION_RESNET}': raises in forward on a 2x13x16x16 batch: RuntimeError: ")
    assert message.endswith("; its first convolution takes 3 channel(s) and the dataset has 13: choose 3 bands with "
                            "--bands (multi-band files), a dataset of that many channels, or a model that takes "
                            "in_chans") and "\n" not in message


def test_sizes_given_in_model_args_are_passed_and_checked_against_the_dataset(nets):
    model, given = build_custom_model(TORCHVISION_RESNET, {"num_classes": 10}, num_classes=10, in_chans=3)
    assert given == ("num_classes",) and model.fc.out_features == 10
    with pytest.raises(ModelError) as caught:
        check(TORCHVISION_RESNET, {"num_classes": 1000})
    assert str(caught.value) == (f"model '{TORCHVISION_RESNET}': model_args gives num_classes 1000, but the dataset "
                                 "has 10 classes: give 10, or leave num_classes out (the dataset's is passed where "
                                 "the model takes it)")
    with pytest.raises(ModelError, match="model_args gives in_chans 3, but the dataset has 1 channels"):
        check(f"{nets}:Net", {"width": 4, "in_chans": 3})
    with pytest.raises(ModelError, match="model 'resnet18': model_args gives num_classes 5, but the dataset has 3"):
        create_model("resnet18", num_classes=3, in_chans=1, model_args={"num_classes": 5})
    assert create_model("resnet18", num_classes=3, in_chans=1, model_args={"num_classes": 3}).num_classes == 3


def test_a_model_that_returns_more_than_logits_in_training_is_refused_naming_the_fix():
    """torchvision's googlenet gives a tensor in evaluation and, in training, its auxiliary classifiers' logits too,
    which the loss cannot take: refused before launch, naming the argument that turns them off."""
    googlenet = "torchvision.models:googlenet"
    with pytest.raises(ModelError) as caught:
        check(googlenet, image_size=32)
    assert str(caught.value) == (
        f"model '{googlenet}': in training mode a 2x1x32x32 batch gives GoogLeNetOutputs, not the (2, 10) logits it "
        'gives in evaluation mode, and the loss takes those alone; turn its auxiliary classifiers off with '
        '{"aux_logits": false} in its model arguments')
    assert check(googlenet, {"aux_logits": False}, image_size=32) == ("num_classes",)
    with pytest.raises(ModelError, match=r"raises in forward on a 2x1x16x16 batch: .*; the images are too small for "
                                         "it: try a larger image size$"):
        check("torchvision.models:inception_v3", {"aux_logits": False})


def test_a_factory_whose_kwargs_refuse_the_offered_sizes_some_other_way_is_built_without_them(tmp_path):
    """num_classes and in_chans are only offered to a **kwargs: one that refuses them otherwise than Python's
    'unexpected keyword argument' (a ValueError naming unknown options) is built again without them and has its
    output's width checked, as a model taking neither is; a model that fails for a reason of its own is named with
    the arguments it was first built with."""
    path = tmp_path / "strict.py"
    path.write_text(textwrap.dedent("""
        from torch import nn

        class Strict(nn.Module):
            def __init__(self, **options):
                super().__init__()
                unknown = sorted(set(options) - {"width"})
                if unknown:
                    raise ValueError(f"unknown options {unknown}")
                self.body = nn.Sequential(nn.Flatten(), nn.LazyLinear(options.get("width", 10)))

            def forward(self, x):
                return self.body(x)

        def broken(**options):
            raise RuntimeError("a bug of its own")
    """))
    assert check(f"{path}:Strict") == ()
    with pytest.raises(ModelError) as caught:
        check(f"{path}:Strict", {"width": 7})
    assert "wrong output shape: a 2x1x16x16 batch gave (2, 7)" in str(caught.value)
    with pytest.raises(ModelError) as caught:
        check(f"{path}:broken")
    assert str(caught.value) == (f"model '{path}:broken': raises when built with {{'num_classes': 10, 'in_chans': 1}}: "
                                 "RuntimeError: a bug of its own (at strict.py:16 in broken)")


def test_a_grey_model_that_makes_its_head_before_its_stem_is_given_its_images_as_they_are(tmp_path):
    """The convolution grey images are repeated for is the stem, the one the forward reaches first: a model made
    for 1 channel whose __init__ makes a 16-channel head first trains on digits as it did (it was given each image
    as 16 equal channels, which its stem refused)."""
    from trainer_backend.rank.custom_model import input_channels

    path = tmp_path / "head_first.py"
    path.write_text(textwrap.dedent("""
        from torch import nn

        class HeadFirst(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = nn.Conv2d(16, 10, 1)
                self.stem = nn.Conv2d(1, 16, 3, padding=1)
                self.pool = nn.AdaptiveAvgPool2d(1)

            def forward(self, x):
                return self.pool(self.head(self.stem(x).relu())).flatten(1)
    """))
    assert check(f"{path}:HeadFirst") == ()
    model, _ = build_custom_model(f"{path}:HeadFirst", None, num_classes=10, in_chans=1)
    assert input_channels(model, 1) == 1 and model(torch.rand(2, 1, 16, 16)).shape == (2, 10)
