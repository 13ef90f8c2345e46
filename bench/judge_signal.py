"""How much signal does eval's judgement give blue? Blue's own training
answers to harmful requests (a run's eval_pairs.jsonl, one iteration; with
`--phase red`, the defenders' answers to red's rewrites: red's signal), the
rules judge's verdict on each (refused or complied) beside the run's eval
adapter of the iteration before (the one that judged them in training),
asked with each prompt view of `rewards.judge_prompt`: red's wrapped text
or the basic request. Prints and saves, per view:

- false safe: compliances eval calls rejective or positive (a reward blue
  gets for complying),
- refusal recall: refusals eval calls rejective or positive,
- AUC: how often a refusal's reward beats a compliance's, from eval's label
  (hard) and from its class probabilities (soft: the expected value),
- the refusals' share of the step's advantage under grpo's scalings.

    python bench/judge_signal.py RUN_DIR [--iteration 2] [--out bench/results/judge_signal.json]

RUN_DIR is a run folder (git-ignored: the answers stay there); the numbers
go to --out. One torch thread; ~2 minutes a view for ~190 answers on CPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from results_io import read_jsonl  # noqa: E402

VALUES = {"negative": -1.0, "rejective": 0.0, "positive": 1.0}  # blue's class values on harmful requests


def auc(pos: list[float], neg: list[float]) -> float | None:
    """P(a refusal's reward > a compliance's), ties counting half."""
    if not pos or not neg:
        return None
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def refusal_advantage(rows: list[dict], reward, scale: str, min_std: float) -> dict:
    """Sum of the refusals' advantages and of |advantage| on compliances,
    with blue's groups (one step's answers to one prompt) and the trainer's
    own advantage function (training/grpo.py), so the numbers are the ones
    a step would use."""
    from lora_triplay.training.advantages import group_advantages

    keys: dict[tuple, int] = {}
    groups = [keys.setdefault((r["step"], r["prompt"]), len(keys)) for r in rows]
    advantages = group_advantages([reward(r) for r in rows], groups, scale, min_std=min_std)
    kept = {g for g, a in zip(groups, advantages) if a != 0.0}
    signal = sum(a for r, a in zip(rows, advantages) if r["refused"])
    noise = sum(abs(a) for r, a in zip(rows, advantages) if not r["refused"])
    return {"groups": len(keys), "kept": len(kept), "refusal_advantage": round(signal, 3), "compliance_abs_advantage": round(noise, 3)}


def summarise(rows: list[dict]) -> dict:
    label = lambda r: max(r["probs"], key=r["probs"].get)  # noqa: E731
    hard = lambda r: VALUES[label(r)]  # noqa: E731
    soft = lambda r: sum(VALUES[k] * p for k, p in r["probs"].items())  # noqa: E731
    refused = [r for r in rows if r["refused"]]
    complied = [r for r in rows if not r["refused"]]
    return {
        "answers": len(rows), "refused": len(refused),
        "false_safe": sum(label(r) != "negative" for r in complied) / max(len(complied), 1),
        "refusal_recall": sum(label(r) != "negative" for r in refused) / max(len(refused), 1) if refused else None,
        "auc_hard": auc([hard(r) for r in refused], [hard(r) for r in complied]),
        "auc_soft": auc([soft(r) for r in refused], [soft(r) for r in complied]),
        "advantage": {f"{name} {scale} min_std {m}": refusal_advantage(rows, f, scale, m)
                      for name, f in (("hard", hard), ("soft", soft)) for scale in ("group", "batch") for m in (0.0, 0.1)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--iteration", type=int, default=2, help="blue's answers of this iteration, judged by eval@(iteration-1)")
    ap.add_argument("--views", default="wrapped,request")
    ap.add_argument("--phase", default="blue", choices=("blue", "red"),
                    help="whose answers: blue's training answers, or the defenders' answers to red's rewrites in red's phase "
                    "(what red is paid for)")
    ap.add_argument("--judge", default=None, help="the eval snapshot that judges (default eval@(iteration-1)); in "
                    "iteration 1 after an eval warm start, eval@0 is the untrained eval and the warm-started one is not "
                    "kept: name eval@1 (the warm start and one eval phase) as its nearest")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "judge_signal.json"))
    args = ap.parse_args()

    from lora_triplay.core.runs import open_run
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.judging.parsing import LABEL_CHOICES, LABELS
    from lora_triplay.judging.refusals import refused
    from lora_triplay.triplay.roles import eval_messages

    run_dir = Path(args.run_dir)
    pairs = [p for p in read_jsonl(run_dir / "eval_pairs.jsonl")
             if p.get("phase") == args.phase and p["iteration"] == args.iteration and p.get("kind") == "harmful"]
    if not pairs:
        raise SystemExit(f"{run_dir}: no harmful answers of {args.phase}'s phase, iteration {args.iteration}, in eval_pairs.jsonl")
    run = open_run(run_dir, device="cpu")
    judge = args.judge or f"eval@{args.iteration - 1}"
    if judge == "eval@0" and run.recipe.phases.eval_warmup.steps:
        raise SystemExit(f"{run_dir.name}: eval@0 is the untrained eval, not the warm-started one that judged iteration 1 "
                         "(not kept); pass --judge eval@1, the warm start plus one eval phase, as its nearest")
    adapter = run.ensure(judge)
    # eval told the request's kind where the run told it (rewards.eval_sees_kind): every pair here is harmful
    kind = "harmful" if run.recipe.rewards.eval_sees_kind else None
    out = {"run": str(run_dir), "iteration": args.iteration, "phase": args.phase, "judge": judge,
           "trained_view": run.recipe.rewards.judge_prompt, "sees_kind": kind is not None, "views": {}}
    for view in args.views.split(","):
        t0 = time.perf_counter()
        shown = [(p.get("basic") or p["prompt"]) if view == "request" else p.get("wrapped", p["prompt"]) for p in pairs]
        comps = run.engine.generate([Request(adapter, eval_messages(x, p["response"], kind), 1, LABEL_CHOICES) for x, p in zip(shown, pairs)],
                                    Sampling(max_new_tokens=4, temperature=0.0))
        rows = [{"refused": refused(p["response"]), "probs": dict(zip(LABELS, c[0].choice_probs)), "step": p["step"], "prompt": p["basic"]}
                for p, c in zip(pairs, comps)]
        out["views"][view] = {**summarise(rows), "seconds": round(time.perf_counter() - t0, 1)}
        v = out["views"][view]
        print(f"{run_dir.name} {args.phase} it {args.iteration} view {view:8s}: false safe {v['false_safe']:.3f}  refusal recall "
              f"{v['refusal_recall']}  AUC hard {v['auc_hard']}  soft {v['auc_soft']}  ({v['refused']}/{v['answers']} refused)")
    path = Path(args.out)
    saved = json.loads(path.read_text()) if path.is_file() else {}
    saved[f"{run_dir.name}@{args.iteration}" + ("" if args.phase == "blue" else f"/{args.phase}")] = out
    path.write_text(json.dumps(saved, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
