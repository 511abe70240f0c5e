# Two commands do all set-up and work (see README):
#   make demo   - builds the environment if needed, then runs the whole DAG locally
#   make test   - builds the environment if needed, then runs the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint format compile image-tag install clean

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	# setuptools as Dockerfile.train-deps pins it: torch 2.11.0 caps it < 82, and the venv's own has no bdist_wheel
	$(PY) -m pip install -q --upgrade "pip==26.3" "setuptools==81.0.0"
	# torch first, pinned: an unpinned torch pulled by another package downloads GBs
	$(PY) -m pip install -q torch==2.11.0 torchvision==0.26.0
	$(PY) -m pip install -q -c requirements.lock -e ".[train,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m pipelines.run --local

test: lint
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test-fast: $(STAMP)
	$(PY) -m pytest -m "not pipeline"

compile: $(STAMP)
	$(PY) -m pipelines.compile --config configs/qwen3_vl_4b/lora_seed.yaml

# The images' tag: a hash of the files they hold (images/README.md); standard library only.
image-tag:
	@$(PYTHON) -m components.images --tag

clean:
	rm -rf $(VENV) build runs .setuptools-build
