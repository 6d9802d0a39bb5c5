# Entry points (see README): `make fuzz` (the main job), `make test`, and `make demo`.
# Each creates .venv on first use and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
# The package itself asks only for torch>=2.4; this pin picks the CPU build
# that the development machines keep on disk. Override: make test TORCH='torch>=2.4'
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The README's short campaign; nightly CI runs longer ones (.github/workflows/nightly.yml).
FUZZ_BUDGET ?= 60
FUZZ_WORKERS ?= 2

.PHONY: demo docs fuzz lint test venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/simdist demo

fuzz: $(STAMP)
	$(VENV)/bin/simdist fuzz --budget $(FUZZ_BUDGET) --workers $(FUZZ_WORKERS) $(FUZZ_ARGS)

# Lint, format and types first (seconds), then the suite; CI runs exactly this.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

# The documentation site (docs/, Sphinx): warnings are errors, as in CI; the HTML lands in build/docs.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) -m sphinx -b html -E -W --keep-going -q docs build/docs

clean:
	rm -rf $(VENV)
