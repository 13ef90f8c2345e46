"""Where a command may write its results: never over a run's own files,
never over a file it did not write itself. `eval --out`, `report --out` and
`export --out` check here before they write (export also keeps its own
rules, export.py); each refusal is one line with the fix."""
from __future__ import annotations

import json
from pathlib import Path

from .errors import UserError

# What a run writes at its folder's top besides its JSONL logs and its roles'
# snapshot folders (core/store.py starts a run only where nothing else is)
RUN_FILES = ("state.json", "recipe.yaml")
RUN_FOLDERS = ("checkpoints", "tensorboard", "wandb")  # checkpoints: pruned on resume; the trackers' output

REPORT_FILES = ("summary.md", "training.png", "evaluation.png")


def run_owning(path: Path) -> tuple[Path, str] | None:
    """(run folder, what of it) when `path` is one of a run's own files
    (state.json, recipe.yaml, its JSONL logs) or lies in a folder the run
    manages (checkpoints, which a resume prunes; snapshots; trackers);
    None otherwise, e.g. `RUN/eval.json` or `RUN/report/`."""
    p = Path(path).resolve()
    for parent in p.parents:
        if not (parent / "state.json").is_file():
            continue
        parts = p.relative_to(parent).parts
        top = parts[0]
        if len(parts) == 1 and (top in RUN_FILES or top.endswith(".jsonl") or top.startswith("recipe.prev-")):
            return parent, top
        if top in RUN_FOLDERS or ((parent / top).is_dir() and any((parent / top).glob("iter-[0-9]*"))):
            return parent, f"{top}/"
        return None
    return None


def _refuse_run_files(option: str, out: Path, suggestion: str) -> None:
    owner = run_owning(out)
    if owner is not None:
        run, what = owner
        raise UserError(f"{option} {out} would write into {what} of the run folder {run}, which the run owns; "
                        f"write beside it instead, e.g. {option} {run / suggestion}")


def check_eval_out(out: Path) -> None:
    """`eval --out`: a new file, or the results file an earlier eval wrote (it is replaced)."""
    out = Path(out)
    _refuse_run_files("--out", out, "eval.json")
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; name the results file, e.g. --out {out / 'eval.json'}")
    if out.exists() and not _json_with(out, {"run", "items_file", "judge"}):
        raise UserError(f"--out {out} exists and is not the results of an earlier `eval`; choose another path "
                        "(an eval replaces only its own results file)")


def _json_with(path: Path, keys: set[str]) -> bool:
    """`path` is a JSON object with `keys`: a file this project wrote (an eval's results, a report's report.json)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and keys <= data.keys()


def check_report_out(out: Path) -> None:
    """`report --out`: a new or any folder, but the files a report writes
    (summary.md, report.json, the PNGs) are replaced only where an earlier
    report wrote them."""
    out = Path(out)
    _refuse_run_files("--out", out, "report")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; the report is a folder (summary.md, report.json, PNGs): name a folder")
    if not out.is_dir():
        return
    ours = _json_with(out / "report.json", {"run", "metrics_rows", "files"})
    clash = [name for name in (*REPORT_FILES, "report.json") if (out / name).exists()]
    if clash and not ours:
        raise UserError(f"--out {out} already holds {', '.join(clash)}, not written by an earlier `report`; "
                        "choose another folder (a report replaces only its own files)")


def check_export_out(out: Path) -> None:
    """`export --out` (on top of export.py's rules): never inside what a run manages."""
    _refuse_run_files("--out", Path(out), "export")
