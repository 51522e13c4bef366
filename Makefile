# Two commands do all the set-up: `make demo` and `make test`. Both create .venv in the repo root and
# install this project into it (editable, with its test and lint tools).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8501

.PHONY: demo test lint bench venv system-deps clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

system-deps:
	bash scripts/system-deps.sh --with-browser

demo: venv
	bash scripts/system-deps.sh
	PORT=$(PORT) $(PY) -m demo

test: venv system-deps
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: venv
	bash scripts/system-deps.sh
	@for b in collector dashboard planner; do echo "== bench.$$b"; $(PY) -m bench.$$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
