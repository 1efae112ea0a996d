# The commands README.md gives a newcomer. `make test` is what .ci/run calls.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv test
venv: $(VENV)/.installed

# Re-install whenever the package metadata changes.
$(VENV)/.installed: pyproject.toml
	@echo ">> creating virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[trainer,test]'
	touch $@

test: venv
	$(PY) -m pytest

# Copy crds/ into the chart and re-render deploy/install.yaml (tests/packaging checks both).
.PHONY: chart-sync
chart-sync:
	hack/chart-sync.sh
