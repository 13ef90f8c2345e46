"""`lora-triplay`: thin command line. Parse, load the recipe, hand over.

    train.py       run, validate, plan
    infer.py       export, play, chat, serve
    evaluation.py  eval, report

torch and transformers are imported inside the commands, so `--help` and
recipe checks are instant. Known user errors print one line and exit with
code 2; `--debug` shows the traceback instead.
"""
from __future__ import annotations

import os
import sys

import typer

from . import evaluation, infer, train

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Tri-role self-play RL (red / blue / eval) on one base model with three LoRA adapters.",
    rich_markup_mode="markdown",
)
for module in (train, infer, evaluation):
    module.register(app)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted; resume with --resume --run-dir <run folder>", err=True)
        sys.exit(130)
