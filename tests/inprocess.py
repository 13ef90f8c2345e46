"""A lora-triplay command run in the test's own process (typer's CliRunner),
read like a finished subprocess: for the commands no kill interrupts,
without a new interpreter's ~4 s of imports (torch, transformers) each."""
from __future__ import annotations

import subprocess


def run_cli(*args) -> subprocess.CompletedProcess:
    from typer.testing import CliRunner

    from lora_triplay.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    return subprocess.CompletedProcess(["lora-triplay", *map(str, args)], result.exit_code, result.stdout, result.output)
