"""How often blue refused in training, by what it was asked: blue's own
answers in a run's eval_pairs.jsonl (phase `blue`), per iteration, refused
or not by the rules (judging/refusals.py); no model runs.

    python bench/benign_refusals.py RUN_FOLDER [RUN_FOLDER ...] [--out FILE]

Kinds: benign topic twins (a benign request whose harmful seed of the same
topic the run's data names: prompts/twins.yaml or a benign file's
twin_of), other benign requests, harmful seeds asked as written (with a
twin and without one), and red's rewrites. Each group's anchored refusal
(phases.blue.refusal_anchor: a refusal by construction) is left out: the
first answer of the group that opens with the anchor's words (blue's own
answers may open alike, having learnt them in its warm start).

Why: the recipe's held-out over-refusal (JBB benign, topic twins of JBB's
harmful requests) is 35-45%; in training blue refused 24-50% of our own
twins against 1-12% of the other benign requests, so the over-refusal
lives in the twins (bench/BENCHMARKS.md, "Benign twins in their seeds'
groups").
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from results_io import save_results

from lora_triplay.judging.refusals import refused
from lora_triplay.recipe import load_recipe
from lora_triplay.triplay.roles import warmup_opening
from lora_triplay.triplay.rundata import RunData

KINDS = ("benign_twin", "benign_other", "harmful_plain_with_twin", "harmful_plain_no_twin", "harmful_rewrite")


def kind_of(row: dict, twins: set[str], seeds_with_twin: set[str]) -> str:
    if row["kind"] == "benign":
        return "benign_twin" if row["basic"] in twins else "benign_other"
    if row["wrapped"] != row["basic"]:
        return "harmful_rewrite"
    return "harmful_plain_with_twin" if row["basic"] in seeds_with_twin else "harmful_plain_no_twin"


def count_run(folder: Path) -> dict:
    pairs = folder / "eval_pairs.jsonl"
    if not pairs.is_file():
        raise SystemExit(f"{pairs}: not found; give a run folder (it holds eval_pairs.jsonl and recipe.yaml)")
    recipe = load_recipe(folder / "recipe.yaml")
    data = RunData(recipe, {"cursor": 0, "benign_cursor": 0, "global_step": 0}, panel=None)
    seed_text = {b.id: b.prompt for b in data.basic}
    twins = {t.prompt for t in data.twin_of_seed.values()}
    seeds_with_twin = {seed_text[s] for s in data.twin_of_seed}
    style = recipe.phases.blue.refusal_anchor
    opening = warmup_opening(style) if style else None
    anchored_kinds = {"harmful", "benign"} if recipe.phases.blue.refusal_anchor_benign else {"harmful"}
    tally: dict[int, dict[str, list[int]]] = defaultdict(lambda: {k: [0, 0] for k in KINDS})
    anchor_left: set[tuple] = set()  # groups whose anchored refusal was already left out
    for line in pairs.read_text().splitlines():
        row = json.loads(line)
        if row.get("phase") != "blue":
            continue
        group = (row["iteration"], row["step"], row["wrapped"])
        if opening and row["kind"] in anchored_kinds and group not in anchor_left and row["response"].startswith(opening):
            anchor_left.add(group)  # one per group is the anchor; blue's own answers may open alike (its warm start)
            continue
        cell = tally[int(row["iteration"])][kind_of(row, twins, seeds_with_twin)]
        cell[0] += int(refused(row["response"]))
        cell[1] += 1
    return {str(it): {k: {"refused": r, "answers": n, "rate": round(r / n, 3) if n else None} for k, (r, n) in cells.items()}
            for it, cells in sorted(tally.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: print only)")
    args = ap.parse_args(argv)
    results = {run.name: count_run(run) for run in args.runs}
    for run, its in results.items():
        print(run)
        for it, cells in its.items():
            print(f"  iteration {it}: " + ", ".join(f"{k} {c['refused']}/{c['answers']}" for k, c in cells.items()))
    if args.out:
        save_results(args.out, {"runs": results, "kinds": list(KINDS)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
