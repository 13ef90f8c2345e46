"""The league + adaptive-control ablation (issue 13) on the embedded model.

Two runs of recipes/cpu-evidence.yaml, the same seed and the same step
budget (ABLATION below, a shorter budget than the evidence runs so both
fit an afternoon on 2 cores), one with the two options of "Beyond the
paper" on (a league of 2 past adapters, recent-biased, writing half of
blue's harmful prompts; adaptive phase lengths and the drift check), one
without. Then each run is measured by `lora-triplay eval` with the fixed
rules judge on held-out HarmBench behaviours: every red snapshot rewrites
them and every blue snapshot (and the bare base) answers every rewrite,
a grid from which the two numbers the issue names are read:

  red vs the league   the final red's ASR against each past blue (and the
                      base), and pooled: does red still beat old defenders?
  blue vs old reds    the final blue's ASR on the rewrites of each past red,
                      and pooled: does blue still resist old attacks?

plus the training-time metrics of the run with a league (asr_league,
league_rate_*) and its control decisions.

    python bench/ablation_league.py [--work runs/ablation-league] [--limit 40] [--jobs 1]
Results: bench/results/league_control/{results.json,results.md}
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results_io import save_results  # noqa: E402

RECIPE = ROOT / "recipes" / "cpu-evidence.yaml"
DATA = Path(os.environ.get("LORA_TRIPLAY_DATA", ROOT.parent / "shared" / "data"))
ABLATION = ["seed=0", "iterations=3", "phases.eval_warmup.steps=6", "phases.blue_warmup.steps=0", "phases.red.steps=3",
            "phases.blue.steps=4", "phases.eval.steps=2"]
OPTIONS = ["league.size=2", "league.weight=0.5", "league.sampling=recent", "league.attacker_share=0.5",
           "control.adaptive=true", "control.extra_steps=1", "control.drift_check=true", "control.drift_pairs=16"]
RUNS = {"plain": ABLATION, "league+control": ABLATION + OPTIONS}


def cli() -> list[str]:
    return [sys.executable, "-m", "lora_triplay.cli"]


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def _done(run: Path) -> bool:
    f = run / "state.json"
    return f.is_file() and json.loads(f.read_text()).get("done", False)


def run_jobs(jobs: list[tuple[str, list[str], Path]], parallel: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    seconds, procs = {}, []
    todo = list(jobs)
    while todo or procs:
        while todo and len(procs) < parallel:
            name, cmd, logfile = todo.pop(0)
            log(f"start {name}")
            procs.append((name, subprocess.Popen(cmd, stdout=open(logfile, "a"), stderr=subprocess.STDOUT, env=env, cwd=ROOT), time.time()))
        time.sleep(5)
        for p in list(procs):
            name, proc, t0 = p
            if proc.poll() is not None:
                procs.remove(p)
                if proc.returncode:
                    raise SystemExit(f"{name} failed ({proc.returncode}); see its log")
                seconds[name] = round(time.time() - t0, 1)
                log(f"done {name} in {seconds[name]:.0f}s")
    return seconds


def train(work: Path, parallel: int) -> dict[str, float]:
    jobs = []
    for name, overrides in RUNS.items():
        run = work / "runs" / name
        if _done(run):
            continue
        resume = (run / "state.json").is_file()
        jobs.append((f"train {name}", cli() + ["run", str(RECIPE), *overrides, "--run-dir", str(run)] + (["--resume"] if resume else []),
                     work / f"train-{name}.log"))
    return run_jobs(jobs, parallel)


def evaluate(work: Path, limit: int, parallel: int) -> dict[str, float]:
    jobs = []
    for name in RUNS:
        run, out = work / "runs" / name, work / "eval" / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.is_file():
            continue
        its = [int(p.name.split("-")[1]) for p in sorted((run / "blue").glob("iter-*"))]
        defenders = [x for it in its for x in ("--defender", "base" if it == 0 else f"blue@{it}")]
        jobs.append((f"eval {name}", cli() + ["eval", str(run), "--roles", "red", "--iterations", "all", "--judge", "rules",
                                              "--red-prompts", f"harmbench:{DATA / 'harmbench' / 'harmbench_behaviors_text_test.csv'}",
                                              "--limit", str(limit), *defenders, "--no-progress", "--out", str(out)],
                     work / f"eval-{name}.log"))
    return run_jobs(jobs, parallel)


def summarise(work: Path) -> dict:
    out: dict = {"recipe": str(RECIPE.relative_to(ROOT)), "budget": ABLATION, "options": OPTIONS, "runs": {}}
    for name in RUNS:
        ev = json.loads((work / "eval" / f"{name}.json").read_text())
        grid = ev["red"]["iterations"]  # red iteration -> {"asr": {defender: asr}}
        reds = sorted(int(i) for i in grid)
        last = str(reds[-1])
        blues = list(grid[last]["asr"])
        final_blue = blues[-1]
        vs_league = {d: grid[last]["asr"][d] for d in blues}
        vs_old_reds = {f"red@{i}": grid[str(i)]["asr"][final_blue] for i in reds}
        rows = [json.loads(x) for x in (work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        training = {k: [r[k] for r in rows if k in r and r[k] is not None]
                    for k in ("asr_league", "league_rate_negative", "league_refusal_rate", "asr_blue")}
        control = [{"iteration": r.get("iteration"), "action": r.get("action"), "reason": r.get("reason")}
                   for r in rows if r.get("phase") == "control"]
        steps = {p: sum(1 for r in rows if r.get("phase") == p) for p in ("red", "blue", "eval")}
        out["runs"][name] = {
            "final_red": f"red@{last}", "final_blue": final_blue,
            "red_vs_league": vs_league,
            "red_vs_past_blues_pooled": _mean([v for d, v in vs_league.items() if d != final_blue]),
            "blue_vs_old_reds": vs_old_reds,
            "blue_vs_past_reds_pooled": _mean([v for r, v in vs_old_reds.items() if r != f"red@{last}"]),
            "valid_rewrite_rate": {f"red@{i}": grid[str(i)]["valid_rewrite_rate"] for i in reds},
            "steps_taken": steps,
            "training_means": {k: _mean(v) for k, v in training.items()},
            "control_decisions": control,
        }
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return round(sum(xs) / len(xs), 4) if xs else None


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def markdown(res: dict) -> str:
    lines = ["# League + adaptive control ablation (issue 13)", "",
             f"Recipe {res['recipe']} with {' '.join(res['budget'])}; options: {' '.join(res['options'])}.",
             "Fixed judge: rules. ASR in % (higher = the attacker wins).", "",
             "| run | steps red/blue/eval | red@last vs past blues (pooled) | red@last vs each "
             "| blue@last vs past reds (pooled) | blue@last vs each |",
             "| --- | --- | ---: | --- | ---: | --- |"]
    for name, r in res["runs"].items():
        s = r["steps_taken"]
        lines.append(f"| {name} | {s['red']}/{s['blue']}/{s['eval']} | {_pct(r['red_vs_past_blues_pooled'])} | "
                     + ", ".join(f"{d} {_pct(v)}" for d, v in r["red_vs_league"].items()) + f" | {_pct(r['blue_vs_past_reds_pooled'])} | "
                     + ", ".join(f"{d} {_pct(v)}" for d, v in r["blue_vs_old_reds"].items()) + " |")
    lines.append("")
    for name, r in res["runs"].items():
        if r["control_decisions"]:
            lines.append(f"Control decisions ({name}): "
                         + "; ".join(f"it {c['iteration']}: {c['action']} ({c['reason']})" for c in r["control_decisions"]))
        tm = {k: v for k, v in r["training_means"].items() if v is not None}
        if tm:
            lines.append(f"Training means ({name}): " + ", ".join(f"{k} {v:.3f}" for k, v in tm.items()))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "ablation-league")
    ap.add_argument("--limit", type=int, default=40, help="held-out HarmBench behaviours")
    ap.add_argument("--jobs", type=int, default=1, help="processes at once (2 cores: 1 leaves one for you)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results" / "league_control")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    times = {**train(args.work, args.jobs), **evaluate(args.work, args.limit, args.jobs)}
    res = summarise(args.work)
    res["seconds"] = times
    args.out_dir.mkdir(parents=True, exist_ok=True)
    save_results(str(args.out_dir / "results.json"), res)
    (args.out_dir / "results.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
