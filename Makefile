# make run   - create .venv (installing Debian's python3-venv first if missing), install, start the dashboard
#              on http://127.0.0.1:8501, served as .streamlit/config.toml says (no reload on save)
# make dev   - the same, reloading the app when a source file is saved
# make test  - install what the suite needs (Debian's chromium and postgresql too, scripts/system-deps)
#              and run the whole suite
VENV ?= .venv
PY := $(VENV)/bin/python
# Test processes side by side: much of the suite waits on subprocesses, servers and a browser starting,
# which overlap; a test file stays on one worker, so its module fixtures are built once.
TEST_WORKERS ?= 2
PORT ?= 8501
ADDRESS ?= 127.0.0.1

.PHONY: run dev test bench-check install clean system-deps

# python3-venv first: a fresh Debian has python3 without it, and `python3 -m venv` fails there.
$(VENV)/.installed: requirements.txt
	bash scripts/system-deps --venv-only
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PY) -m pip install --quiet -r requirements-test.txt
	touch $@

install: $(VENV)/.installed

# Every other serving setting is in .streamlit/config.toml, read because streamlit starts from this folder.
run: $(VENV)/.installed
	$(VENV)/bin/streamlit run app.py --server.address $(ADDRESS) --server.port $(PORT)

# Reload on save, with the poll watcher: it checks the app's own modules, where the default inotify watcher
# walks the whole folder (.venv included) and costs a core.
dev: $(VENV)/.installed
	$(VENV)/bin/streamlit run app.py --server.address $(ADDRESS) --server.port $(PORT) \
		--server.fileWatcherType poll --server.runOnSave true

# First, so that a machine without python3-venv gets it before the venv is made.
test: system-deps $(VENV)/.installed-test
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The benchmark scripts still run (each with --quick, about 3 minutes); CI runs it after make test.
bench-check: system-deps $(VENV)/.installed-test
	$(PY) -m pytest -m bench

system-deps:
	bash scripts/system-deps

clean:
	rm -rf $(VENV) .pytest_cache

# make bench - install the benchmark extras, run bench/ (about 12 minutes on 2 cores; take figures on a
# quiet machine), write bench/results.json and docs/BENCHMARKS.md
.PHONY: bench

$(VENV)/.installed-bench: $(VENV)/.installed requirements-bench.txt
	$(PY) -m pip install --quiet -r requirements-bench.txt
	touch $@

bench: $(VENV)/.installed-bench
	$(PY) bench/run_all.py
