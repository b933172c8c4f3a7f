# Entry points on a fresh machine: `make demo`, `make test` and `make bench`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# PyTensor pins an older numba; it runs from a venv of its own (see perf/impls.py: interpreter).
PYTENSOR_VENV := .venv-pytensor

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

$(PYTENSOR_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PYTENSOR_VENV)
	$(PYTENSOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PYTENSOR_VENV)/bin/python -m pip install --quiet -e '.[bench-pytensor]'
	touch $@

# The other scripts in examples/ run the same way: $(PY) examples/NAME.py
demo: $(VENV)/.installed-examples
	$(PY) examples/mlp_digits.py

test: $(VENV)/.installed-test
	$(PY) -m pytest -q --durations=30 -n auto --dist loadscope

# BENCH_ARGS, e.g. `make bench BENCH_ARGS="--quick --only tiny,small"` (a quick or partial run writes
# perf/results/ only where --json/--markdown say); see python -m perf.bench --help
bench: $(VENV)/.installed-bench $(PYTENSOR_VENV)/.installed
	MORPHJIT_BENCH_PYTENSOR_PYTHON=$(abspath $(PYTENSOR_VENV))/bin/python $(PY) -m perf.bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(PYTENSOR_VENV) build *.egg-info
