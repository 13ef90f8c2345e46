"""What the bench scripts share: timing a call, reading a column of a
held-out CSV, saving results as JSON."""
from __future__ import annotations

import csv
import json
import statistics
import time
from pathlib import Path


def call_times(fn, repeats: int, warm: int = 0) -> list[float]:
    """Wall seconds of each of `repeats` calls of `fn`, after `warm` untimed ones."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_time(fn, repeats: int, warm: int = 0) -> float:
    return statistics.median(call_times(fn, repeats, warm))


def csv_column(path: str | Path, column: str, where: tuple[str, str] | None = None) -> list[str]:
    """One column of a CSV file, of the rows whose `where` = (column, value) holds."""
    with Path(path).open(newline="") as f:
        return [r[column] for r in csv.DictReader(f) if where is None or r[where[0]] == where[1]]


def save_results(out: str | Path, results: dict, note: str = "") -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}{note}")
    return out


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file. Split on newlines only: `str.splitlines()` also
    splits on U+2028 and other separators that generated text may carry
    inside a JSON string (an answer in the 2026-12-01 evidence run did)."""
    return [json.loads(line) for line in Path(path).read_text().split("\n") if line.strip()]


def auc(pos: list[float], neg: list[float]) -> float:
    """P(a score of `pos` above one of `neg`), ties half: how well a score
    tells harmful from benign requests, whatever its rate."""
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
