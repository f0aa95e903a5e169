# make run   - create .venv (installing Debian's python3-venv first if missing), install Parallax into it
#              (editable, with the PostgreSQL driver), start the dashboard on http://127.0.0.1:8501 (`parallax ui`),
#              served as .streamlit/config.toml says (no reload on save)
# make dev   - the same, reloading the app when a source file is saved
# make test  - install what the suite needs (Debian's chromium and postgresql too, scripts/system-deps)
#              and run the whole suite
# make test-fast - the tests that start no process (about a minute)
# make lint  - ruff, configured in pyproject.toml
# make screenshots - remake docs/img/*.png from the form's default sweep in a real dashboard and
#              chromium (docs/screenshots.py, a few minutes on 2 cores)
VENV ?= .venv
PY := $(VENV)/bin/python
# Test processes side by side: much of the suite waits on subprocesses, servers and a browser starting,
# and on runs that sleep while a test acts on them, which overlap; three keep 2 cores busy (docs/HOW_IT_IS_BUILT.md, Tests).
# A test file stays on one test worker, so its module fixtures are built once.
TEST_WORKERS ?= 3
PORT ?= 8501
ADDRESS ?= 127.0.0.1

.PHONY: run dev test test-fast lint bench-check install clean system-deps screenshots

# The package, editable: the checkout is what runs, and `parallax` is on the venv's PATH. python3-venv first: a
# fresh Debian has python3 without it, and `python3 -m venv` fails there.
$(VENV)/.installed: pyproject.toml requirements.txt requirements-postgres.txt
	bash scripts/system-deps --venv-only
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[postgres]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PY) -m pip install --quiet -e '.[postgres,test]'
	touch $@

install: $(VENV)/.installed

# Every serving setting is in .streamlit/config.toml beside app.py, which Streamlit reads whatever the folder.
run: $(VENV)/.installed
	$(VENV)/bin/parallax ui --address $(ADDRESS) --port $(PORT)

# Reload on save, with the poll watcher: it checks the app's own modules, where the default inotify watcher
# walks the whole folder (.venv included) and costs a core.
dev: $(VENV)/.installed
	$(VENV)/bin/streamlit run app.py --server.address $(ADDRESS) --server.port $(PORT) \
		--server.fileWatcherType poll --server.runOnSave true

lint: system-deps $(VENV)/.installed-test
	$(VENV)/bin/ruff check .

# First, so that a machine without python3-venv gets it before the venv is made.
test: system-deps $(VENV)/.installed-test
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The tests that start no process (no subprocess, rank, server, cluster or browser): about a minute. A test
# that starts one anyway fails here, naming the mark it lacks (tests/conftest.py).
test-fast: $(VENV)/.installed-test
	PARALLAX_TEST_TIER=fast $(PY) -m pytest -n $(TEST_WORKERS) -m "not processes and not browser and not bench"

# The benchmark scripts still run (each with --quick, about 3 minutes), and gpu-check's script on CPU
# runs (its hand-written loop, ratios, JPEG losses and estimates too); CI runs it after make test.
bench-check: system-deps $(VENV)/.installed-test
	$(PY) -m pytest -m bench

system-deps:
	bash scripts/system-deps

# The README's screenshots, from the runs a new user makes (playwright and chromium, as the browser tests use).
screenshots: system-deps $(VENV)/.installed-test
	$(PY) docs/screenshots.py

clean:
	rm -rf $(VENV) .pytest_cache

# make bench - install the benchmark extras, run bench/ (about 12 minutes on 2 cores, and bench/history.py's
# 100,000 runs written as ranks write them: hours on a busy 2-core machine; take figures on a quiet
# machine), write bench/results.json and docs/BENCHMARKS.md
.PHONY: bench

$(VENV)/.installed-bench: $(VENV)/.installed requirements-bench.txt
	$(PY) -m pip install --quiet -e '.[postgres,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(PY) bench/run_all.py

# make gpu-check - on a machine with CUDA: Parallax against a hand-written GPU loop on both data paths, a
# short series of real runs on cuda:0 and tests/system/test_gpu.py (about 10 minutes on one H200), written to
# docs/BENCHMARKS.md; without CUDA one line says so.
# Installs nothing: it runs under $(PY) where that exists, else python3 (make gpu-check PY=python3).
.PHONY: gpu-check
GPU_CHECK_PY = $(if $(wildcard $(PY)),$(PY),python3)

gpu-check:
	@$(GPU_CHECK_PY) bench/gpu_check.py
