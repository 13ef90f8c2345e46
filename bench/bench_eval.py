"""`lora-triplay eval` over several snapshots: the old snapshot-ordered chunks
against the mixed queue (evaluate.py, Evaluator._chunks), side by side.

    python bench/bench_eval.py [--quick] [--limit N] [--ways snapshot,mixed,per-call]

On the evidence run (`make evidence`: adapters/evidence/runs/main-s0, 4 blue
and red snapshots, its held-out sets), the rules judge, greedy, 40 new
tokens, batch 64, as bench/evidence.py calls it. Each way starts from an
empty items file and loads the model itself (as a separate `eval` would):

  snapshot   one eval, units in the old order (benchmark, iteration, item)
             cut into batch-size chunks, one request per unit
             (LORA_TRIPLAY_EVAL_SCHEDULE=snapshot)
  mixed      one eval, one queue over every snapshot, identical greedy
             requests generated once, sorted by prompt length
  per-call   one eval per snapshot (`--iterations N`), sharing one items
             file (so base, iteration 0, is answered once)
  rerun      mixed again on its own items file: must generate nothing

Same numbers: every aggregate (blue ASR, over-refusal and class counts per
benchmark and iteration; red's ASR per defender, valid rewrites, OD; eval's
accuracy) is compared with the snapshot way's, and the item answers that
differ are counted (greedy tokens can move when a batch's make-up changes
float sums); nothing is hidden. Wall seconds on a shared machine are noisy:
process CPU seconds (one thread) are reported beside them. Writes
bench/results/eval.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from results_io import read_jsonl, save_results

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SETS = ("jbb-harmful", "jbb-benign", "xstest", "strongreject")


def options(args, out: Path, schedule: str, iterations: str = "all"):
    from lora_triplay.evaluate import EvalOptions

    held = Path(args.heldout)
    roles = args.roles.split(",")
    return EvalOptions(
        run_dir=Path(args.run), out=out, benchmarks=[f"{s}={s}:{held / (s + '.csv')}" for s in SETS],
        red_prompts=f"harmbench:{held / 'red-prompts.csv'}", defenders=["base", f"blue@{args.final}"],
        eval_set=str(held / "labelled-pairs.jsonl") if "eval" in roles else None, roles=roles, iterations=iterations,
        max_new_tokens=40, temperature=0.0, batch_size=args.batch_size, limit=args.limit, progress=False, judge="rules",
        schedule=schedule)


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)}


def engine_calls():
    """Count HFEngine.generate calls and their rows (the batches the engine saw)."""
    from lora_triplay.engine.hf import HFEngine

    seen: list[dict] = []
    real = HFEngine.generate

    def generate(self, reqs, sampling):
        seen.append({"rows": len(reqs), "adapters": len({r.adapter for r in reqs})})
        return real(self, reqs, sampling)

    HFEngine.generate = generate
    return seen


def aggregates(res: dict) -> dict:
    """Every number a report reads, flat: name -> value."""
    flat = {}
    for b, m in res.get("benchmarks", {}).items():
        for it, x in m["iterations"].items():
            for k in ("asr", "over_refusal", "degenerate"):
                flat[f"blue/{b}/{it}/{k}"] = x[k]
            for side in ("harmful", "benign"):
                for c in ("negative", "rejective", "positive", "unparsed"):
                    flat[f"blue/{b}/{it}/{side}/{c}"] = x[side][c]
    for it, x in res.get("red", {}).get("iterations", {}).items():
        flat[f"red/{it}/valid"] = x["valid_rewrite_rate"]
        flat[f"red/{it}/od"] = None if x["od"] is None else round(x["od"], 6)
        for d, v in x["asr"].items():
            flat[f"red/{it}/asr/{d}"] = v
    for it, x in res.get("eval_accuracy", {}).get("iterations", {}).items():
        flat[f"eval/{it}/accuracy"] = x["accuracy"]
    return flat


def merged(results: list[dict]) -> dict:
    """One per-snapshot call each: their iterations together, as one eval's result."""
    out: dict = {"benchmarks": {}, "red": {"iterations": {}}, "eval_accuracy": {"iterations": {}}}
    for r in results:
        for b, m in r.get("benchmarks", {}).items():
            out["benchmarks"].setdefault(b, {"iterations": {}})["iterations"].update(m["iterations"])
        out["red"]["iterations"].update(r.get("red", {}).get("iterations", {}))
        out["eval_accuracy"]["iterations"].update(r.get("eval_accuracy", {}).get("iterations", {}))
    return out


def answers(out: Path) -> dict:
    from lora_triplay.evaluate import items_path

    rows = read_jsonl(items_path(out))
    return {(r["benchmark"], r["iteration"], r["role"], r["defender"], r["id"], r["judge"]): (r["response"], r["label"]) for r in rows}


def compare(ref: dict, got: dict, ref_items: dict, got_items: dict) -> dict:
    a, b = aggregates(ref), aggregates(got)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    common = set(ref_items) & set(got_items)
    return {"aggregates": len(a), "aggregates_differ": differ,
            "items": len(common), "items_missing": len(set(ref_items) ^ set(got_items)),
            "answers_differ": sum(ref_items[k][0] != got_items[k][0] for k in common),
            "labels_differ": sum(ref_items[k][1] != got_items[k][1] for k in common)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="--limit 4, blue and red only")
    ap.add_argument("--run", default=str(ROOT / "adapters/evidence/runs/main-s0"))
    ap.add_argument("--heldout", default=str(ROOT / "adapters/evidence/heldout"))
    ap.add_argument("--limit", type=int, default=8, help="first N items of each held-out set and of red's prompts")
    ap.add_argument("--roles", default="blue,red", help="blue,red[,eval]")
    ap.add_argument("--ways", default="snapshot,mixed,rerun", help="snapshot, mixed, per-call, rerun (rerun needs mixed)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench/results/eval.json"))
    args = ap.parse_args()
    if args.quick:
        args.limit, args.roles = 4, "blue,red"
    run = Path(args.run)
    if not (run / "state.json").is_file():  # a fresh machine: `make bench` keeps the committed result
        print(f"skipped: {run} holds no run (`make evidence` trains it); {args.out} is left as it is")
        return
    args.final = json.loads((run / "state.json").read_text())["iteration"]
    ways = args.ways.split(",")

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from lora_triplay.core.store import RunStore
    from lora_triplay.evaluate import run_eval

    snaps = RunStore(run).snapshots("blue")
    calls = engine_calls()
    tmp = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    timing: dict = {}
    results: dict = {}
    items: dict = {}
    batches: dict = {}
    for way in ways:
        start = len(calls)
        if way in ("snapshot", "mixed"):
            out = tmp / f"{way}.json"
            results[way], timing[way] = timed(lambda: run_eval(options(args, out, way)))
            items[way] = answers(out)
        elif way == "per-call":  # one eval per snapshot, as a script calling `eval --iterations N` would
            out = tmp / "per-call.json"
            parts, timing[way] = timed(lambda: [run_eval(options(args, out, "snapshot", str(n))) for n in snaps])
            results[way], items[way] = merged(parts), answers(out)
            results[way]["work"] = {k: sum(p["work"][k] for p in parts) for k in ("generated", "judged", "reused")}
        elif way == "rerun":
            out = tmp / "mixed.json"
            results[way], timing[way] = timed(lambda: run_eval(options(args, out, "mixed")))
            items[way] = answers(out)
        else:
            raise SystemExit(f"--ways: unknown {way!r}")
        mine = calls[start:]
        batches[way] = {"calls": len(mine), "rows": sum(c["rows"] for c in mine),
                        "mean_rows": round(sum(c["rows"] for c in mine) / len(mine), 1) if mine else 0,
                        "mean_adapters": round(sum(c["adapters"] for c in mine) / len(mine), 2) if mine else 0}
        print(f"{way}: {timing[way]['wall_s']:.1f} s wall, {timing[way]['cpu_s']:.1f} s CPU, "
              f"generated {results[way]['work']['generated']}, {batches[way]['calls']} engine calls", flush=True)

    ref = "snapshot" if "snapshot" in ways else ways[0]
    checks = {w: compare(results[ref], results[w], items[ref], items[w]) for w in ways if w != ref}
    print(f"\n{'way':<10} {'wall s':>8} {'CPU s':>8} {'x wall':>7} {'x CPU':>7} {'generated':>10} {'calls':>6} "
          f"{'rows/call':>9} {'adapters/call':>13} {'aggr. differ':>12} {'answers differ':>15}")
    for w in ways:
        c = checks.get(w, {})
        print(f"{w:<10} {timing[w]['wall_s']:>8.1f} {timing[w]['cpu_s']:>8.1f} "
              f"{timing[ref]['wall_s'] / max(timing[w]['wall_s'], 1e-9):>7.2f} {timing[ref]['cpu_s'] / max(timing[w]['cpu_s'], 1e-9):>7.2f} "
              f"{results[w]['work']['generated']:>10} {batches[w]['calls']:>6} {batches[w]['mean_rows']:>9} {batches[w]['mean_adapters']:>13} "
              f"{len(c.get('aggregates_differ', [])) if c else '-':>12} "
              f"{(str(c['answers_differ']) + ' of ' + str(c['items'])) if c else '-':>15}")
    for w, c in checks.items():
        if c["aggregates_differ"]:
            print(f"{w}: aggregates that differ from {ref}: {', '.join(c['aggregates_differ'])}")
    save_results(args.out, {
        "run": str(run), "limit": args.limit, "roles": args.roles, "batch_size": args.batch_size, "snapshots": snaps,
        "threads": int(os.environ["OMP_NUM_THREADS"]), "reference": ref, "timing": timing, "batches": batches,
        "work": {w: results[w]["work"] for w in ways}, "checks": checks,
        "speedup": {w: {"wall": round(timing[ref]["wall_s"] / timing[w]["wall_s"], 3), "cpu": round(timing[ref]["cpu_s"] / timing[w]["cpu_s"], 3)}
                    for w in ways},
    })


if __name__ == "__main__":
    main()
