"""The prepared GPU check must not rot between the sessions that have a
GPU: its dry run (the 8B config scaled down, on the CPU) goes through every
stage the real run does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] and set(result["stages"]) >= {"update", "decode", "loop"}
    update = result["stages"]["update"]
    assert update["chunked"]["layout"] == "full_sequence" and not update["chunked"]["skipped"]
    assert [s["phase"] for s in result["stages"]["loop"]["steps"]] == ["red", "red", "blue", "blue", "eval", "eval"]
