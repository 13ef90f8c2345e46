"""Eval judging a blue step and a red step, the prefill planned two ways, side by side.

A blue step asks eval about 64 answers to 8 requests (groups of 8), a red
step about each wrap's answers by every defender (groups of 2-3); every
prompt starts with eval's ~320-token template and an answer's group also
shares its request. The HF engine computes a shared prefix once per group
(engine/prefix_groups.py): planned as one group per template (`template`,
the engine's plan before 2026-12-06) or as the cheapest cut
(`cheapest`, the plan since), which gives each request its own group.
Same pairs, model and adapter; the order alternates per repeat so a
drifting host hits both alike; the log-probs of every label are compared.

    OMP_NUM_THREADS=2 python bench/bench_judge_groups.py RUN [--iteration 2] [--repeats 3] [--out FILE]

RUN is a finished run folder with eval_pairs.jsonl (the pairs eval judged
in each step, with their kind) and eval's adapter; the pairs are those of
blue's and red's first step of `--iteration`, asked as the loop asks them
(triplay/roles.py eval_messages, the kind line where the run gives eval the
kind, forced choice over the three labels).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_io import read_jsonl, save_results  # noqa: E402

from lora_triplay.core.runs import open_run  # noqa: E402
from lora_triplay.engine import prefix_groups  # noqa: E402
from lora_triplay.engine.base import Request  # noqa: E402
from lora_triplay.judging.parsing import LABEL_CHOICES  # noqa: E402
from lora_triplay.triplay.roles import eval_messages  # noqa: E402

PLANS = ("template", "cheapest")


def step_pairs(run: Path, phase: str, iteration: int) -> list[dict]:
    rows = [r for r in read_jsonl(run / "eval_pairs.jsonl") if r.get("phase") == phase and r.get("iteration") == iteration]
    first = min((r["step"] for r in rows), default=None)
    if first is None:
        raise SystemExit(f"{run}/eval_pairs.jsonl has no {phase} pairs in iteration {iteration}; pick another --iteration")
    return [r for r in rows if r["step"] == first]


def use_plan(engine, name: str) -> None:
    engine._prefix_groups = lambda prompts, names, several: prefix_groups.plan(
        prompts, names, engine.MIN_SHARED_PREFIX, several, cheapest=name == "cheapest")


def measure(opened, pairs: list[dict], repeats: int) -> dict:
    engine, adapter = opened.engine, opened.adapter("eval")
    sees_kind = opened.recipe.rewards.eval_sees_kind
    requests = [Request(adapter, eval_messages(p["prompt"], p["response"], p.get("kind") if sees_kind else None),
                        choices=LABEL_CHOICES) for p in pairs]
    prompts = [engine.encode(r.messages) for r in requests]
    out = {"pairs": len(pairs), "requests": len({p["prompt"] for p in pairs}),
           "prompt_tokens_mean": round(statistics.mean(len(p) for p in prompts), 1)}
    names = [engine._peft_name(adapter)] * len(prompts)
    times: dict[str, list[float]] = {name: [] for name in PLANS}
    scores = {}
    for name in PLANS:  # what each plan runs (engine._batches: sorted batches of max_batch_size)
        tokens, forwards = 0, 0
        for part in engine._batches(prompts):
            ordered = [prompts[i] for i in part]
            shared = prefix_groups.plan(ordered, names[: len(part)], engine.MIN_SHARED_PREFIX, cheapest=name == "cheapest")
            t, f = prefix_groups.tokens_run(ordered, names[: len(part)], shared)
            tokens, forwards = tokens + t, forwards + f
        out[f"{name}_prefill_tokens"], out[f"{name}_prefix_forwards"] = tokens, forwards
    for k in range(repeats + 1):  # the first round warms both up, untimed
        for name in PLANS if k % 2 == 0 else PLANS[::-1]:
            use_plan(engine, name)
            t0 = time.perf_counter()
            scores[name] = engine.score_choices(requests)
            if k:
                times[name].append(time.perf_counter() - t0)
    del engine._prefix_groups
    for name in PLANS:
        out[f"{name}_s"] = round(statistics.median(times[name]), 3)
        out[f"{name}_s_all"] = [round(t, 3) for t in times[name]]
    out["time_ratio_cheapest_vs_template"] = round(out["cheapest_s"] / out["template_s"], 3)
    out["max_abs_logprob_diff"] = max(abs(a - b) for x, y in zip(scores["template"], scores["cheapest"])
                                      for u, v in zip(x, y) for a, b in zip(u, v))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--iteration", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/judge_groups.json"))
    args = ap.parse_args(argv)
    opened = open_run(args.run, device="cpu")
    res = {"run": str(args.run), "iteration": args.iteration, "repeats": args.repeats}
    for phase in ("blue", "red"):
        res[phase] = measure(opened, step_pairs(args.run, phase, args.iteration), args.repeats)
        print(phase, res[phase], flush=True)
    save_results(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
