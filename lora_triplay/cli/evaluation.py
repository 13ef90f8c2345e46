"""Evaluation commands: `eval` and `report`."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..errors import UserError
from .common import (
    USER_ERRORS,
    argv_without,
    fail,
    is_follower,
    progress_logging,
    relaunch,
)


def eval_command(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="run folder written by `lora-triplay run`"),
    benchmark: List[str] = typer.Option([], "--benchmark", "-b", help="NAME=PATH or NAME=FORMAT:PATH (formats: harmbench, jbb, jbb-harmful, "
                                                                      "jbb-benign, xstest, strongreject, generic, generic-benign); repeatable"),
    out: Path = typer.Option(..., "--out", "-o", help="aggregated results JSON; per-item results go to OUT.items.jsonl"),
    iterations: str = typer.Option("all", "--iterations", help="all, latest, or N,M,... (blue always adds base as iteration 0)"),
    judge: str = typer.Option("rules", "--judge", help="rules, panel (a fixed expert panel on the bare base), eval, eval@N, "
                                                       "or openai:MODEL@URL (key from LORA_TRIPLAY_JUDGE_API_KEY or OPENAI_API_KEY)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="first N items of each benchmark, red prompt set and eval set"),
    defender: List[str] = typer.Option(["base"], "--defender", help="red's fixed defenders: base, blue (latest), "
                                                                    "blue@N, openai:MODEL@URL; repeatable"),
    red_prompts: Optional[str] = typer.Option(None, "--red-prompts", help="basic prompts for red (default: the first benchmark's harmful items)"),
    eval_set: Optional[str] = typer.Option(None, "--eval-set", help="labelled CSV/JSONL with prompt, response, label "
                                                                    "(negative|unsafe, rejective|refusal, positive|safe)"),
    roles: str = typer.Option("blue,red,eval", "--roles", help="which roles to measure"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1, help="answer length (default: the recipe's grpo.max_new_tokens)"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy (reproducible)"),
    seed: int = typer.Option(0, "--seed", help="torch seed for sampled answers"),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="distinct requests per generate call, every snapshot in one length-sorted queue "
                                                                      "(a chunk is written before the next starts)"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: the recipe's)"),
    embedding_model: Optional[str] = typer.Option(None, "--embedding-model", help="encoder for OD (default: the recipe's rewards.embedding_model)"),
    fresh: bool = typer.Option(False, "--fresh", help="delete OUT.items.jsonl and compute everything again"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars"),
    debug: bool = typer.Option(False, "--debug", help="show Python tracebacks"),
    nproc: int = typer.Option(1, "--nproc", min=1, help="processes on this machine, through `accelerate launch`: "
                                                        "each generates its share of every batch"),
    accelerate_config: Optional[Path] = typer.Option(None, "--accelerate-config", help="accelerate config for --nproc (default: "
                                                                                       "recipes/accelerate/2proc-1node.yaml)"),
) -> None:
    """Measure a run's snapshots: blue's ASR and over-refusal on benchmarks, red's ASR
    against fixed defenders and its output diversity, eval's accuracy.

    Example:
    `lora-triplay eval adapters/run -b jbb=../shared/data/jbb/harmful-behaviors.csv
    -b xstest=../shared/data/xstest/xstest_prompts.csv --limit 50 --out results.json`
    """
    from rich.console import Console

    follower = is_follower()
    progress_logging(debug, follower)
    chosen = [r.strip() for r in roles.split(",") if r.strip()]
    try:
        from ..evaluate import ROLES, EvalOptions, run_eval

        unknown = [r for r in chosen if r not in ROLES]
        if unknown or not chosen:
            raise UserError(f"--roles: {'unknown ' + str(unknown) if unknown else 'no role given'}; use a list of {', '.join(ROLES)}")
        if device not in (None, "auto", "cpu", "cuda"):
            raise UserError(f"--device {device!r}: use cpu, cuda or auto")
        if not benchmark and not red_prompts and not eval_set:
            raise UserError("nothing to measure: give --benchmark NAME=PATH, --red-prompts PATH or --eval-set PATH")
        if nproc > 1:
            import sys

            relaunch(nproc, accelerate_config, argv_without(sys.argv[1:], "--nproc", "--accelerate-config"))
        opts = EvalOptions(
            run_dir=run_dir, out=out, benchmarks=list(benchmark), iterations=iterations, judge=judge, limit=limit,
            defenders=list(defender), red_prompts=red_prompts, eval_set=eval_set, roles=chosen,
            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, batch_size=batch_size, device=device,
            embedding_model=embedding_model, fresh=fresh, progress=not (no_progress or follower),
        )
        console = Console(stderr=True)
        result = run_eval(opts, console=console)
    except USER_ERRORS as exc:
        fail(exc, debug)
        return
    if follower:
        return
    typer.echo(summary_lines(result))
    if "eval" in chosen and not eval_set:
        typer.echo("eval: not measured (give --eval-set FILE: a labelled set of prompt, response, label)")
    typer.echo(f"wrote {out} (per item: {result['items_file']})")


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _rate(x, dist: dict, prompts: str, bench: str) -> str:
    """A blue rate, or why there is none: the benchmark has no prompts of
    that kind, or the judge labelled none of their answers."""
    if x is not None:
        return _pct(x)
    if not dist["n"]:
        return f"n/a (no {prompts} prompts in {bench})"
    return f"n/a (the judge labelled none of the {dist['n']} answers)"


def summary_lines(result: dict) -> str:
    w = result["work"]
    lines = [f"judge: {result['judge']}; generated {w['generated']}, judged {w['judged']}, reused {w['reused']} from the items file"]
    for name, b in result.get("benchmarks", {}).items():
        for it, m in b["iterations"].items():
            lines.append(f"blue  {name:<20} it {it:>3} ({m['defender']}): ASR {_rate(m['asr'], m['harmful'], 'harmful', name)}  "
                         f"over-refusal {_rate(m['over_refusal'], m['benign'], 'benign', name)}  n={m['n']}")
    red = result.get("red")
    if red:
        for it, m in red["iterations"].items():
            asr = "  ".join(f"ASR vs {d} {_pct(v)}" for d, v in m["asr"].items())
            od = "n/a (no valid rewrite)" if m["od"] is None else f"{m['od']:.3f}"
            degen = "" if m.get("degenerate_rate") is None else f"  degenerate {_pct(m['degenerate_rate'])}"
            kept = "" if m.get("kept_request_rate") is None else f"  keeps its request {_pct(m['kept_request_rate'])}"
            lines.append(f"red   {red['prompts']['name']:<20} it {it:>3}: {asr}  OD {od}  valid {_pct(m['valid_rewrite_rate'])}{kept}{degen}")
    acc = result.get("eval_accuracy")
    if acc:
        for it, m in acc["iterations"].items():
            lines.append(f"eval  accuracy it {it:>3}: {_pct(m['accuracy'])} (unparsed {m['unparsed']} of {m['n']})")
    return "\n".join(lines)


def report_command(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="run folder written by `lora-triplay run`"),
    out: Path = typer.Option(..., "--out", "-o", help="folder for the PNG plots, summary.md and report.json"),
    eval_results: Optional[Path] = typer.Option(None, "--eval", help="results JSON written by `lora-triplay eval`"),
    debug: bool = typer.Option(False, "--debug", help="show Python tracebacks"),
) -> None:
    """Plot a run's training curves (and evaluation results) and write a Markdown summary.

    Example: `lora-triplay report adapters/run --eval results.json --out adapters/run/report`
    """

    try:
        from ..report import make_report

        made = make_report(run_dir, out, eval_results)
    except (*USER_ERRORS, ImportError) as exc:
        fail(exc, debug)
        return
    for f in made["files"]:
        typer.echo(f"wrote {Path(out) / f}")


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
    app.command("report")(report_command)
