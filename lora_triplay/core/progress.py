"""What a user sees while a run trains: a bar per phase, a line per step,
and a closing table of the last iteration's metrics."""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table


def step_line(row: dict, headline: dict[str, tuple[str, ...]]) -> str:
    """One step's log line: the game's headline metrics for its phase."""
    parts = [f"it {row['iteration']}", f"{row['phase']:<4}", f"step {row['step']}"]
    for key in headline.get(row["phase"], ("reward_mean",)):
        if key in row:
            parts.append(f"{key}={row[key]:.3f}")
    for key in row:
        if key.startswith("asr_blue@"):
            parts.append(f"{key}={row[key]:.3f}")
    parts.append(f"{row['step_seconds']:.1f}s")
    return "  ".join(parts)


def summary_table(rows: list[dict], iteration: int, headline: dict[str, tuple[str, ...]]) -> Table:
    table = Table(title=f"iteration {iteration}: mean over steps")
    table.add_column("phase")
    table.add_column("steps", justify="right")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for phase in headline:
        mine = [r for r in rows if r["iteration"] == iteration and r["phase"] == phase]
        if not mine:
            continue
        keys = [k for k in headline[phase] if any(k in r for r in mine)]
        keys += sorted({k for r in mine for k in r if k.startswith("asr_") and k not in keys})
        for i, key in enumerate(keys):
            vals = [r[key] for r in mine if key in r]
            table.add_row(phase if i == 0 else "", str(len(mine)) if i == 0 else "", key, f"{sum(vals) / len(vals):.3f}")
    return table


def closing_note(recipe) -> str | None:
    """What to expect from the closing table where a new user first meets it:
    TriPlay on the embedded 135M model (`make demo`), whose numbers look like
    a failure unless told that they are expected at this size."""
    from ..bases import EMBEDDED

    if recipe.model.base != EMBEDDED or recipe.game != "triplay":
        return None
    # At most 80 columns a line: rich's width when stdout is a log, not a terminal.
    # Kept free of one run's numbers: they go stale with every evidence run.
    # It said "eval ~0.6-0.7; blue learns stock replies" until the evidence runs outgrew it (eval 94% on the
    # labelled set, stock replies penalised): what holds for every run is where the verdict comes from.
    return ("note: on SmolLM2-135M a short run shows that the machinery works; whether\n"
            "blue gets safer is measured on held-out sets (recipes/cpu-evidence.yaml,\n"
            '`lora-triplay eval RUN`; README "Does it work?", `make evidence`).')


def run_with_progress(recipe, folder: Path, *, resume: bool, allow_recipe_change: bool, check_plan: bool = True,
                      quiet: bool = False) -> None:
    from ..games import game_class
    from .session import Session

    headline = game_class(recipe.game).headline

    console = Console(stderr=False, quiet=quiet)
    t0 = time.perf_counter()
    console.print(f"[bold]lora-triplay[/] base={recipe.model.base} engine={recipe.engine.backend} run={folder}", soft_wrap=True)
    session = Session.open(recipe, folder, resume=resume, allow_recipe_change=allow_recipe_change, check_plan=check_plan)
    console.print(f"model ready in {time.perf_counter() - t0:.1f}s")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False) as bar:
        tasks: dict = {}

        def phase_start(it, phase, done, total):
            tasks["current"] = bar.add_task(f"iter {it} P_{phase}", total=max(total, 1), completed=done if total else 1)

        def step_done(row):
            console.print(step_line(row, headline), soft_wrap=True)  # piped, rich would cut it at 80 columns
            bar.advance(tasks["current"])

        session.hooks.phase_start = phase_start
        session.hooks.step_done = step_done
        session.run()
    rows = session.store.read_jsonl("metrics")
    last_it = max((r["iteration"] for r in rows), default=recipe.iterations)
    console.print(summary_table(rows, last_it, headline))
    note = closing_note(recipe)
    if note:
        console.print(note, style="dim", soft_wrap=True, markup=False)
    console.print(f"done in {time.perf_counter() - t0:.1f}s; run folder: [bold]{folder.resolve()}[/]", soft_wrap=True)
