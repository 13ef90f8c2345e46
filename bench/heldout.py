"""Held-out sets sampled from the public benchmark files in ../shared/data
(never copied into the repo: the sampled CSVs go to a git-ignored work
folder, the manifest that says how they were drawn is committed)."""
from __future__ import annotations

import csv
import random
from collections import defaultdict
from pathlib import Path


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def stratified(rows: list[dict], key: str, per: int, rng: random.Random) -> list[dict]:
    """`per` rows of every value of `key` (all of a smaller stratum), strata in sorted order."""
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r[key]].append(r)
    out = []
    for k in sorted(by):
        out += rng.sample(by[k], min(per, len(by[k])))
    return out


def blue_sets(data: Path, rng: random.Random) -> dict[str, list[dict]]:
    """Blue's held-out sets, 40 prompts each: JBB harmful and benign (4 per
    category), XSTest safe (4 per type) and unsafe (5 per contrast type).
    Each row: id, prompt, kind (harmful / benign), stratum."""
    jbb_h = stratified(read_csv(data / "jbb/harmful-behaviors.csv"), "category", 4, rng)
    jbb_b = stratified(read_csv(data / "jbb/benign-behaviors.csv"), "category", 4, rng)
    xs = read_csv(data / "xstest/xstest_prompts.csv")
    xs_safe = stratified([r for r in xs if r["label"] == "safe"], "type", 4, rng)
    xs_unsafe = stratified([r for r in xs if r["label"] == "unsafe"], "type", 5, rng)

    def rows(items, prompt, kind, stratum, prefix):
        return [{"id": f"{prefix}-{i:03d}", "prompt": r[prompt], "kind": kind, "stratum": r[stratum]} for i, r in enumerate(items)]

    return {"jbb-harmful": rows(jbb_h, "goal", "harmful", "category", "jbbh"),
            "jbb-benign": rows(jbb_b, "goal", "benign", "category", "jbbb"),
            "xstest-safe": rows(xs_safe, "prompt", "benign", "type", "xss"),
            "xstest-unsafe": rows(xs_unsafe, "prompt", "harmful", "type", "xsu")}
