"""Each game's CPU recipe on the embedded model, timed, and what it measured.

    python bench/games.py [taboo distract waltz] [--work runs/games]

Runs `lora-triplay run recipes/<game>.yaml` (one process, one torch
thread), then reads the run's `metrics.jsonl`: the `phase: measure` rows
(held-out games or problems, before training and after each iteration)
and the per-phase step means. Results: bench/results/games/<game>.json and
a table in bench/results/games/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results_io import save_results  # noqa: E402

GAMES = ("taboo", "distract", "waltz")


def run_game(game: str, work: Path) -> dict:
    run = work / game
    if run.exists():
        shutil.rmtree(run)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    log = work / f"{game}.log"
    proc = subprocess.run([sys.executable, "-m", "lora_triplay.cli", "run", str(ROOT / "recipes" / f"{game}.yaml"), "--run-dir", str(run)],
                          stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    seconds = round(time.time() - t0, 1)
    if proc.returncode:
        raise SystemExit(f"{game} failed ({proc.returncode}); see {log}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    measure = [{k: v for k, v in r.items() if k != "phase"} for r in rows if r.get("phase") == "measure"]
    steps: dict = {}
    for r in rows:
        if r.get("phase") != "measure" and "step" in r:
            steps.setdefault(f"{r['iteration']}/{r['phase']}", []).append(r)
    means = {k: {m: round(sum(x[m] for x in v if m in x) / len(v), 4) for m in v[0]
                 if isinstance(v[0][m], float) and "seconds" not in m and all(m in x for x in v)} for k, v in steps.items()}
    return {"game": game, "recipe": f"recipes/{game}.yaml", "wall_seconds": seconds, "measure": measure, "step_means": means}


def table(results: dict) -> str:
    lines = ["# Games on the embedded model (bench/games.py)", ""]
    for game, r in results.items():
        lines += [f"## {game}: {r['wall_seconds'] / 60:.1f} min wall", ""]
        if r["measure"]:
            keys = [k for k in r["measure"][0] if k not in ("iteration",) and not k.startswith(("attacker_vs_base_", "defender_vs_base_"))]
            lines += ["| iteration | " + " | ".join(keys) + " |", "| ---: | " + " | ".join("---:" for _ in keys) + " |"]
            for m in r["measure"]:
                lines.append(f"| {m['iteration']} | " + " | ".join(f"{m[k]:.3f}" if isinstance(m[k], float) else str(m[k]) for k in keys) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("games", nargs="*", default=list(GAMES))
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "games")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results" / "games")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for game in args.games:
        print(time.strftime("%H:%M:%S"), "run", game, flush=True)
        res = run_game(game, args.work)
        save_results(str(args.out_dir / f"{game}.json"), res)
        print(json.dumps(res["measure"], indent=1), f"{res['wall_seconds']:.0f}s", flush=True)
    results = {}
    for f in sorted(args.out_dir.glob("*.json")):
        r = json.loads(f.read_text())
        results[r["game"]] = r
    (args.out_dir / "README.md").write_text(table(results))


if __name__ == "__main__":
    main()
