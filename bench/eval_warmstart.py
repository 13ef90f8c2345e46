"""Eval's warm start alone, in variants: how well does eval judge the
held-out labelled answer set (make evidence's, never trained on) after its
warm start, and what does each variant cost?

    python bench/eval_warmstart.py --variant base= --variant more-requests=phases.eval_warmup.pairs=560 \
        [--seeds 0] [--jobs 2] [--work adapters/eval-warmstart] [--evidence adapters/evidence]

Each variant is a list of recipe overrides (comma-separated; empty for
recipes/cpu-evidence.yaml as it is). A run is that recipe cut to its warm
start (one iteration, red, blue and eval at 0 steps) with the evidence
run's labelled answer set as `experts.gold_pairs`, checked after the warm
start only. Needs `make evidence`'s prepare stage (the labelled set). One
torch thread per run; `--jobs 2` runs two at once on two cores (their
minutes are then not those of a run alone). Results: one row per variant
and seed in bench/results/eval_warmstart.json (accuracy, per-class recall,
predicted-label rates, calibration error, the warm start's minutes).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

from evidence import RECIPE, cli, env, log

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "eval_warmstart.json"
WARM_ONLY = ["iterations=1", "phases.red.steps=0", "phases.blue.steps=0", "phases.eval.steps=0", "experts.gold_after=[eval_warmup]"]


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    if not name:
        raise SystemExit(f"--variant {text!r}: write NAME=OVERRIDE[,OVERRIDE...] (NAME= for the recipe as it is)")
    return name, [o for o in overrides.split(",") if o]


def result(run: Path) -> dict | None:
    """The gold check after the warm start, and the warm start's seconds."""
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        return None
    rows = [json.loads(x) for x in metrics.read_text().split("\n") if x.strip()]
    gold = [r for r in rows if r["phase"] == "eval_gold" and r.get("after") == "eval_warmup"]
    if not gold:
        return None
    warm = [r for r in rows if r["phase"] == "eval_warmup"]
    keep = ("accuracy", "ece", "n") + tuple(k for k in gold[-1] if k.startswith(("recall_", "pred_rate_")))
    return {**{k: gold[-1][k] for k in keep}, "steps": len(warm),
            "warmup_minutes": round(sum(r.get("step_seconds", 0.0) for r in warm) / 60, 2),
            "labelled_pairs": warm[-1].get("labelled_pairs") if warm else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=OVERRIDE[,OVERRIDE...]")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--work", default=str(ROOT / "adapters" / "eval-warmstart"))
    ap.add_argument("--evidence", default=str(ROOT / "adapters" / "evidence"), help="make evidence's work folder (its labelled set)")
    args = ap.parse_args()
    gold = Path(args.evidence) / "heldout" / "labelled-pairs.jsonl"
    if not gold.is_file():
        raise SystemExit(f"{gold}: no labelled set; run `python bench/evidence.py --stages prepare` first")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    todo = [(name, overrides, int(seed)) for name, overrides in map(parse_variant, args.variant) for seed in args.seeds.split(",")]
    results = json.loads(OUT.read_text()) if OUT.is_file() else {"rows": []}
    running: list[tuple[str, int, list[str], Path, subprocess.Popen, float]] = []
    while todo or running:
        while todo and len(running) < args.jobs:
            name, overrides, seed = todo.pop(0)
            run = work / f"{name}-s{seed}"
            if run.exists():
                shutil.rmtree(run)
            cmd = cli() + ["run", str(RECIPE), *WARM_ONLY, f"seed={seed}", f"experts.gold_pairs={gold}", *overrides, "--run-dir", str(run)]
            log(f"{name} seed {seed}: {' '.join(overrides) or '(the recipe as it is)'}")
            running.append((name, seed, overrides, run, subprocess.Popen(cmd, stdout=open(work / f"{name}-s{seed}.log", "w"),
                                                                         stderr=subprocess.STDOUT, env=env(), cwd=ROOT), time.time()))
        time.sleep(5)
        for item in list(running):
            name, seed, overrides, run, proc, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            row = result(run)
            if proc.returncode != 0 or row is None:
                raise SystemExit(f"{name} seed {seed} failed ({proc.returncode}); see {work / f'{name}-s{seed}.log'}")
            row = {"variant": name, "overrides": overrides, "seed": seed, "jobs": args.jobs,
                   "date": time.strftime("%Y-%m-%d"), "minutes": round((time.time() - t0) / 60, 1), **row}
            results["rows"] = [r for r in results["rows"] if (r["variant"], r["seed"]) != (name, seed)] + [row]
            OUT.write_text(json.dumps(results, indent=2) + "\n")
            log(f"{name} seed {seed}: accuracy {row['accuracy']:.3f}, recall "
                + ", ".join(f"{k[7:]} {v:.2f}" for k, v in row.items() if k.startswith("recall_") and v is not None))


if __name__ == "__main__":
    main()
