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

# Metrics worth a column in the one-line-per-step log, by phase.
HEADLINE = {
    "red": ("reward_mean", "asr_blue", "asr_base", "semantic_pass_rate", "diversity_penalty", "entropy"),
    "blue": ("reward_mean", "rate_negative", "rate_rejective", "rate_positive", "benign_refusal_rate", "kl"),
    "eval": ("reward_mean", "accuracy", "labelled_pairs", "panel_agreement", "kl"),
    "eval_warmup": ("reward_mean", "accuracy", "labelled_pairs", "panel_agreement"),
}


def step_line(row: dict) -> str:
    parts = [f"it {row['iteration']}", f"{row['phase']:<4}", f"step {row['step']}"]
    for key in HEADLINE.get(row["phase"], ("reward_mean",)):
        if key in row:
            parts.append(f"{key}={row[key]:.3f}")
    for key in row:
        if key.startswith("asr_blue@"):
            parts.append(f"{key}={row[key]:.3f}")
    parts.append(f"{row['step_seconds']:.1f}s")
    return "  ".join(parts)


def summary_table(rows: list[dict], iteration: int) -> Table:
    table = Table(title=f"iteration {iteration}: mean over steps")
    table.add_column("phase")
    table.add_column("steps", justify="right")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for phase in HEADLINE:
        mine = [r for r in rows if r["iteration"] == iteration and r["phase"] == phase]
        if not mine:
            continue
        keys = [k for k in HEADLINE[phase] if any(k in r for r in mine)]
        keys += sorted({k for r in mine for k in r if k.startswith("asr_") and k not in keys})
        for i, key in enumerate(keys):
            vals = [r[key] for r in mine if key in r]
            table.add_row(phase if i == 0 else "", str(len(mine)) if i == 0 else "", key, f"{sum(vals) / len(vals):.3f}")
    return table


def run_with_progress(recipe, folder: Path, *, resume: bool, allow_recipe_change: bool, check_plan: bool = True,
                      quiet: bool = False) -> None:
    from .session import Session

    console = Console(stderr=False, quiet=quiet)
    t0 = time.perf_counter()
    console.print(f"[bold]lora-triplay[/] base={recipe.model.base} engine={recipe.engine.backend} run={folder}")
    session = Session.open(recipe, folder, resume=resume, allow_recipe_change=allow_recipe_change, check_plan=check_plan)
    console.print(f"model ready in {time.perf_counter() - t0:.1f}s")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False) as bar:
        tasks: dict = {}

        def phase_start(it, phase, done, total):
            tasks["current"] = bar.add_task(f"iter {it} P_{phase}", total=max(total, 1), completed=done if total else 1)

        def step_done(row):
            console.print(step_line(row))
            bar.advance(tasks["current"])

        session.hooks.phase_start = phase_start
        session.hooks.step_done = step_done
        session.run()
    rows = session.store.read_jsonl("metrics")
    last_it = max((r["iteration"] for r in rows), default=recipe.iterations)
    console.print(summary_table(rows, last_it))
    console.print(f"done in {time.perf_counter() - t0:.1f}s; run folder: [bold]{folder.resolve()}[/]")
