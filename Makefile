# Two commands a newcomer needs: `make demo` and `make test`. Everything they need is installed here,
# from a clean clone on a fresh machine: the venv, this package with its extras, and torch's CPU wheel.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_VERSION := 2.13.0
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: venv bytecode demo lint test test-fast test-compat test-gpu bench clean stack-deps browser-deps tmux-deps
.PHONY: docs

venv: $(STAMP)

# The package's bytecode, as pip writes it for a regular install: an editable install writes none, and where
# PYTHONDONTWRITEBYTECODE is set every bridged worker would compile the bridge's modules at start-up (~30 ms a
# worker). compileall skips what is up to date.
bytecode: venv
	@$(PY) -m compileall -q torchelastic_otel

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -e ".[torch,prometheus,instrument,test]"
	rm -f $(VENV)/.installed-*
	touch $@

# A real 2-worker torchrun job (rank 1 fails once, --max-restarts 1) exporting to OTLP JSON Lines files, rendered
# in the terminal and as one HTML file; the last line says where: `report: <path>`.
demo: bytecode
	@$(PY) examples/demo.py

# The tests run in TEST_JOBS processes (pytest-xdist), a file each at a time: most of a torchrun job's time is spent
# waiting (rendezvous, timeouts, a Prometheus scrape), and each file's module-scoped jobs stay in one process. One
# process a core, at most 4; TEST_JOBS=0 runs them in pytest's own process. The files marked `solo` compare a
# bridged job's time with plain torchrun's: they run afterwards, alone, so that no other test's job loads the CPUs
# under one of the two and not the other. Each part ends with its slowest tests and fixtures (--durations): what to
# look at first when the suite grows slower.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

test: bytecode lint docs stack-deps browser-deps tmux-deps
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not solo" --hypothesis-profile=full --durations=30
	$(PY) -m pytest -q -m solo --hypothesis-profile=full --durations=10

# The unit tests (tests/unit, less the ones marked as starting processes; tests/jobs and tests/stack are not even
# imported), in TEST_JOBS processes (tests shared out one by one: a unit test's fixtures are cheap), the fuzz tests
# trying a tenth of their examples (Hypothesis profile `fast`, tests/conftest.py). `make test` runs everything: the
# torchrun jobs (tests/jobs), the servers (tests/stack), the browser, and every example (profile `full`).
test-fast: bytecode
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal -m "not jobs and not stack and not browser" \
		--hypothesis-profile=fast tests/unit

# The docs site (mkdocs.yml, docs/) into site/. --strict: a broken link or anchor, a page left out of the nav, any
# warning fails the build (not with --quiet, which hides the warnings from --strict too).
# tests/unit/test_docs_examples.py runs every example in it and in the README.
docs: venv
	$(VENV)/bin/mkdocs build --strict

# Lint, format and type checks (configured in pyproject.toml) and no import cycle in the package.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) .ci/import_cycles.py

# What the browser tests in tests/jobs/test_report.py run for real: Debian's chromium (headless); installed when root
# and missing (elsewhere those tests skip, saying why). Idempotent.
browser-deps:
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

# What tests/jobs/test_follow.py runs `torchelastic-otel report --follow` in: a real terminal, Debian's tmux (installed
# when root and missing; elsewhere that test skips, saying why). Idempotent.
tmux-deps:
	@if ! command -v tmux >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; \
	fi

# What tests/stack/test_stack_*.py run for real: Debian's prometheus (prometheus + promtool; installed when root and
# missing) and rotel, an OTLP collector shipped as a wheel (pre-releases only). Idempotent.
stack-deps: venv
	@if ! command -v promtool >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; \
	fi
	@$(PY) -c "import rotel" 2>/dev/null || $(PIP) install --quiet --pre rotel

# The oldest and the newest releases of every declared range (Python, torch, OpenTelemetry), each in a venv cached
# outside the clone (~5 GB each: torch's CUDA builds, run on the CPU), running the torchrun, worker and mapping
# tests; a cold cache takes ~15 minutes here. `COMPAT=oldest,newest` runs a subset. See .ci/compat.py.
test-compat:
	$(PYTHON) .ci/compat.py

# On a machine with an NVIDIA GPU whose own Python (3.12) has a CUDA build of torch and no package index: tests/gpu
# (the bridge's figures against the jobs' own CUDA events) and bench/bench_gpu.py (the cost beside plain torchrun's).
# OpenTelemetry's wheels and this package's travel in .whl/, made here by ../shared/gpu/make-wheels.sh.
GPU_PYTHON ?= python3
GPU_SITE   ?= /tmp/torchelastic-otel-site
test-gpu:
	$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --upgrade --target $(GPU_SITE) .whl/*.whl
	$(GPU_PYTHON) -m compileall -q $(GPU_SITE)  # as pip does: else every bridged process compiles what it imports
	PYTHONPATH=$(GPU_SITE):$(CURDIR) PATH=$(GPU_SITE)/bin:$$PATH $(GPU_PYTHON) -m pytest -q -s -m gpu tests/gpu \
		-p no:cacheprovider
	PYTHONPATH=$(GPU_SITE):$(CURDIR) PATH=$(GPU_SITE)/bin:$$PATH $(GPU_PYTHON) bench/bench_gpu.py

bench: bytecode
	$(PY) bench/bench_api.py
	$(PY) bench/bench_job.py
	$(PY) bench/bench_failures.py
	$(PY) bench/bench_worker_life.py
	$(PY) bench/bench_descendants.py
	$(PY) bench/bench_steps.py
	$(PY) bench/bench_goodput.py
	$(PY) bench/bench_report.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
