"""What the dashboard reads and changes outside the pages: the run table and its filters
(``db/dashboard.py``), deleting a run with its files (``trainer_backend/control/housekeeping.py``) and
device discovery (``contract/devices.py``). Real SQLite files in tmp_path and real PostgreSQL
databases: every test that takes ``db_url`` runs on both.

    .venv/bin/python -m pytest tests/db/test_dashboard.py -q
"""

from __future__ import annotations

import os
import re
import socket

import pytest

from db import dashboard, store
from contract import devices
from db.folders import run_folder
from trainer_backend.control.housekeeping import RunActiveError, delete_run_and_files, delete_runs_and_files


def config(**changes) -> dict:
    base = {"dataset": "digits", "model": "resnet18", "strategy": "single", "devices": ["cpu"], "batch_size": 128,
            "image_size": 32, "amp": "auto", "epochs": 3, "tags": []}
    base.update(changes)
    return base


def add_run(engine, *, status="completed", accs=(0.5, 0.7), images_per_s=(100.0, 120.0), **changes) -> int:
    run_id = store.create_run(engine, config(**changes), status=status)
    for epoch, (acc, ips) in enumerate(zip(accs, images_per_s), start=1):
        store.log_epoch(engine, run_id, {"epoch": epoch, "val_acc": acc, "images_per_s": ips, "epoch_time_s": 2.0,
                                          "train_time_s": 1.5})
    return run_id


@pytest.fixture
def db_url(backend_db_url):
    return backend_db_url


def test_run_table_summarises_epochs_and_reads_config_fields(engine):
    run_id = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], batch_size=64, tags=["fast"])
    empty_id = add_run(engine, status="queued", accs=(), images_per_s=())
    rows = {row["id"]: row for row in dashboard.run_table(engine)}
    assert list(rows) == [empty_id, run_id]  # newest first
    row = rows[run_id]
    assert row["devices"] == ["cpu", "cpu"] and row["batch_size"] == 64 and row["epochs"] == 3
    assert row["epochs_done"] == 2 and row["best_val_acc"] == pytest.approx(0.7)
    # The epochs after the first (as every page shows it); training steps only, then with validation.
    assert row["mean_images_per_s"] == pytest.approx(120.0) and row["train_time_s"] == pytest.approx(3.0)
    assert row["epochs_time_s"] == pytest.approx(4.0)
    assert row["tags"] == ["fast"]
    assert rows[empty_id]["epochs_done"] == 0 and rows[empty_id]["best_val_acc"] is None


def test_run_table_filters_by_every_column_and_by_tag(engine):
    single = add_run(engine, tags=["baseline"])
    ddp = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], tags=["scaling", "cpu"])
    failed = add_run(engine, status="failed", model="resnet50", dataset="cifar10")
    ids = lambda **f: [r["id"] for r in dashboard.run_table(engine, dashboard.RunFilters(**f))]  # noqa: E731
    assert ids(statuses=("failed",)) == [failed]
    assert ids(strategies=("ddp",)) == [ddp]
    assert ids(models=("resnet18",)) == [ddp, single]
    assert ids(datasets=("cifar10",)) == [failed]
    assert ids(tags=("baseline", "scaling")) == [ddp, single]
    assert ids(strategies=("single",), tags=("scaling",)) == []
    choices = dashboard.filter_choices(engine)
    assert choices["statuses"] == ["completed", "failed"]
    assert choices["tags"] == ["baseline", "cpu", "scaling"]


def test_pages_follow_each_other_in_every_order_runs_without_a_figure_last(engine):
    """Keyset pages: every run once, in order, whatever the sort; runs with no epoch yet after the others."""
    accs = [0.9, 0.5, None, 0.7, 0.5, None, 0.8]
    ids = [add_run(engine, accs=() if acc is None else (acc,), images_per_s=() if acc is None else (100.0,))
           for acc in accs]
    for sort, expected in (
            ("newest", ids[::-1]), ("oldest", ids),
            ("best_val_acc", [ids[0], ids[6], ids[3], ids[4], ids[1], ids[5], ids[2]])):
        seen, after, counts = [], None, set()
        while True:
            page = dashboard.run_page(engine, sort=sort, after=after, limit=2)
            seen += [row["id"] for row in page.rows]
            counts.add(page.matching)
            if page.next_after is None:
                break
            after = page.next_after
        assert seen == expected, sort
        assert counts == {7}
    with pytest.raises(ValueError, match="unknown sort 'speed'; allowed: newest, oldest"):
        dashboard.run_page(engine, sort="speed")


def test_the_filter_language_reads_config_fields_figures_and_columns_as_users_write_them(engine):
    fast = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], lr=0.05, accs=(0.95,), tags=["sweep a"])
    slow = add_run(engine, lr=0.001, accs=(0.6,), optimizer={"name": "sgd"})
    odd = add_run(engine, lr="auto", accs=(0.91,))  # a config field holding text never matches a number
    note = add_run(engine, accs=())
    dashboard.set_user_note(engine, note, "the LR sweep's first try")

    def ids(where: str = "", text: str = "") -> list[int]:
        return [r["id"] for r in dashboard.run_page(engine, dashboard.RunFilters(where=where, text=text)).rows]

    assert ids("lr > 0.01") == [fast]
    assert ids("lr > 0.01 and strategy = ddp and best_val_acc >= 0.9") == [fast]
    assert ids("best_val_acc >= 0.9") == [odd, fast]
    assert ids("metrics.best_val_acc < 0.9, lr <= 0.001") == [slow]
    assert ids("lr = auto") == [odd] and ids("config.lr = 'auto'") == [odd]
    assert ids("optimizer.name = sgd") == [slow] and ids("params.optimizer.name ~ SG") == [slow]
    assert ids("strategy != ddp") == [note, odd, slow]
    assert ids("tag = 'sweep a'") == [fast] and ids("tag != 'sweep a'") == [note, odd, slow]
    assert ids("note ~ 'lr sweep'") == [note]
    assert ids("epochs_done = 0") == [note]
    assert ids(text="sweep") == [note, fast]  # the note, the tag
    assert ids(text=f"#{slow}") == [slow]
    page = dashboard.run_page(engine, dashboard.RunFilters(where="lr > 0.0001"))
    assert page.matching == 2 and page.next_after is None


@pytest.mark.parametrize("where, message", [
    ("lr >> 0.01", "filter: cannot read 'lr >> 0.01': write NAME OP VALUE"),
    ("lr > 0.01 strategy = ddp", "filter: expected 'and' (or a comma) before 'strategy = ddp'"),
    ("best_val_acc >= high", "best_val_acc is a number; 'high' is not one"),
    ("strategy > ddp", "strategy is text: compare it with =, != or ~ (contains), not >"),
    ("lr > 0.01 and", "filter: expected 'and' (or a comma) before 'and'"),
])
def test_a_malformed_filter_is_refused_in_one_line_naming_the_bad_part(engine, where, message):
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        dashboard.run_page(engine, dashboard.RunFilters(where=where))
    assert "\n" not in str(refused.value)


def test_a_script_runs_summary_is_on_its_row_and_filterable_by_any_key(engine):
    from db import script_metrics

    run_id = script_metrics.create_script_run(engine, name="s", project="p", config={"lr": 0.1}, key="script:s")
    store.set_measurements(engine, run_id, {"summary": {"val/acc": 0.93, "note": "best so far"}})
    add_run(engine)
    row = dashboard.run_page(engine, dashboard.RunFilters(where="summary.val/acc > 0.9")).rows
    assert [r["id"] for r in row] == [run_id] and row[0]["summary"] == {"val/acc": 0.93, "note": "best so far"}


def test_a_page_reads_a_bounded_number_of_rows_whatever_the_history(parallax_home):
    """The Runs page's queries return a page of rows and a count, never every run or epoch: a history ten
    times larger returns as many rows from the database (counted as SQLite hands each one over)."""
    from sqlalchemy import event

    import db

    engine = db.make_engine(f"sqlite:///{parallax_home / 'bounded.db'}")
    returned: list[int] = []

    def counting(dbapi_connection, connection_record):
        dbapi_connection.row_factory = lambda cursor, row: (returned.append(1), row)[1]

    event.listen(engine, "connect", counting)
    engine.dispose()

    def rows_read(runs: int) -> int:
        while len(store.list_runs(engine)) < runs:
            add_run(engine, accs=(0.5, 0.6, 0.7), images_per_s=(1.0, 2.0, 3.0))
        returned.clear()
        first = dashboard.run_page(engine, dashboard.RunFilters(where="best_val_acc > 0.1"), sort="best_val_acc",
                                   limit=5)
        second = dashboard.run_page(engine, dashboard.RunFilters(where="best_val_acc > 0.1"), sort="best_val_acc",
                                    after=first.next_after, limit=5)
        assert len(first.rows) == len(second.rows) == 5 and first.matching == runs
        return len(returned)

    small, large = rows_read(12), rows_read(120)
    assert small == large <= 2 * (5 + 1 + 1)  # each page: its rows, one more (is there a next?), the count
    db.dispose_engines()


def test_single_device_baselines_match_all_like_for_like_fields(engine):
    add_run(engine)                                   # older match
    newest = add_run(engine)                          # the one to use
    add_run(engine, batch_size=64)                    # other batch
    add_run(engine, amp="off")                        # other AMP
    add_run(engine, status="failed")                  # not completed
    add_run(engine, strategy="ddp", devices=["cpu", "cpu"])  # not the baseline strategy
    wanted = [config(strategy="ddp"), config(model="resnet50")]
    assert dashboard.single_device_baselines(engine, wanted) == {("digits", "resnet18", 128, 32, "auto"): newest}


def test_tags_and_note_are_replaced_and_cleaned(engine):
    run_id = add_run(engine, tags=["old"])
    assert dashboard.set_tags(engine, run_id, [" a ", "", "b", "a"]) == ["a", "b"]
    dashboard.set_user_note(engine, run_id, "  why this run  ")
    run = store.get_run(engine, run_id)
    assert run.tags == ["a", "b"] and run.user_note == "why this run"
    with pytest.raises(LookupError):
        dashboard.set_user_note(engine, 999, "x")


def test_delete_removes_row_metrics_and_folder(engine, db_url):
    run_id = add_run(engine)
    folder = run_folder(engine, run_id)
    folder.mkdir(parents=True)
    (folder / "best.pt").write_bytes(b"weights")
    (folder / "run.log").write_text("epoch 1/1\n")
    delete_run_and_files(run_id, db_url=db_url)
    assert store.get_run(engine, run_id) is None
    assert store.read_epoch_metrics(engine, [run_id]) == []
    assert not folder.exists()
    with pytest.raises(LookupError):
        delete_run_and_files(run_id, db_url=db_url)


def test_many_runs_are_deleted_in_a_few_statements_with_their_metrics_and_folders(engine, db_url, monkeypatch):
    """Runs picked across pages go a statement per RUNS_PER_DELETE (500; 50 here, for 120 runs: three), their
    metrics by cascade; an active one, and one not there, are refused by name."""
    from sqlalchemy import event, func, select

    from db import script_metrics
    from db.tables import ScriptChunk

    monkeypatch.setattr(store, "RUNS_PER_DELETE", 50)
    ids = [store.create_run(engine, config(), status="completed") for _ in range(120)]
    store.log_epoch(engine, ids[0], {"epoch": 1, "val_acc": 0.5})
    script = script_metrics.create_script_run(engine, name="s", project="p", config={}, key="script:d",
                                              status="completed")
    script_metrics.add_points(engine, script, [("loss", step, 0.0, 1.0) for step in range(500)])
    active = store.create_run(engine, config(), status="running")
    store.set_process(engine, active, pid=os.getpid(), host=socket.gethostname())  # this very process: alive
    run_folder(engine, ids[5]).mkdir(parents=True)
    deletes = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: deletes.append(statement)
                 if statement.lstrip().upper().startswith("DELETE") else None)
    deleted, refused = delete_runs_and_files([*ids, script, active, 99_999], db_url=db_url)
    assert deleted == [*ids, script] and refused == ["no run with id 99999",
                                                     f"run {active} is running: cancel it first, then delete it"]
    assert [run.id for run in store.list_runs(engine)] == [active]
    assert store.read_epoch_metrics(engine, [ids[0]]) == [] and not run_folder(engine, ids[5]).exists()
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(ScriptChunk)).scalar() == 0  # by cascade
    assert len(deletes) <= 3


def test_delete_refuses_an_active_run_but_takes_a_dead_one(engine, db_url):
    alive = add_run(engine, status="running")
    store.set_process(engine, alive, pid=os.getpid(), host=socket.gethostname())  # this very process: alive
    with pytest.raises(RunActiveError, match=f"run {alive} is running: cancel it first"):
        delete_run_and_files(alive, db_url=db_url)
    assert store.get_run(engine, alive) is not None

    dead = add_run(engine, status="running")
    store.set_process(engine, dead, pid=2**22 + 1, host=socket.gethostname())  # above pid_max: never alive
    delete_run_and_files(dead, db_url=db_url)  # marked lost first, so it may go
    assert store.get_run(engine, dead) is None


def test_gpu_statuses_describe_each_gpu_or_nothing_without_nvml():
    statuses = devices.gpu_statuses()
    for index, gpu in enumerate(statuses):
        assert gpu.index == index and gpu.name and 0 <= gpu.memory_used_mb <= gpu.memory_total_mb
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        assert statuses == []  # a machine without an NVIDIA driver falls back to CPU
    assert devices.cpu_cores() >= 1
