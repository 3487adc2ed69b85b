# Everything runs from a local virtual environment that the first target creates.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: compare test lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

compare: $(STAMP)  ## crashbench compare on the default scenario, embedded server
	$(BIN)/crashbench compare

test: $(STAMP)  ## the test suite (starts its own servers)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)  ## compare's wall time vs ideal and vs the lesson's script, worker start-up
	$(BIN)/python bench/compare_vs_lesson.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
