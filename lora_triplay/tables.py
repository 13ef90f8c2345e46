"""The one reader of tabular files (seed prompts, benchmarks, labelled
sets): .csv, .jsonl, or a .json array of objects, UTF-8, every problem one
line naming the file and the fix, raised as the caller's error type."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from .errors import UserError


def parse_jsonl(name: str, text: str, error: type[UserError] = UserError) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{name}: line {n} is not valid JSON ({e.msg}); write one JSON object per line") from None
        if not isinstance(row, dict):
            raise error(f"{name}: line {n} is not a JSON object; write one JSON object per line")
        rows.append(row)
    return rows


def read_rows(path: str | Path, error: type[UserError] = UserError, missing_hint: str = "check the path") -> list[dict[str, Any]]:
    """Rows of a .csv, .jsonl or .json (array or JSON lines) file, keys as in the file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise error(f"{p}: file not found; {missing_hint}")
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{p}: not valid UTF-8 (byte {e.start}); re-save the file as UTF-8 (e.g. `iconv -t UTF-8`)") from None
    if not text.strip():
        raise error(f"{p}: file is empty; it needs a header row (CSV) or one JSON object per line (JSONL)")
    suffix = p.suffix.lower()
    if suffix == ".csv":
        try:  # newline="" keeps CRLF inside quoted fields (HarmBench's ContextString)
            rows = list(csv.DictReader(io.StringIO(text, newline="")))
        except csv.Error as e:
            raise error(f"{p}: not a readable CSV ({e}); export it again as comma-separated UTF-8") from None
        return [{k: v for k, v in r.items() if k is not None} for r in rows]
    if suffix in (".jsonl", ".json"):
        if suffix == ".json" and text.lstrip().startswith("["):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise error(f"{p}: not valid JSON ({e.msg}, line {e.lineno}); fix the file or write JSON lines") from None
            if not all(isinstance(r, dict) for r in data):
                raise error(f"{p}: the JSON array must hold objects")
            return data
        return parse_jsonl(str(p), text, error)
    raise error(f"{p}: unsupported file type {p.suffix!r}; use a .csv, .jsonl or .json file")


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """Every column name, in first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update((str(k), None) for k in row if k is not None)
    return list(seen)
