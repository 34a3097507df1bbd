# fasttrain — `make help` lists the targets. `make train` / `make test` create .venv on first use.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install only when the project's dependencies change.
STAMP := $(VENV)/.installed
# dev tools, and the optional packages whose tests would otherwise skip (ONNX export, notebooks,
# Optuna sweeps, the SLURM launcher, copier, image decoding and shards, BPE tokenizers, MLflow, W&B)
EXTRAS ?= dev,export,notebooks,sweep,cluster,template,data,text,mlflow,wandb
ARGS ?=
# one pytest worker per CPU, each taking whole test files (a file's shared runs are made once);
# TEST_WORKERS=0 runs in this process (a debugger, -s)
TEST_WORKERS ?= logical
PYTEST := $(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# make tensorboard PORT=6007; make notebook NB_PORT=8889; make new-project NAME=acme_vision DEST=../acme_vision
PORT ?= 6006
# where runs go: $FASTTRAIN_ROOT/logs when it is set, else logs/ here (conf/paths)
LOG_DIR ?= $(if $(strip $(FASTTRAIN_ROOT)),$(strip $(FASTTRAIN_ROOT))/logs,logs)
NB_PORT ?= 8888
NAME ?=
DEST ?=

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

.PHONY: help install train export test test-slow lint format bench clean typecheck tensorboard notebook new-project doctor

help: ## show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-12s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv and install the project (editable) with dev tools

train: $(STAMP) ## train the default experiment (CNN on digits); pass overrides as ARGS="k=v ..."
	$(BIN)/python train.py $(ARGS)

export: $(STAMP) ## export CKPT=x.ckpt to ONNX, TorchScript, int8, fp16 and check each
	@test -n "$(CKPT)" || { echo "usage: make export CKPT=logs/train/<run>/checkpoints/last.ckpt [ARGS=format=onnx]" >&2; exit 2; }
	$(BIN)/python -m fasttrain.export "ckpt_path='$(CKPT)'" $(ARGS)

test: $(STAMP) ## run the test suite (offline, CPU, minutes); slow tests: make test-slow
	$(PYTEST) -m "not slow" $(ARGS)

test-slow: $(STAMP) ## run only the long tests (CI runs them after make test)
	@# pytest exits 5 when no test is marked slow: nothing to run is not a failure.
	$(PYTEST) -m slow $(ARGS) || [ $$? -eq 5 ]

lint: $(STAMP) ## ruff lint + format check, then mypy on src/
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck

typecheck: $(STAMP) ## mypy on src/ (settings in pyproject.toml)
	$(BIN)/mypy

format: $(STAMP) ## ruff fix + format
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP) ## CPU benchmark: template vs hand-written loop -> bench/results/cpu.json
	$(BIN)/python bench/overhead.py

tensorboard: $(STAMP) ## serve logs/ (FASTTRAIN_ROOT's logs/ where set) on http://127.0.0.1:$(PORT) (PORT=6006), unsmoothed; every run listed by name
	$(BIN)/python -m fasttrain.tools.board --logdir "$(LOG_DIR)" --host 127.0.0.1 --port $(PORT)

notebook: $(STAMP) ## open notebooks/ in JupyterLab on http://127.0.0.1:$(NB_PORT) (NB_PORT=8888; it prints the link with its token)
	@# as root (a container), JupyterLab wants --allow-root; it still serves 127.0.0.1 only, behind its token
	$(BIN)/jupyter-lab --no-browser --ip 127.0.0.1 --port $(NB_PORT) --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

new-project: $(STAMP) ## a new project of your own: make new-project NAME=acme_vision DEST=../acme_vision
	@test -n "$(NAME)" -a -n "$(DEST)" || { echo "usage: make new-project NAME=acme_vision DEST=../acme_vision" >&2; exit 2; }
	$(BIN)/python -m fasttrain.tools.new_project create "$(DEST)" --package "$(NAME)"

doctor: $(STAMP) ## check that Python, torch, CUDA, driver and GPUs fit together (ARGS=--json for JSON)
	$(BIN)/python -m fasttrain.doctor $(ARGS)

clean: ## remove run outputs and caches (keeps .venv)
	rm -rf logs outputs multirun lightning_logs .pytest_cache .ruff_cache .mypy_cache
