"""What every command shares: the user-error exit and quiet logging."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import UserError

EXIT_USER_ERROR = 2
# What a user can fix: one line, exit code 2. OSError covers what the
# machine refuses, often inside a library before we can word it: a missing
# path, a read-only or full disk, a folder where a file should be, a refused
# connection to an endpoint.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, OSError)


def describe(exc: BaseException) -> str:
    """One line for the error: ours say what to do; the machine's name the
    path and the reason."""
    if isinstance(exc, (UserError, FileNotFoundError)):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return (f"{exc.filename}: {exc.strerror} ({type(exc).__name__}, errno {exc.errno}); check the path, its permissions "
                "and the disk's free space (--debug shows the traceback)")
    return f"{type(exc).__name__}: {exc} (--debug shows the traceback)"  # e.g. a connection an engine or endpoint dropped


def fail(exc: BaseException, debug: bool) -> None:
    """Print a user error as one line and exit with 2 (`--debug`: re-raise)."""
    if debug:
        raise exc
    for line in describe(exc).splitlines():  # several problems (a recipe's): each its own `error:` line
        typer.secho(f"error: {line}", fg=typer.colors.RED, err=True)
    raise typer.Exit(EXIT_USER_ERROR)


def quiet(debug: bool) -> None:
    """Keep stdout for results: library chatter goes to stderr, and less of it."""
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(message)s", stream=sys.stderr)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not debug:
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except ImportError:  # pragma: no cover
            pass


def progress_logging(debug: bool, follower: bool) -> None:
    """Logging for the commands that show their own progress (`run`, `eval`):
    our `lora_triplay` lines at INFO, every other library at WARNING (their
    INFO lines, such as sentence-transformers' "Loading SentenceTransformer
    model from ...", say nothing a user acts on), and no transformers progress
    bars: piped into a log each bar redraw becomes a line of garbage, and our
    own lines already say what is loading. `--debug` shows everything."""
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(message)s")
    logging.getLogger("lora_triplay").setLevel(logging.WARNING if follower else logging.DEBUG if debug else logging.INFO)
    if debug:
        return
    try:
        from huggingface_hub.utils import enable_progress_bars
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        return
    hf_logging.disable_progress_bar()  # transformers' bars, and the hub's with them
    if sys.stderr.isatty():
        enable_progress_bars()  # a first download of a hub model takes minutes: keep its bar where it redraws in place


ACCELERATE_CONFIG = Path(__file__).resolve().parents[2] / "recipes" / "accelerate" / "2proc-1node.yaml"


def is_follower() -> bool:
    """Ranks > 0 of a multi-process command stay quiet and write nothing."""
    return int(os.environ.get("RANK", "0")) != 0


def relaunch(nproc: int, config: Optional[Path], command: list[str]) -> None:
    """`--nproc N`: `lora-triplay <command>` again under `accelerate launch`,
    N processes on this machine (GPUs if there are, gloo on the CPU if not);
    exits with its status."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise UserError("--nproc needs accelerate: pip install accelerate")
    config = config or (ACCELERATE_CONFIG if ACCELERATE_CONFIG.is_file() else None)  # the repo's; a wheel has none
    if config is not None and not Path(config).is_file():
        raise UserError(f"--accelerate-config {config}: no such file (see recipes/accelerate/ for examples)")
    setup = ["--config_file", str(config)] if config else ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *setup, "--num_processes", str(nproc), "-m", "lora_triplay.cli", *command]
    raise typer.Exit(subprocess.call(cmd))


def argv_without(argv: list[str], *flags: str) -> list[str]:
    """`argv` without each of `flags` and its value (`--flag V` or `--flag=V`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not any(a.startswith(f + "=") for f in flags):
            out.append(a)
    return out
