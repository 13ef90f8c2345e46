#!/usr/bin/env bash
# The prepared GPU check: paper scale on one GPU, no internet, no vLLM.
# Under 7 minutes on one H200 (what it does: bench/gpu_check.py's and bench/gpu_fsdp_check.py's headers).
#
# The GPU image has torch (2.11), transformers 5.17 and peft but not pydantic, which the
# recipe schema needs, nor liger-kernel. Carry them as wheels built here:
#     make gpu-wheels            # fills .whl/ (git-ignored): pydantic, liger-kernel and our transformers/peft pins, Python 3.12
# then, with the device tool: run `bash bench/gpu_check.sh` with carry [".whl"].
# Results: $OUT/gpu_check.json (or bench/results/gpu_check.json) and the log.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch, transformers, peft, pydantic; print('torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__, '| pydantic', pydantic.__version__)"
OUT_DIR=${OUT:-bench/results}
mkdir -p "$OUT_DIR"
timeout 420 python3 bench/gpu_check.py --out "$OUT_DIR/gpu_check.json" "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
# model.fsdp on the GPU: a sharded base lands there and computes what the unsharded one does (~1 min)
timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node 1 bench/gpu_fsdp_check.py --out "$OUT_DIR/gpu_fsdp_check.json" 2>&1 \
    | tee -a "$OUT_DIR/gpu_check.log"
