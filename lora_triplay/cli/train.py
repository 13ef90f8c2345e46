"""Training commands: `run`, `validate`, `plan`."""
from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import UserError
from .common import (
    EXIT_USER_ERROR,
    USER_ERRORS,
    fail,
    is_follower,
    progress_logging,
    relaunch,
)


def _default_run_dir(recipe, recipe_path: Path) -> Path:
    name = recipe.run.name or f"{recipe_path.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(recipe.run.root) / name


def _relaunch(nproc: int, config: Optional[Path], recipe_path: Path, overrides: list[str], folder: Path, flags: list[str]) -> None:
    """`run --nproc N`: the same run under `accelerate launch`."""
    relaunch(nproc, config, ["run", str(recipe_path), *overrides, "--run-dir", str(folder), *flags])


def run(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE", help="recipe YAML, e.g. recipes/smoke.yaml"),
    overrides: Optional[List[str]] = typer.Argument(None, metavar="[KEY=VALUE]...", help="dotted overrides, e.g. phases.red.steps=1 iterations=2"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="run folder (default: `<run.root>/<recipe>-<date>-<time>`, "
                                                                   "e.g. adapters/smoke-20261201-081500)"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in --run-dir from its last completed step"),
    allow_recipe_change: bool = typer.Option(False, "--allow-recipe-change", help="on --resume, accept a recipe that differs from the saved one"),
    skip_plan_check: bool = typer.Option(False, "--skip-plan-check", help="on CUDA, start even if `plan` says the recipe does not fit"),
    debug: bool = typer.Option(False, "--debug", help="show Python tracebacks"),
    nproc: int = typer.Option(1, "--nproc", min=1, help="processes on this machine, through `accelerate launch` (data parallel)"),
    accelerate_config: Optional[Path] = typer.Option(None, "--accelerate-config", help="accelerate config for --nproc (default: "
                                                                                       "recipes/accelerate/2proc-1node.yaml)"),
) -> None:
    """Train the game's roles in turn with GRPO (TriPlay: red, blue, eval; `game:` in the recipe).

    Example: `lora-triplay run recipes/smoke.yaml phases.red.steps=1 iterations=1`
    """
    follower = is_follower()
    progress_logging(debug, follower)
    folder = None  # known once the recipe is read; Ctrl-C before that has no folder to name
    try:
        from ..recipe import load_recipe

        recipe = load_recipe(recipe_path, overrides or [])
        if resume and run_dir is None:
            raise UserError("--resume needs --run-dir DIR: the run folder to continue")
        if run_dir is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise UserError("several processes need one run folder: pass --run-dir DIR (or launch with `lora-triplay run --nproc N`)")
        folder = run_dir or _default_run_dir(recipe, recipe_path)
        if nproc > 1:
            flags = [f for f, on in (("--resume", resume), ("--allow-recipe-change", allow_recipe_change),
                                     ("--skip-plan-check", skip_plan_check), ("--debug", debug)) if on]
            _relaunch(nproc, accelerate_config, recipe_path, list(overrides or []), folder, flags)
        from ..core.progress import run_with_progress

        run_with_progress(recipe, folder, resume=resume, allow_recipe_change=allow_recipe_change, check_plan=not skip_plan_check,
                          quiet=follower)
    except USER_ERRORS as exc:
        fail(exc, debug)
    except KeyboardInterrupt:  # Ctrl-C: the last commit stands; say how to go on from it
        typer.echo(_interrupted(recipe_path, overrides or [], folder, nproc, allow_recipe_change, skip_plan_check),
                   err=True)
        raise typer.Exit(130) from None


def _interrupted(recipe_path: Path, overrides: list[str], folder: Optional[Path], nproc: int, allow_change: bool,
                 skip_plan_check: bool) -> str:
    """What Ctrl-C leaves, and the command that goes on from it."""
    again = ["lora-triplay", "run", str(recipe_path), *overrides]
    if nproc > 1:
        again += ["--nproc", str(nproc)]
    if skip_plan_check:
        again.append("--skip-plan-check")
    if folder is None or not (Path(folder) / "state.json").is_file():  # before the first commit: a new run leaves nothing
        where = ["--run-dir", str(folder)] if folder is not None else []
        return f"interrupted before the run's first commit; start it again with: {shlex.join(again + where)}"
    again += ["--resume", "--run-dir", str(folder)]
    if allow_change:
        again.append("--allow-recipe-change")
    return f"interrupted; the run folder keeps its last committed step. Continue with: {shlex.join(again)}"


def validate(
    recipes: List[Path] = typer.Argument(..., metavar="RECIPE... [KEY=VALUE]...", help="recipe files to check, then overrides as for `run`"),
    overrides: List[str] = typer.Option([], "--set", help="dotted override applied to each, e.g. --set iterations=2"),
) -> None:
    """Check recipes without loading a model.

    Example: `lora-triplay validate recipes/*.yaml`, `lora-triplay validate recipes/14b.yaml iterations=2`
    """
    from ..recipe import RecipeError, load_recipe

    # `key=value` after the files, as `run` and `plan` take it (a file whose name holds "=" stays a file)
    # ... and a word with no "=" that names no file (`iterations`): an override missing its value, worded as one
    given = [str(p) for p in recipes[1:] if not p.exists() and ("=" in str(p) or (not p.suffix and "/" not in str(p)))]
    recipes, overrides = [p for p in recipes if str(p) not in given], [*given, *overrides]
    if not recipes:
        typer.secho("error: no recipe file to check; give one before the overrides", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_USER_ERROR)
    bad = 0
    for path in recipes:
        try:
            load_recipe(path, overrides)
            typer.echo(f"ok    {path}")
        except RecipeError as exc:
            bad += 1
            for line in str(exc).splitlines():
                typer.secho(f"error: {line}", fg=typer.colors.RED, err=True)
    raise typer.Exit(EXIT_USER_ERROR if bad else 0)


def plan(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE", help="recipe YAML, e.g. recipes/14b.yaml"),
    overrides: Optional[List[str]] = typer.Argument(None, metavar="[KEY=VALUE]...", help="dotted overrides"),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs (data parallel; with model.fsdp=true the base's layers are sharded across them)"),
    gpu_memory: float = typer.Option(80.0, "--gpu-memory", min=1.0, help="GB per GPU"),
    prompt_tokens: int = typer.Option(1024, "--prompt-tokens", min=1, help="prompt length to plan for"),
    json_out: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    debug: bool = typer.Option(False, "--debug", help="show Python tracebacks"),
) -> None:
    """Memory per GPU for a recipe, from the model config alone (no weights).

    Example: `lora-triplay plan recipes/14b.yaml --gpus 1 --gpu-memory 80`.
    Exits with 2 and one line when the recipe cannot fit.
    """
    try:
        from ..plan import make_plan, render
        from ..recipe import load_recipe

        recipe = load_recipe(recipe_path, overrides or [])
        result = make_plan(recipe, gpus=gpus, gpu_memory_gb=gpu_memory, prompt_tokens=prompt_tokens)
    except USER_ERRORS as exc:
        fail(exc, debug)
    if json_out:
        import json

        typer.echo(json.dumps(result.as_dict(), indent=2))
    else:
        typer.echo(render(result, str(recipe_path)))
    if not result.fits:
        typer.secho(f"error: {result.refusal(str(recipe_path))}", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_USER_ERROR)


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(validate)
    app.command()(plan)
