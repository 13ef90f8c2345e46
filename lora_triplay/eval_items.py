"""`eval`'s per-item results file (`<out>.items.jsonl`): append-only rows
keyed by (benchmark, iteration, role, defender, item id) and judge, each
with the fingerprint of the run and the generation settings, fsynced as
they are written, so a rerun reuses what is there (evaluate.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path


class ItemCache:
    """Append-only per-item results; a half-written last line is cut off."""

    def __init__(self, path: Path, signature: str, fresh: bool = False, writer: bool = True):
        """`writer` False (ranks > 0 of a multi-process eval): read the file,
        keep new rows in memory only; rank 0 writes them."""
        self.path, self.sig, self.writer = Path(path), signature, writer
        self.rows: dict[tuple, dict] = {}
        self.answers: dict[tuple, dict] = {}
        if fresh and self.path.exists() and writer:
            self.path.unlink()
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):  # interrupted mid-write
            data = data[: data.rfind(b"\n") + 1]
            if writer:
                self.path.write_bytes(data)
        for line in data.splitlines():  # a row damaged by hand or by the disk is computed again, not fatal
            try:
                row = json.loads(line)
                if isinstance(row, dict) and row.get("sig") == signature:
                    self._index(row)
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                continue

    @staticmethod
    def key(bench: str, it: int, role: str, defender: str, item: str) -> tuple:
        return (bench, it, role, defender, item)

    def _index(self, row: dict) -> None:
        k = self.key(row["benchmark"], row["iteration"], row["role"], row["defender"], row["id"])
        self.rows[k + (row["judge"],)] = row
        self.answers[k] = row

    def get(self, key: tuple, judge: str) -> dict | None:
        return self.rows.get(key + (judge,))

    def answer(self, key: tuple) -> dict | None:
        return self.answers.get(key)

    def append(self, rows: list[dict]) -> None:
        if not rows:
            return
        if not self.writer:
            for row in rows:
                row["sig"] = self.sig
                self._index(row)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            for row in rows:
                row["sig"] = self.sig
                f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
                self._index(row)
            f.flush()
            os.fsync(f.fileno())


def items_path(out: Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".items.jsonl")
