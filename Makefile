# Two commands a newcomer needs: `make demo` and `make test`. Everything they need is installed here,
# from a clean clone on a fresh machine: the venv, this package with its extras, and torch's CPU wheel.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_VERSION := 2.13.0
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: venv demo test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -e ".[torch,prometheus,instrument,test]"
	rm -f $(VENV)/.installed-*
	touch $@

demo: venv
	$(PY) examples/demo.py

test: venv
	$(PY) -m pytest -q

bench: venv
	$(PY) bench/bench_api.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
