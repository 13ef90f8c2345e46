"""Benchmark file loaders for `lora-triplay eval`: one item list per file.

Every loader returns :class:`Item` rows (id, prompt, category, expected) where
`expected` is `harmful` (a safe model refuses or redirects) or `benign` (a
safe model answers; a refusal is over-refusal). The format is detected from
the columns, or named in the spec `NAME=FORMAT:PATH`:

| format        | detected by columns                    | items                                   |
| ------------- | -------------------------------------- | --------------------------------------- |
| harmbench     | Behavior + FunctionalCategory          | FunctionalCategory = standard, harmful  |
| jbb           | goal + target + behavior (any case)    | harmful or benign from the file name    |
| jbb-harmful   | (named)                                | all harmful                             |
| jbb-benign    | (named)                                | all benign                              |
| xstest        | prompt + type + label                  | label safe -> benign, unsafe -> harmful |
|               |                                        | (no label column: `contrast_` types are |
|               |                                        | unsafe)                                 |
| strongreject  | forbidden_prompt                       | all harmful                             |
| generic       | a prompt column (see PROMPT_COLUMNS)   | label column if any, else harmful       |
| generic-benign| (named)                                | label column if any, else benign        |

Generic label values: harmful / unsafe / 1 / true / yes -> harmful;
benign / safe / 0 / false / no -> benign.

The labelled set for eval accuracy (:func:`load_eval_set`) needs prompt,
response and label columns; labels map by :data:`EVAL_LABEL_MAP`.

Files are read from the path the user gives; the project ships none of them.
Every problem raises :class:`BenchmarkError` with one line naming the file
and the fix.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import tables
from .errors import UserError

EXPECTED = ("harmful", "benign")
FORMATS = ("harmbench", "jbb", "jbb-harmful", "jbb-benign", "xstest", "strongreject", "generic", "generic-benign")
PROMPT_COLUMNS = ("prompt", "goal", "behavior", "forbidden_prompt", "question", "instruction", "query", "text")
LABEL_COLUMNS = ("expected", "label", "harmful", "is_harmful")
CATEGORY_COLUMNS = ("category", "semanticcategory", "risk_type", "type")
ID_COLUMNS = ("id", "behaviorid", "traceid", "index")

_HARMFUL_VALUES = {"harmful", "unsafe", "1", "true", "yes"}
_BENIGN_VALUES = {"benign", "safe", "0", "false", "no"}

# Labels of a labelled eval set -> the three classes of method.md.
EVAL_LABEL_MAP = {
    "negative": "negative", "unsafe": "negative", "harmful": "negative", "jailbroken": "negative",
    "rejective": "rejective", "refusal": "rejective", "refused": "rejective", "refuse": "rejective",
    "reject": "rejective", "rejected": "rejective",
    "positive": "positive", "safe": "positive", "helpful": "positive", "safe_helpful": "positive",
}


class BenchmarkError(UserError):
    """A benchmark file cannot be used; the message is one line with the fix."""


@dataclass(frozen=True)
class Item:
    id: str
    prompt: str
    category: str
    expected: str  # harmful | benign

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Benchmark:
    name: str
    path: str
    format: str
    items: list[Item]

    def counts(self) -> dict[str, int]:
        return {e: sum(i.expected == e for i in self.items) for e in EXPECTED}


@dataclass(frozen=True)
class LabelledPair:
    id: str
    prompt: str
    response: str
    label: str  # negative | rejective | positive
    kind: str | None = None  # harmful | benign: the request's, if the set says (a `kind` column)


# ------------------------------------------------------------------ reading


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    return tables.read_rows(path, BenchmarkError, "pass the path of a downloaded benchmark file (.csv or .jsonl)")


def _lower_keys(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{str(k).strip().lower(): v for k, v in r.items()} for r in rows]


def _cell(row: dict[str, Any], key: str | None) -> str:
    if key is None:
        return ""
    value = row.get(key)
    return "" if value is None else str(value).strip()


def detect_format(columns: list[str], path: str | Path) -> str:
    cols = {c.lower() for c in columns}
    if {"behavior", "functionalcategory"} <= cols:
        return "harmbench"
    if {"goal", "target", "behavior"} <= cols:
        return "jbb"
    if {"prompt", "type", "label"} <= cols:
        return "xstest"
    if "forbidden_prompt" in cols:
        return "strongreject"
    return "generic"


def parse_spec(spec: str) -> tuple[str, str | None, str]:
    """`NAME=FORMAT:PATH`, `NAME=PATH` or `PATH` -> (name, format or None, path)."""
    name, eq, rest = spec.partition("=")
    if not eq:
        name, rest = "", spec
    fmt, colon, path = rest.partition(":")
    if not colon or fmt.lower() not in FORMATS:
        fmt, path = None, rest
    else:
        fmt = fmt.lower()
    name = name.strip() or Path(path).stem.replace("-", "_")
    if not path.strip():
        raise BenchmarkError(f"benchmark {spec!r}: no file path; write NAME=PATH or NAME=FORMAT:PATH (formats: {', '.join(FORMATS)})")
    return name, fmt, path.strip()


# ------------------------------------------------------------------ loaders


def _unique_ids(items: list[Item]) -> list[Item]:
    """Resume keys need unique ids: repeated ids get a `#n` suffix."""
    seen: dict[str, int] = {}
    out = []
    for it in items:
        n = seen.get(it.id, 0)
        seen[it.id] = n + 1
        out.append(it if n == 0 else Item(f"{it.id}#{n}", it.prompt, it.category, it.expected))
    return out


def _expected_value(value: str, file: str, row: int, column: str) -> str:
    v = value.strip().lower()
    if v in _HARMFUL_VALUES:
        return "harmful"
    if v in _BENIGN_VALUES:
        return "benign"
    raise BenchmarkError(
        f"{file}: row {row} has {column} = {value!r}; use harmful/unsafe/1 or benign/safe/0 in column {column!r}"
    )


def _need(file: str, fmt: str, cols: list[str], needed: tuple[str, ...]) -> None:
    missing = [c for c in needed if c not in cols]
    if missing:
        raise BenchmarkError(
            f"{file}: format {fmt} needs columns {list(needed)}, missing {missing} (found {cols}); "
            f"pass the right file or name another format as NAME=FORMAT:PATH ({', '.join(FORMATS)})"
        )


def _load(rows: list[dict[str, Any]], fmt: str, file: str) -> list[Item]:
    rows = _lower_keys(rows)
    cols = tables.columns(rows)
    stem = Path(file).stem
    items: list[Item] = []
    if fmt == "harmbench":
        _need(file, fmt, cols, ("behavior", "functionalcategory"))
        for i, r in enumerate(rows):
            if _cell(r, "functionalcategory") == "standard" and _cell(r, "behavior"):
                items.append(Item(_cell(r, "behaviorid") or f"{stem}-{i:04d}", _cell(r, "behavior"),
                                  _cell(r, "semanticcategory") or "unknown", "harmful"))
    elif fmt.startswith("jbb"):
        _need(file, fmt, cols, ("goal",))
        if fmt == "jbb":
            low = stem.lower()
            if ("benign" in low) == ("harmful" in low):
                raise BenchmarkError(
                    f"{file}: cannot tell JBB harmful from benign by the file name; name the format as "
                    f"NAME=jbb-harmful:PATH or NAME=jbb-benign:PATH"
                )
            fmt = "jbb-benign" if "benign" in low else "jbb-harmful"
        expected = fmt.split("-", 1)[1]
        for i, r in enumerate(rows):
            if _cell(r, "goal"):
                items.append(Item(f"jbb-{expected}-{_cell(r, 'index') or i}", _cell(r, "goal"),
                                  _cell(r, "category") or _cell(r, "behavior") or "unknown", expected))
    elif fmt == "xstest":
        _need(file, fmt, cols, ("prompt",))
        if "label" not in cols and "type" not in cols:
            raise BenchmarkError(f"{file}: format xstest needs a label (safe/unsafe) or type column (found {cols})")
        for i, r in enumerate(rows):
            if not _cell(r, "prompt"):
                continue
            typ = _cell(r, "type")
            label = _cell(r, "label").lower() or ("unsafe" if typ.startswith("contrast_") else "safe")
            items.append(Item(f"xstest-{_cell(r, 'id') or i}", _cell(r, "prompt"), typ or "unknown",
                              _expected_value(label, file, i + 1, "label")))
    elif fmt == "strongreject":
        _need(file, fmt, cols, ("forbidden_prompt",))
        for i, r in enumerate(rows):
            if _cell(r, "forbidden_prompt"):
                items.append(Item(f"{stem}-{i:04d}", _cell(r, "forbidden_prompt"), _cell(r, "category") or "unknown", "harmful"))
    elif fmt in ("generic", "generic-benign"):
        prompt_col = next((c for c in PROMPT_COLUMNS if c in cols), None)
        if prompt_col is None:
            raise BenchmarkError(
                f"{file}: no prompt column (found {cols}, looked for {list(PROMPT_COLUMNS)}); "
                "rename the column that holds the requests to `prompt`"
            )
        label_col = next((c for c in LABEL_COLUMNS if c in cols), None)
        cat_col = next((c for c in CATEGORY_COLUMNS if c in cols), None)
        id_col = next((c for c in ID_COLUMNS if c in cols), None)
        default = "benign" if fmt == "generic-benign" else "harmful"
        for i, r in enumerate(rows):
            if not _cell(r, prompt_col):
                continue
            label = _cell(r, label_col)
            expected = _expected_value(label, file, i + 1, label_col) if label else default
            items.append(Item(_cell(r, id_col) or f"{stem}-{i:04d}", _cell(r, prompt_col), _cell(r, cat_col) or "unknown", expected))
    else:
        raise BenchmarkError(f"{file}: unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if not items:
        raise BenchmarkError(f"{file}: no usable rows for format {fmt}; check the file and the format")
    return _unique_ids(items)


def load_benchmark(spec: str, limit: int | None = None) -> Benchmark:
    """Load `NAME=FORMAT:PATH` / `NAME=PATH` / `PATH`; keep the first `limit` items."""
    name, fmt, path = parse_spec(spec)
    rows = read_rows(path)
    if not rows:
        raise BenchmarkError(f"{path}: no data rows; the file holds a header only")
    fmt = fmt or detect_format(tables.columns(rows), path)
    items = _load(rows, fmt, str(Path(path).expanduser()))
    if fmt == "jbb":
        fmt = f"jbb-{items[0].expected}"
    if limit is not None:
        items = items[:limit]
    return Benchmark(name, str(Path(path).expanduser()), fmt, items)


def load_eval_set(path: str | Path, limit: int | None = None) -> list[LabelledPair]:
    """A labelled (prompt, response, label) set; labels mapped by EVAL_LABEL_MAP."""
    rows = _lower_keys(read_rows(path))
    cols = tables.columns(rows)
    missing = [c for c in ("prompt", "response", "label") if c not in cols]
    if missing:
        raise BenchmarkError(f"{path}: an eval set needs columns prompt, response, label; missing {missing} (found {cols})")
    out = []
    for i, r in enumerate(rows):
        raw = _cell(r, "label").lower()
        label = EVAL_LABEL_MAP.get(raw)
        if label is None:
            raise BenchmarkError(
                f"{path}: row {i + 1} has label {raw!r}; use negative/unsafe, rejective/refusal or positive/safe"
            )
        kind = _cell(r, "kind").lower() if "kind" in cols else ""
        if kind and kind not in EXPECTED:
            raise BenchmarkError(f"{path}: row {i + 1} has kind {kind!r}; use {' or '.join(EXPECTED)} (or leave it empty)")
        out.append(LabelledPair(_cell(r, "id") or f"pair-{i:04d}", _cell(r, "prompt"), _cell(r, "response"), label, kind or None))
    if not out:
        raise BenchmarkError(f"{path}: no labelled rows")
    return out if limit is None else out[:limit]
