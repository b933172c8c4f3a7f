# Entry points on a fresh machine: `make demo`, `make test` and `make bench`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed-examples: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet -e '.[examples]'
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet -e '.[bench]'
	touch $@

# The other scripts in examples/ run the same way: $(PY) examples/NAME.py
demo: $(VENV)/.installed-examples
	$(PY) examples/mlp_digits.py

test: $(VENV)/.installed-test
	$(PY) -m pytest -q

# BENCH_ARGS, e.g. `make bench BENCH_ARGS="--quick --only tiny,small"`; see python -m perf.bench --help
bench: $(VENV)/.installed-bench
	$(PY) -m perf.bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
