"""`make bench`: every performance goal of the project, one script each, run
one after another (never two at once: they share the CPU), one table.

    python bench/suite.py [--quick] [--only roofline,sync]

Each script prints its own table and writes bench/results/<name>.json; this
one reads them back, prints one row per goal (measured, target, met) and
writes bench/results/suite.json plus the "Suite" section of
bench/BENCHMARKS.md (machine, date, ratios). Scripts run with one torch
thread (OMP_NUM_THREADS=1): on a 2-core machine two threads collapse
whenever anything else is busy.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SCRIPTS = ["roofline", "resident", "sync", "diversity", "trl", "steps", "eval"]
SCRIPT_FILE = {"roofline": "bench_roofline.py", "resident": "bench_resident.py", "sync": "bench_sync.py",
               "diversity": "bench_diversity.py", "trl": "bench_trl.py", "steps": "bench_steps.py",
               "eval": "bench_eval.py"}
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"


def _get(data: dict, path: str):
    for key in path.split("."):
        data = data[key]
    return data


# (goal, script, measured value path, how to print it, target test or None
# for a row shown for comparison, target text)
GOALS = [
    ("1 rollouts vs roofline", "roofline", "rollout.fraction_of_roofline", "{:.0%}", lambda v: v >= 0.5, ">= 50%"),
    ("2 GRPO update vs roofline", "roofline", "update.fraction_of_roofline", "{:.0%}", lambda v: v >= 0.4, ">= 40%"),
    ("3 mixed batch vs role by role", "roofline", "mixed_over_per_role", "x{:.2f}", lambda v: v >= 2.0, ">= x2"),
    ("4 resident: ours / one base", "resident", "ours.over_one_base_model", "x{:.3f}", lambda v: v <= 1.05, "<= x1.05"),
    ("4 resident: three copies / one base", "resident", "three_copies.over_one_base_model", "x{:.3f}", None, "(paper layout)"),
    ("5 adapter sync / full-weight push", "sync", "ratio", "{:.4f}", lambda v: v <= 0.05, "<= 1/20"),
    ("6 diversity: 256 vs 10k pool lookup", "diversity", "at_10k_s", "{:.2f} s", lambda v: v < 1.0, "< 1 s"),
    ("6 diversity: growth exponent", "diversity", "growth_exponent_bleu", "{:.2f}", lambda v: v < 1.0, "< 1 (sub-linear)"),
    ("6 diversity: naive Self-BLEU / index", "diversity", "naive_over_index_at_10k", "x{:.0f}", None, "(comparison)"),
    ("6 the loop's score() incl. MiniLM (s)", "diversity", "at_10k_with_embedding_s", "{:.1f} s", None, "(candidates' embeddings)"),
    ("7 ours / TRL policy update", "trl", "ratio", "x{:.2f}", lambda v: v <= 1.0, "<= x1.0"),
    ("8 smoke iteration after / before", "steps", "speedup_steps", "x{:.2f} faster", lambda v: v > 1.0, "faster than before"),
    ("8 smoke iteration (after), seconds in steps", "steps", "after.steps_s", "{:.0f} s", lambda v: v <= 60, "<= 60 s"),
    ("8 smoke iteration (after), process CPU", "steps", "after.cpu_s", "{:.0f} s", None, "(load-independent)"),
    ("9 vLLM resident: shared base / engine alone", "resident", "vllm_shared.over_vllm_base_model", "x{:.3f}", lambda v: v <= 1.10, "<= x1.10"),
    ("9 vLLM resident: two copies / engine alone", "resident", "vllm_unshared.over_vllm_base_model", "x{:.3f}", None, "(today's layout)"),
    ("9 vLLM smoke iteration: shared / two copies", "resident", "vllm_smoke.shared_over_unshared", "x{:.2f}", lambda v: v <= 1.3, "<= x1.3"),
    ("10 eval, 4 snapshots: mixed / per snapshot (CPU s)", "eval", "speedup.mixed.cpu", "x{:.2f}", lambda v: v >= 3.0, ">= x3"),
    ("10 eval: answers that differ from per snapshot", "eval", "checks.mixed.answers_differ", "{}", lambda v: v == 0, "0 (same numbers)"),
]


def run_script(name: str, quick: bool) -> tuple[float, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "bench" / SCRIPT_FILE[name]), "--out", str(RESULTS / f"{name}.json")]
    if quick:
        cmd.append("--quick")
    print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
    return time.perf_counter() - t0, rc


def derived(name: str, data: dict) -> dict:
    """Values the goal table reads that a script reports in another shape."""
    if name == "diversity":
        sizes = {int(s["pool"]): s for s in data.get("sizes", [])}
        near = min(sizes, key=lambda n: abs(n - 10_000)) if sizes else None
        if near is not None:
            s = sizes[near]
            data["at_10k_s"] = s["bleu_score_s"] + s["cos_score_s"]
            data["at_10k_with_embedding_s"] = s["asp_score_s"]
            data["naive_over_index_at_10k"] = s["naive_bleu_s_est"] / max(s["bleu_score_s"], 1e-9)
    return data


def table(results: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for goal, script, path, fmt, ok, target in GOALS:
        try:
            value = _get(results[script], path)
        except (KeyError, TypeError):
            rows.append((goal, "not run", target, "-"))
            continue
        rows.append((goal, fmt.format(value), target, "-" if ok is None else "yes" if ok(value) else "no"))
    return rows


def write_markdown(rows, meta: dict) -> None:
    path = ROOT / "bench" / "BENCHMARKS.md"
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    body = [BEGIN, f"## Suite (`make bench`, {meta['date']})", "",
            f"Machine: {meta['machine']}, {meta['cpus']} CPUs, one torch thread; load average "
            f"{meta['loadavg_start']:.1f} at the start, {meta['loadavg_end']:.1f} at the end; "
            f"{meta['minutes']:.1f} minutes in all. JSON: `bench/results/<script>.json`, `bench/results/suite.json`.", "",
            "| goal | measured | target | met |", "| --- | ---: | --- | --- |"]
    body += [f"| {g} | {m} | {t} | {ok} |" for g, m, t, ok in rows]
    body.append(END)
    block = "\n".join(body)
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        first_break = text.find("\n## ")
        text = (text[:first_break] + "\n" + block + "\n" + text[first_break:]) if first_break > 0 else text + "\n" + block + "\n"
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="each script's short version (a few minutes in all)")
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(SCRIPTS)}")
    ap.add_argument("--no-markdown", action="store_true", help="leave bench/BENCHMARKS.md alone")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else SCRIPTS
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown:
        raise SystemExit(f"--only: unknown {', '.join(unknown)}; known: {', '.join(SCRIPTS)}")
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    seconds, failed = {}, []
    for name in names:
        seconds[name], rc = run_script(name, args.quick)
        if rc:
            failed.append(name)
    results = {}
    for name in SCRIPTS:  # earlier results of the scripts not rerun still fill the table
        f = RESULTS / f"{name}.json"
        if f.is_file():
            results[name] = derived(name, json.loads(f.read_text()))
    rows = table(results)
    meta = {"date": dt.date.today().isoformat(), "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "loadavg_start": load0, "loadavg_end": os.getloadavg()[0], "minutes": (time.perf_counter() - t0) / 60,
            "script_seconds": {k: round(v, 1) for k, v in seconds.items()}, "failed": failed, "quick": args.quick}
    width = max(len(r[0]) for r in rows)
    print(f"\n{'goal':{width}}  {'measured':>16}  {'target':18} met")
    for g, m, t, ok in rows:
        print(f"{g:{width}}  {m:>16}  {t:18} {ok}")
    print(f"\n{meta['minutes']:.1f} min; per script: {meta['script_seconds']}" + (f"; FAILED: {failed}" if failed else ""))
    (RESULTS / "suite.json").write_text(json.dumps({"meta": meta, "goals": [dict(zip(("goal", "measured", "target", "met"), r)) for r in rows]},
                                                   indent=2) + "\n")
    if not args.no_markdown and not args.quick:
        write_markdown(rows, meta)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
