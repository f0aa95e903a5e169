"""Who may use Parallax and what it will touch: the login gate on non-loopback addresses, the data
roots the dashboard is confined to, argv-only launches (no shell), and downloads that serve only
the run asked for.

    .venv/bin/python -m pytest tests/system/test_access.py -q
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import streamlit.config as streamlit_config
from PIL import Image
from streamlit.testing.v1 import AppTest

import db
from tests.support import GATED, ROOT
from db import store
from db.folders import run_folder
from contract.config import ConfigError, RunConfig
from trainer_backend.datasets.roots import check_under_roots, is_under_roots
from ui import auth

APP = str(ROOT / "app.py")
TIMEOUT_S = 90


# --- ui/auth.py: pure functions -----------------------------------------------------------------


def test_password_hash_is_salted_scrypt_and_verifies_only_the_password():
    first, second = auth.hash_password("correct horse"), auth.hash_password("correct horse")
    assert first.startswith("scrypt$16384$8$1$") and first != second  # a fresh salt each time
    assert auth.verify_password("correct horse", first) and auth.verify_password("correct horse", second)
    assert not auth.verify_password("correct hors", first)
    assert not auth.verify_password("", first)


@pytest.mark.parametrize("stored", [None, "", "plaintext", "scrypt$16384$8$1$c2FsdA", "bcrypt$1$2$3$c2FsdA$aGFzaA",
                                    "scrypt$1000$8$1$c2FsdA$aGFzaA", "scrypt$16384$8$1$$aGFzaA",
                                    "scrypt$x$8$1$c2FsdA$aGFzaA", 12345])
def test_malformed_hashes_never_verify(stored):
    assert auth.parse_hash(stored) is None
    assert not auth.verify_password("anything", stored)


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.8.9.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.20", False), ("", False), (None, False), ("example.org", False),
])
def test_only_loopback_addresses_count_as_local(address, loopback):
    assert auth.is_loopback(address) is loopback


def test_auth_mode_reads_the_secrets():
    good = {"parallax": {"password_hash": auth.hash_password("correct horse")}}
    assert auth.auth_mode({}) is None
    assert auth.auth_mode(good) == "password"
    assert auth.auth_mode({"parallax": {"password_hash": "hunter2"}}) is None
    assert "not a hash made by" in auth.secrets_problem({"parallax": {"password_hash": "hunter2"}})
    assert auth.auth_mode({"auth": {"redirect_uri": "http://h/oauth2callback", "cookie_secret": "s"}}) == "oidc"
    assert auth.auth_mode({"auth": {"redirect_uri": "http://h/oauth2callback"}}) is None


def test_hash_password_command_prints_a_usable_secrets_line():
    result = subprocess.run([sys.executable, "-m", "ui.auth", "hash-password"], cwd=ROOT, input="correct horse\n",
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    section, line, secret = result.stdout.strip().splitlines()
    assert section == "[parallax]" and line.startswith('password_hash = "scrypt$')
    assert secret.startswith('cookie_secret = "') and len(secret.split('"')[1]) == 64
    assert auth.verify_password("correct horse", line.split('"')[1])
    short = subprocess.run([sys.executable, "-m", "ui.auth", "hash-password"], cwd=ROOT, input="short\n",
                           capture_output=True, text=True, timeout=30)
    assert short.returncode == 1 and short.stderr.startswith("error: the password is shorter than 8")


# --- the gate in app.py, through AppTest --------------------------------------------------------


@pytest.fixture
def public_address():
    """The dashboard as if started with --server.address 0.0.0.0."""
    before = streamlit_config.get_option("server.address")
    streamlit_config.set_option("server.address", "0.0.0.0")
    yield
    streamlit_config.set_option("server.address", before)


def titles(at: AppTest) -> list[str]:
    return [t.value for t in at.title]


def test_public_address_without_a_login_serves_no_page(parallax_home, public_address):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert titles(at) == ["Parallax"]
    assert [e.value for e in at.error] == ["This dashboard is listening on `0.0.0.0`, which other machines can "
                                           "reach, and no login is configured, so it serves no page."]
    assert "python -m ui.auth hash-password" in at.markdown[0].value
    # The refusal is the only page there is: no navigation, no other page to switch to.
    with pytest.raises(ValueError, match=GATED):
        at.switch_page("pages/runs.py")


def test_password_gates_every_page_until_login_and_again_after_logout(parallax_home, public_address):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.secrets["parallax"] = {"password_hash": auth.hash_password("correct horse")}
    at.run()
    assert titles(at) == ["Parallax"] and [t.label for t in at.text_input] == ["Password"]
    at.text_input[0].input("wrong horse")
    at.button[0].click().run()
    assert titles(at) == ["Parallax"] and [e.value for e in at.error] == ["Wrong password."]
    at.text_input[0].input("correct horse")
    at.button[0].click().run()
    assert titles(at) == ["Launch a run"] and not at.error
    assert auth.PASSWORD_KEY not in at.session_state  # the typed password is not kept
    at.sidebar.button(key="logout").click().run()
    assert titles(at) == ["Parallax"] and [t.label for t in at.text_input] == ["Password"]
    with pytest.raises(ValueError, match=GATED):  # the login is all there is now
        at.switch_page("pages/runs.py")
    at.text_input[0].input("correct horse")
    at.button[0].click().run()
    at.switch_page("pages/runs.py").run()
    assert titles(at) == ["Runs"]


def test_oidc_configured_asks_to_log_in_first(parallax_home, public_address):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.secrets["auth"] = {"redirect_uri": "http://127.0.0.1:8501/oauth2callback", "cookie_secret": "x" * 32,
                          "client_id": "parallax", "client_secret": "s",
                          "server_metadata_url": "https://id.example.org/.well-known/openid-configuration"}
    at.run()
    assert titles(at) == ["Parallax"] and [b.label for b in at.button] == ["Log in"]


def test_unusable_database_is_one_message_not_a_traceback(parallax_home, monkeypatch):
    monkeypatch.setenv("PARALLAX_DB_URL", "postgresql+psycopg://parallax:secret@127.0.0.1:1/parallax")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    (message,) = [e.value for e in at.error]
    assert message.startswith("cannot open the database postgresql+psycopg://parallax:***@127.0.0.1:1/parallax: ")
    assert "secret" not in message


def test_public_address_in_a_real_browser_shows_the_refusal_and_no_navigation(tmp_path):
    """``streamlit run app.py --server.address 0.0.0.0`` without secrets, seen by chromium."""
    from playwright.sync_api import expect, sync_playwright
    from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard

    env = {**os.environ, "PARALLAX_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    server = start_dashboard(env, log=tmp_path / "streamlit.log", address="0.0.0.0",
                             extra_args=["--secrets.files", str(tmp_path / "no-secrets.toml")])
    try:
        url = server.url
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(f"{url}/runs")  # a page's own address gets the refusal too
                refusal = page.get_by_test_id("stAlert").filter(has_text="no login is configured")
                expect(refusal).to_be_visible(timeout=30_000)
                expect(page.get_by_text("python -m ui.auth hash-password")).to_be_visible()
                expect(page.get_by_test_id("stSidebarNav")).to_have_count(0)
                expect(page.get_by_role("heading", name="Runs")).to_have_count(0)
            finally:
                browser.close()
    finally:
        server.stop(grace_s=15)


# --- data roots ---------------------------------------------------------------------------------


def write_two_classes(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (folder / label).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / label / f"{i}.png")
    return folder


@pytest.fixture
def roots(tmp_path) -> tuple[Path, Path]:
    """A data root with one real dataset, a link inside it that leads out, and a folder outside."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    write_two_classes(root / "inside")
    write_two_classes(outside / "secret")
    (root / "escape").symlink_to(outside / "secret")
    (root / "alias").symlink_to(root / "inside")
    return root, outside


def test_only_folders_that_resolve_inside_a_root_are_allowed(roots):
    root, outside = roots
    check_under_roots("digits", [root])
    check_under_roots(str(root / "inside"), [root])
    check_under_roots(str(root / "alias"), [root])  # a link that stays inside
    for bad in (str(outside / "secret"), f"{root}/../outside/secret", str(root / "escape"), str(root)):
        with pytest.raises(ConfigError) as info:
            check_under_roots(bad, [root])
        assert info.value.field == "dataset"
        assert str(info.value).startswith(f"dataset folder {bad}") and f"outside the data roots ({root})" in str(info.value)
    with pytest.raises(ConfigError, match=f"resolves to {outside / 'secret'}"):
        check_under_roots(str(root / "escape"), [root])
    (outside / "train.csv").write_text("secret/a.png,a\n")
    with pytest.raises(ConfigError, match=f"dataset list file {outside / 'train.csv'} is outside the data roots"):
        check_under_roots(str(outside / "train.csv"), [root])


def test_dashboard_offers_no_folder_outside_the_roots(roots, monkeypatch):
    from ui.options import dataset_folders

    root, _ = roots
    monkeypatch.setenv("PARALLAX_DATA_ROOTS", str(root))
    offered = dataset_folders()
    assert str((root / "inside").resolve()) in offered
    assert all(is_under_roots(folder, [root]) for folder in offered) and len(offered) == 2  # inside, and alias


def test_dashboard_offers_list_files_inside_the_roots_but_no_validation_list(roots, monkeypatch):
    from ui.options import dataset_choices, dataset_lists

    root, outside = roots
    for name in ("train.csv", "val.csv", "Validation.txt", "labels.txt", ".hidden.csv", "notes.md"):
        (root / "photos" / name).parent.mkdir(exist_ok=True)
        (root / "photos" / name).write_text("img/0.png,cat\n")
    (root / "top.csv").write_text("img/0.png,cat\n")
    (outside / "secret" / "all.csv").write_text("img/0.png,cat\n")  # reached through root/escape only
    (outside / "leak.csv").write_text("img/0.png,cat\n")
    (root / "photos" / "leak.csv").symlink_to(outside / "leak.csv")
    monkeypatch.setenv("PARALLAX_DATA_ROOTS", str(root))
    offered = dataset_lists()
    assert offered == [str(p.resolve()) for p in (root / "top.csv", root / "photos" / "labels.txt",
                                                  root / "photos" / "train.csv")]
    assert set(offered) <= set(dataset_choices())


def test_launch_from_the_dashboard_refuses_outside_the_roots_before_any_row(roots, parallax_home, db_url):
    from trainer_backend.control.lifecycle import launch

    root, outside = roots
    config = RunConfig(dataset=str(root / "escape"), model="test_resnet", image_size=16, epochs=1)
    with pytest.raises(ConfigError, match="outside the data roots"):
        launch(config, db_url=db_url, data_roots=[root])
    assert store.list_runs(db.make_engine(db_url)) == []
    db.dispose_engines()


def test_supervisor_launched_from_the_dashboard_checks_the_roots_again(roots, parallax_home, db_url):
    """A run row whose dataset was changed to a folder outside the roots after launch fails with the reason."""
    from trainer_backend.supervisor.runner import work

    root, outside = roots
    engine = db.make_engine(db_url)
    config = RunConfig(dataset=str(outside / "secret"), model="test_resnet", image_size=16, epochs=1)
    run_id = store.create_run(engine, config.to_dict(), status="queued")
    assert work(run_id, db_url=db_url, data_roots=[root]) == "failed"
    assert "outside the data roots" in store.get_run(engine, run_id).error
    assert len(store.read_epoch_metrics(engine, [run_id])) == 0  # not a byte of the folder was read
    db.dispose_engines()


# --- your own model: only from the model folders ------------------------------------------------

OUTSIDE_MODEL = """
open({marker!r}, "w").close()
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, num_classes=10, in_chans=3):
        super().__init__()
        self.head = nn.Linear(in_chans, num_classes)

    def forward(self, x):
        return self.head(x.mean((2, 3)))
"""


@pytest.fixture
def outside_model(tmp_path, parallax_home) -> tuple[str, Path]:
    """A model file outside $PARALLAX_HOME/models that leaves a marker when imported."""
    marker = tmp_path / "imported"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "mynet.py").write_text(OUTSIDE_MODEL.format(marker=str(marker)))
    return f"{tmp_path / 'elsewhere' / 'mynet.py'}:Net", marker


def test_the_dashboard_launches_sweeps_and_resumes_no_model_outside_the_model_folders(roots, outside_model, db_url):
    from contract.model_source import ModelError
    from contract.storage import RESUME_FILE
    from trainer_backend.control.lifecycle import launch, launch_sweep, resume

    root, _ = roots
    model, marker = outside_model
    config = RunConfig(dataset="digits", model=model, image_size=16, epochs=1)
    for attempt in (lambda: launch(config, db_url=db_url, data_roots=[root]),
                    lambda: launch_sweep(config, ["single", "ddp"], db_url=db_url, data_roots=[root])):
        with pytest.raises(ModelError, match="is not allowed from the dashboard: .* add its folder to PARALLAX_MODEL_ROOTS"):
            attempt()
    engine = db.make_engine(db_url)
    assert store.list_runs(engine) == []
    launched_by_hand = store.create_run(engine, config.to_dict(), status="failed")  # the command line's run
    run_folder(engine, launched_by_hand, create=True).joinpath(RESUME_FILE).write_bytes(b"point")
    with pytest.raises(ModelError, match="is not allowed from the dashboard"):
        resume(launched_by_hand, db_url=db_url, data_roots=[root])
    assert store.get_run(engine, launched_by_hand).status == "failed" and not marker.exists()
    db.dispose_engines()


def test_a_supervisor_launched_from_the_dashboard_checks_the_model_again(roots, outside_model, db_url):
    """A queued row whose model lies outside the model folders (changed after launch) fails with the reason,
    without importing it."""
    from trainer_backend.supervisor.runner import work

    root, _ = roots
    model, marker = outside_model
    engine = db.make_engine(db_url)
    run_id = store.create_run(engine, RunConfig(dataset="digits", model=model, image_size=16, epochs=1).to_dict(),
                              status="queued")
    assert work(run_id, db_url=db_url, data_roots=[root]) == "failed"
    assert "is not allowed from the dashboard" in store.get_run(engine, run_id).error
    assert not marker.exists()
    db.dispose_engines()


# timm's keywords that load or download: a checkpoint anywhere the server reads, a download into a model folder
LOADING_ARGS = [{"checkpoint_path": "/etc/hostname"},
                {"cache_dir": "{models}", "pretrained_cfg_overlay": {"url": "http://127.0.0.1:9/mynet.py"}},
                {"pretrained_cfg": {"file": "/etc/hostname"}}]


@pytest.mark.parametrize("model_args", LOADING_ARGS, ids=["checkpoint", "download-into-models", "pretrained-cfg"])
def test_the_dashboard_passes_timm_no_argument_that_loads_or_downloads(roots, parallax_home, db_url, model_args):
    """A timm name typed in the own-model field takes the form's model arguments: none of them may point timm
    at a file to read or a URL to download into a model folder, which the model field would then run."""
    from contract.model_source import ModelError
    from contract.storage import RESUME_FILE
    from trainer_backend.control.lifecycle import launch, launch_sweep, resume
    from trainer_backend.supervisor.runner import work

    root, _ = roots
    args = {key: value.format(models=parallax_home / "models") if isinstance(value, str) else value
            for key, value in model_args.items()}
    config = RunConfig(dataset="digits", model="resnet18", model_args=args, pretrained=True, image_size=16, epochs=1)
    for attempt in (lambda: launch(config, db_url=db_url, data_roots=[root]),
                    lambda: launch_sweep(config, ["single", "ddp"], db_url=db_url, data_roots=[root])):
        with pytest.raises(ModelError, match=f"model_args {sorted(args)[0]}.* is not allowed from the dashboard"):
            attempt()
    engine = db.make_engine(db_url)
    assert store.list_runs(engine) == []
    launched_by_hand = store.create_run(engine, config.to_dict(), status="failed")  # the command line's run
    run_folder(engine, launched_by_hand, create=True).joinpath(RESUME_FILE).write_bytes(b"point")
    with pytest.raises(ModelError, match="is not allowed from the dashboard"):
        resume(launched_by_hand, db_url=db_url, data_roots=[root])
    queued = store.create_run(engine, config.to_dict(), status="queued")  # a row changed after launch
    assert work(queued, db_url=db_url, data_roots=[root]) == "failed"
    assert "is not allowed from the dashboard" in store.get_run(engine, queued).error
    db.dispose_engines()


# --- no shell -----------------------------------------------------------------------------------


def test_no_code_builds_a_shell_command():
    """Every subprocess gets an argv list: no shell=True, os.system or os.popen anywhere in the product."""
    offenders = []
    sources = [ROOT / "app.py"] + [p for d in ("pages", "ui", "trainer_backend", "db", "bench") for p in (ROOT / d).rglob("*.py")]
    for path in sources:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"):
                    offenders.append(f"{path.name}:{node.lineno} {name}")
                for keyword in node.keywords:
                    if keyword.arg == "shell" and not (isinstance(keyword.value, ast.Constant) and not keyword.value.value):
                        offenders.append(f"{path.name}:{node.lineno} shell=")
    assert offenders == []


def test_shell_syntax_in_a_dataset_path_tag_and_root_is_data_never_run(tmp_path, parallax_home, db_url):
    from db.run_state import ACTIVE_STATUSES
    from trainer_backend.control.lifecycle import launch

    marker = tmp_path / "executed"
    root = tmp_path / f"root $(touch {marker}-root)"
    dataset = write_two_classes(root / f"data; touch {marker}-dataset; `touch {marker}-tick`")
    tags = (f"x; touch {marker}-tag", f"$(touch {marker}-subst)", "'; rm -rf \"$PARALLAX_HOME\" #")
    config = RunConfig(dataset=str(dataset), model="test_resnet", image_size=16, epochs=1, batch_size=4, tags=tags)
    run_id = launch(config, db_url=db_url, data_roots=[root])
    engine = db.make_engine(db_url)
    deadline = time.monotonic() + 120
    while store.get_run(engine, run_id).status in ACTIVE_STATUSES and time.monotonic() < deadline:
        time.sleep(0.5)
    run = store.get_run(engine, run_id)
    assert run.status == "completed", run.error
    assert run.tags == list(tags) and run.config["dataset"] == str(dataset)
    assert list(tmp_path.glob("executed*")) == [] and parallax_home.exists()
    db.dispose_engines()


# --- downloads serve only the run asked for -----------------------------------------------------


def completed_run(engine, parallax_home: Path) -> int:
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                       "devices": ["cpu"], "epochs": 1, "tags": []}, status="completed")
    return run_id


def open_run_page(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in query.items():
        at.query_params[key] = value
    return at.switch_page("pages/run.py").run()


def download_labels(at: AppTest) -> list[str]:
    """Every download offered: buttons, and links the server streams (the checkpoint)."""
    return [d.proto.label for d in at.get("download_button")] + [
        b.proto.label for b in at.get("link_button") if b.proto.label.startswith("Download")]


@pytest.mark.parametrize("page, raw, words", [
    ("pages/run.py", "999", "Run #999 in the address does not exist"),
    ("pages/run.py", "abc", "?run=abc in the address is not a run number"),
    ("pages/profiler.py", "999", "Run #999 in the address does not exist"),
    ("pages/sweep.py", "999", "Sweep #999 in the address does not exist"),
])
def test_an_id_in_the_url_that_names_nothing_gets_a_message_not_another_run(page, raw, words, parallax_home, db_url):
    engine = db.make_engine(db_url)
    run_id = completed_run(engine, parallax_home)
    folder = run_folder(engine, run_id, create=True)
    (folder / "best.pt").write_bytes(b"checkpoint of another run")
    if page == "pages/profiler.py":
        from db import profiles

        profiles.save_profile(engine, run_id, 0, ops=[], steps=[], trace_gz=b"x", trace_bytes=1)
    if page == "pages/sweep.py":
        store.create_sweep(engine, {"dataset": "digits"}, ["single"])
    param = "sweep" if page == "pages/sweep.py" else "run"
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params[param] = raw
    at.switch_page(page).run()
    assert not at.exception
    assert any(words in e.value for e in at.error), [e.value for e in at.error]
    assert download_labels(at) == []
    db.dispose_engines()


def test_run_files_that_lead_outside_the_run_folder_are_neither_shown_nor_offered(tmp_path, parallax_home, db_url):
    engine = db.make_engine(db_url)
    run_id = completed_run(engine, parallax_home)
    folder = run_folder(engine, run_id, create=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the dashboard")
    (folder / "best.pt").symlink_to(secret)
    (folder / "run.log").symlink_to(secret)
    at = open_run_page(run=str(run_id))
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 2 and all("leads outside the run's folder" in e for e in errors), errors
    assert download_labels(at) == [] and not any("not for the dashboard" in c.value for c in at.code)
    (folder / "best.pt").unlink()
    (folder / "best.pt").write_bytes(b"the real checkpoint")
    at = open_run_page(run=str(run_id))
    assert [label.split(" (")[0] for label in download_labels(at)] == ["Download the best checkpoint"]
    db.dispose_engines()
