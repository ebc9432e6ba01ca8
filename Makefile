# Every target works on a fresh machine: `make install` creates .venv with edgeserve in it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install system-deps test check demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,aws,ocr]'
	touch $@

system-deps:  ## sshd, rsync and fonts for the deploy and OCR tests (apt, once per machine)
	bash scripts/system-deps.sh

test: install system-deps
	$(BIN)/python -m pytest -q

check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports  # the layers and no cycles: [tool.importlinter] in pyproject.toml

demo: install
	$(BIN)/python functions/ocr/demo.py

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache
