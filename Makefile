# Two entry points on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test clean

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

# The other scripts in examples/ run the same way: $(PY) examples/NAME.py
demo: $(VENV)/.installed-examples
	$(PY) examples/mlp_digits.py

test: $(VENV)/.installed-test
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
