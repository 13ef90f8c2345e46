"""Eval's warm start across batch orders, and what averaging its last steps does.

    python bench/eval_warm_orders.py --gold WORK/heldout/labelled-pairs.jsonl [--seed 0] [--orders 0,1,2]

One session of recipes/cpu-evidence.yaml makes the warm start's data once
(step 1: the styled answers, the panel's labels). Then, for each batch order
(the sampler's `random` reseeded), eval's adapter goes back to its initial
weights and a fresh optimizer and learns the same pairs for
`phases.eval_warmup.steps` steps; the adapter is kept after every step and
checked on the labelled answer set (never trained on) as:
  last      the last step's weights (phases.eval_warmup.average_last 0)
  tail-K    the mean of the last K steps' weights (K = a third and a half of the
            steps; cpu-evidence.yaml's average_last 15 is tail-15)
  ema-D     an exponential moving average with decay D
Every variant's choice probabilities on the gold set and on the run's own
held-out slice go to the JSON, so other read-outs can be computed offline.
`kind_only` is the gold set read by the request's kind alone (harmful:
negative, benign: positive): what a judge told the kind (rewards.eval_sees_kind)
gets without reading the answer.
Why: one run's warm-start accuracy moved by 0.08 (negative recall by 0.8)
with the batch order alone (stop 37); a setting can only be judged on its
spread over orders.
`--after-blue` runs blue's warm start first, as
`phases.eval_warmup.after_blue_warmup` does, so the pool holds the
warm-started blue's answers (`pool_labels` in the JSON: the same seed's run
made the same 728 pairs, stop 69).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lora_triplay.core.session import Session  # noqa: E402
from lora_triplay.model import adapter_parameters  # noqa: E402
from lora_triplay.recipe import load_recipe  # noqa: E402
from lora_triplay.triplay.eval_steps import judged  # noqa: E402
from lora_triplay.triplay.rundata import load_gold_pairs  # noqa: E402

LABELS = ("negative", "rejective", "positive")


def read_out(probs: list[list[float]], gold: list[str], kinds: list[str] | None = None,
             values=None) -> dict:
    """Accuracy and each class's recall; with the pairs' kinds, each
    (kind, class) cell's recall too, and with blue's class values the mean
    expected reward eval's probabilities give each cell (what blue is paid
    with soft labels; `values(kind)` gives blue's class values for a kind,
    rewards.blue_values)."""
    preds = [judged(p) for p in probs]
    out = {"accuracy": round(sum(p == g for p, g in zip(preds, gold)) / len(gold), 4)}
    for c in LABELS:
        mine = [p for p, g in zip(preds, gold) if g == c]
        out[f"recall_{c}"] = round(sum(p == c for p in mine) / len(mine), 4) if mine else None
    for kind in sorted(set(kinds or [])):
        for c in LABELS:
            cell = [(p, pr) for p, pr, g, k in zip(preds, probs, gold, kinds) if g == c and k == kind]
            if not cell:
                continue
            out[f"recall_{kind}_{c}"] = round(sum(p == c for p, _ in cell) / len(cell), 4)
            if values:
                v = values(kind)
                out[f"expected_{kind}_{c}"] = round(sum(sum(x * v[lab] for x, lab in zip(pr, LABELS)) for _, pr in cell) / len(cell), 4)
    return out


def restart(params: dict[str, torch.Tensor], start: dict[str, torch.Tensor], learner, seed: int) -> None:
    """Eval's adapter back to `start`, its optimizer empty, the batch sampler reseeded: one batch order's run."""
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(start[k])
    learner.optimizer.state.clear()
    random.seed(seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gold", required=True)
    ap.add_argument("--probe", default=None, help="more labelled pairs to read out alone (JSONL as --gold: prompt, response, kind, "
                    "label), e.g. a run's blue answers labelled by the rules judge")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--orders", default="0,1,2")
    ap.add_argument("--ema", default="0.9")
    ap.add_argument("--variants", default="", help="check only these (e.g. last,tail-15); default every one")
    ap.add_argument("--work", default="adapters/eval-warm-orders")
    ap.add_argument("--out", default=None, help="JSON path (default: WORK/seed-S.json)")
    ap.add_argument("--set", action="append", default=[], help="a recipe override (key=value)")
    ap.add_argument("--after-blue", action="store_true", help="blue's warm start first, as phases.eval_warmup.after_blue_warmup "
                    "runs it: eval's pool then holds the warm-started blue's own answers")
    args = ap.parse_args()
    if args.after_blue:
        args.set.append("phases.eval_warmup.after_blue_warmup=true")
    steps_off = [f"phases.{p}.steps=0" for p in ("red", "blue", "eval") + (() if args.after_blue else ("blue_warmup",))]
    recipe = load_recipe(ROOT / "recipes" / "cpu-evidence.yaml",
                         [f"seed={args.seed}", "iterations=1", "phases.eval_warmup.steps=1", *steps_off, *args.set,
                          "phases.eval_warmup.average_last=0"])  # the variants below are computed here, not by the session
    full = load_recipe(ROOT / "recipes" / "cpu-evidence.yaml", [f"seed={args.seed}", *args.set])
    steps, cfg = full.phases.eval_warmup.steps, full.phases.eval_warmup
    work = Path(args.work) / f"seed-{args.seed}"
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    session = Session.open(recipe, run_dir)
    game = session.game
    evals, adapter, learner = game.phases.evals, game.roles["eval"], session.learners["eval"]
    params = adapter_parameters(session.model, adapter)
    start = {k: v.detach().clone() for k, v in params.items()}  # as the run starts it
    session.run()  # step 1 makes and labels the pairs
    gold_rows = load_gold_pairs(args.gold)
    gold = [r["label"] for r in gold_rows]
    probe_rows = load_gold_pairs(args.probe) if args.probe else []
    values = full.rewards.blue_values  # per kind: a benign refusal costs what the recipe says
    held = game.data.heldout_pairs()
    held_gold = [r["panel_label"] for r in held]
    tails = sorted({max(steps // 3, 1), max(steps // 2, 1)})
    decays = [float(x) for x in args.ema.split(",") if x]
    pool = game.data.labelled
    result = {"seed": args.seed, "after_blue": args.after_blue, "steps": steps,
              "pool_labels": {c: sum(r.get("panel_label") == c for r in pool) for c in LABELS},
              "lr": cfg.lr, "lr_end": getattr(cfg, "lr_end", None),
              "eval_sees_kind": full.rewards.eval_sees_kind,
              "pairs": game.data.labelled_count(), "gold_n": len(gold), "heldout_n": len(held), "orders": {},
              # the yardstick for a judge told the kind: a compliance's label follows from it alone
              "kind_only": read_out([[1.0, 0.0, 0.0] if r.get("kind", "harmful") == "harmful" else [0.0, 0.0, 1.0]
                                     for r in gold_rows], gold)}

    def check(weights: dict[str, torch.Tensor]) -> dict:
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(weights[k])
        session.engine.sync_adapter(adapter)
        g = evals._choice_probs([evals._request(x) for x in gold_rows])
        h = evals._choice_probs([evals._request(x) for x in held]) if held else []
        q = evals._choice_probs([evals._request(x) for x in probe_rows]) if probe_rows else []
        kinds = [x.get("kind", "harmful") for x in held]
        out = {"gold": read_out(g, gold, [x.get("kind", "harmful") for x in gold_rows], values),
               "heldout": read_out(h, held_gold, kinds, values) if held else None,
               "gold_probs": [[round(x, 5) for x in p] for p in g], "heldout_probs": [[round(x, 5) for x in p] for p in h]}
        if probe_rows:
            out["probe"] = read_out(q, [x["label"] for x in probe_rows], [x.get("kind", "harmful") for x in probe_rows], values)
            out["probe_probs"] = [[round(x, 5) for x in p] for p in q]
        return out

    finals: dict[str, list[dict[str, torch.Tensor]]] = {}  # each order's weights, per variant
    for order in [int(x) for x in args.orders.split(",")]:
        t0 = time.perf_counter()
        restart(params, start, learner, 10_000 + order)
        kept, ema = [], {d: None for d in decays}
        for step in range(1, steps + 1):
            learner.lr = game.phase_lr("eval_warmup", step, steps)
            res = evals.train(1, step, [], {}, "eval_warmup")
            learner.step([], res.examples, res.smoothing)
            now = {k: v.detach().clone() for k, v in params.items()}
            kept.append(now)
            for d in decays:
                ema[d] = now if ema[d] is None else {k: d * ema[d][k] + (1 - d) * now[k] for k in now}
        train_s = time.perf_counter() - t0
        variants = {"last": kept[-1]}
        for t in tails:
            variants[f"tail-{t}"] = {k: torch.stack([w[k] for w in kept[-t:]]).mean(0) for k in kept[-1]}
        for d in decays:
            variants[f"ema-{d}"] = ema[d]
        wanted = [v for v in args.variants.split(",") if v] or list(variants)
        checks = {name: check(w) for name, w in variants.items() if name in wanted}
        for name in wanted:
            finals.setdefault(name, []).append(variants[name])
        result["orders"][str(order)] = {"train_seconds": round(train_s, 1), **checks}
        print(f"seed {args.seed} order {order} ({train_s:.0f}s): " + "  ".join(
            f"{n} {c['gold']['accuracy']:.3f} (neg {c['gold']['recall_negative']:.2f} rej {c['gold']['recall_rejective']:.2f} "
            f"pos {c['gold']['recall_positive']:.2f}; held {c['heldout']['accuracy'] if c['heldout'] else '-'})"
            for n, c in checks.items()), flush=True)
        for n, c in checks.items():
            cells = {f"{part}:{k[len('recall_'):]}": v for part in ("heldout", "probe") if c.get(part)
                     for k, v in c[part].items() if k.startswith("recall_harmful")}
            print(f"  {n} harmful cells: {cells}", flush=True)
        out = Path(args.out) if args.out else work.parent / f"seed-{args.seed}.json"
        out.write_text(json.dumps(result, indent=1))
    # a soup: the mean of the orders' weights (one adapter), against the
    # ensemble of their probabilities (computed offline from the JSON)
    if len(result["orders"]) > 1:
        for name, ws in finals.items():
            c = check({k: torch.stack([w[k] for w in ws]).mean(0) for k in ws[0]})
            result[f"soup-{name}"] = c
            print(f"seed {args.seed} soup of {len(ws)} orders' {name}: {c['gold']['accuracy']:.3f} (neg {c['gold']['recall_negative']:.2f} "
                  f"rej {c['gold']['recall_rejective']:.2f} pos {c['gold']['recall_positive']:.2f})", flush=True)
        out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
