"""Runs from separate evidence reports side by side: one figure and one
Markdown table, from the committed results.json files alone (the run
folders they came from need not exist any more). Only for runs evaluated
on the same held-out sets: it refuses reports whose heldout.json differ.

    python bench/compare_evidence.py OUT_DIR REPORT_DIR:RUN[=LABEL] ...

e.g. the current recipe beside its fixed-judge ablation:

    python bench/compare_evidence.py bench/results/evidence-anchor-fixed \
        bench/results/evidence-anchor:main-anchor-s0=main-s0 \
        bench/results/evidence-anchor:main-anchor-s1=main-s1 \
        bench/results/evidence-anchor-fixed:fixed-judge
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from report_evidence import KEYS, _pct, figure, with_gaps


def load(spec: str) -> tuple[str, dict, dict]:
    """(label, the run's per-iteration results, its report's held-out manifest) of `DIR:RUN[=LABEL]`."""
    where, _, rest = spec.partition(":")
    run, _, label = rest.partition("=")
    if not run:
        raise SystemExit(f"{spec!r}: write REPORT_DIR:RUN or REPORT_DIR:RUN=LABEL")
    folder = Path(where)
    results = json.loads((folder / "results.json").read_text())["results"]
    if run not in results:
        raise SystemExit(f"{spec!r}: {folder / 'results.json'} has no run {run!r} (it has {', '.join(results)})")
    res = results[run]
    with_gaps(res["iterations"])  # reports written before the gap was reported carry the rates it is made of
    return label or run, res, json.loads((folder / "heldout.json").read_text())["sets"]


def table(runs: dict[str, dict]) -> str:
    """First -> last iteration of every metric, one column per run."""
    head = "| iteration 0 -> last | " + " | ".join(runs) + " |"
    lines = [head, "| --- |" + " ---: |" * len(runs)]
    for key, name in KEYS:
        show = (lambda x: "-" if x is None else f"{x:.3f}") if key == "red_od" else _pct  # OD is no percentage
        cells = []
        for res in runs.values():
            its = sorted(res["iterations"], key=int)
            first, last = res["iterations"][its[0]].get(key), res["iterations"][its[-1]].get(key)
            cells.append(show(last) if first is None else f"{show(first)} -> {show(last)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("runs", nargs="+", help="REPORT_DIR:RUN[=LABEL]")
    args = ap.parse_args()
    loaded = [load(s) for s in args.runs]
    if any(sets != loaded[0][2] for _, _, sets in loaded[1:]):
        sys.exit("these reports were evaluated on different held-out sets (heldout.json differs): not comparable")
    runs = {label: res for label, res, _ in loaded}
    args.out.mkdir(parents=True, exist_ok=True)
    figure(runs, args.out / "comparison.png")
    md = f"# Side by side: {', '.join(args.runs)}\n\nPercentages; rules judge; held-out data.\n\n" + table(runs)
    (args.out / "comparison.md").write_text(md)
    print(md)
    print(f"wrote {args.out / 'comparison.png'}, {args.out / 'comparison.md'}")


if __name__ == "__main__":
    main()
