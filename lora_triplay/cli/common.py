"""What every command shares: the user-error exit and quiet logging."""
from __future__ import annotations

import logging
import os
import sys

import typer

from ..errors import UserError

EXIT_USER_ERROR = 2
# What a user can fix: one line, exit code 2. FileNotFoundError covers paths
# that a library checks before we can word it.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, FileNotFoundError)


def fail(exc: BaseException, debug: bool) -> None:
    """Print a user error as one line and exit with 2 (`--debug`: re-raise)."""
    if debug:
        raise exc
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
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
