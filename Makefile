# Two commands do all the set-up: `make demo` and `make test`. Both create .venv in the repo root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8501
export PYTHONPATH := $(CURDIR)

.PHONY: demo test bench venv system-deps clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -r requirements.txt
	touch $@

venv: $(VENV)/.installed

system-deps:
	bash scripts/system-deps.sh --with-browser

demo: venv
	bash scripts/system-deps.sh
	PORT=$(PORT) $(PY) -m demo

test: venv system-deps
	$(PY) -m pytest -q

bench: venv
	bash scripts/system-deps.sh
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache
