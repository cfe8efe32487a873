# heapsight: `make demo` and `make test` work from a clean clone on Debian 12.
# They install missing Debian packages, make a virtual environment in .venv, and build
# the package (the C part with it) into that environment.
VENV   := .venv
PY     := $(VENV)/bin/python
HS     := $(VENV)/bin/heapsight
# Only the native sources: the install is editable, so a .py edit needs no rebuild.
NATIVE := $(shell find native scenarios lab -type f) CMakeLists.txt pyproject.toml

.PHONY: all setup demo test test-fast test-unit bench stress clean

all: setup
# The package's bytecode, compiled ahead: Python reads it even where PYTHONDONTWRITEBYTECODE
# keeps it from writing its own (then every start would compile heapsight again: 50 ms).
setup: .stamp-install
	@$(PY) -m compileall -q src/heapsight >/dev/null

.stamp-deps: scripts/install-deps
	./scripts/install-deps
	@touch $@

.stamp-venv: .stamp-deps Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "scikit-build-core>=0.8" "numpy>=1.22" "rich>=12" "prometheus_client>=0.14" "shtab>=1.7.1" "protobuf>=4.21" "pytest>=7" "pytest-xdist>=3" "pyflakes>=3"
	@touch $@

.stamp-install: .stamp-venv $(NATIVE)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@touch $@

demo: setup
	@echo "== heapsight run on the retention scenario: 8 threads allocate 256 MiB, free 63 of every 64 blocks =="
	$(HS) demo
	@echo "== open heapsight-demo.html in a browser for the timeline; heapsight lab --quick re-runs the classic experiments =="

# Test tiers (markers given in tests/conftest.py): unit (pure functions), scenario (starts
# programs), system (other systems beside heapsight: gdb, other allocators and runtimes,
# heaptrack, valgrind, go), lab (the experiments) and browser (headless Chromium). test runs
# them all.
test: setup
	$(PY) -m pytest -q tests

# unit and scenario: the tiers to run while working (system, lab and browser add minutes)
test-fast: setup
	$(PY) -m pytest -q -n 2 -m "unit or scenario" tests

test-unit: setup
	$(PY) -m pytest -q -m unit tests

bench: setup
	$(PY) bench/overhead

# the timing-sensitive tests (frames, signals, copies) 50 rounds beside 2 busy loops, with
# a backtrace of any round past its time (scripts/stress --help)
stress: setup
	$(PY) scripts/stress

clean:
	rm -rf $(VENV) build .stamp-* test-output
