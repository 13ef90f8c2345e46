"""One eval phase of a finished run, replayed under other settings.

    python bench/eval_phase_replay.py RUN --iteration 3 --gold WORK/heldout/labelled-pairs.jsonl \
        [--variant as-run=] [--variant slow=phases.eval.lr=5e-5] [--orders 0,1] [--out FILE]

Eval's adapter goes back to the run's eval@(N-1) (RUN/eval/iter-000N-1),
the panel's labels up to iteration N are the pool (RUN/panel.jsonl; N's
own are the current iteration's, as they were in the run), and eval learns
`phases.eval.steps` steps at `phases.eval.lr`, both and the batches under
each variant's overrides (recipe keys, comma-separated; empty: as the run
did), once per batch order (the sampler reseeded). After each, eval labels
the labelled answer set (never trained on): accuracy, per-class recall,
predicted-label rates. eval@(N-1) itself is checked first: it should match
the evidence report's iteration N-1.

Eval's optimizer starts from the run's own state at the end of iteration
N-1 where the run kept it (`run.snapshot_optimizer: true`: Adam's moments in
eval/iter-000N-1), else empty (`--fresh-optimizer` forces that). An empty
one is harsher: Adam's first step moves every weight by the full rate
whatever the gradient's size (main-decision-s0, whose run did not keep its
moments: iteration 2 replayed fell to 49.2 where the run held 88.3). Every
label of iteration N is in the pool from step 1 (the run labelled them step
by step). The `as-run` variant tells how close the
replay comes to what the run did. `--random-sign EPS` also checks eval@(N-1)
moved by +-EPS on every weight in a random direction: the yardstick for
whether the update's direction or only its size moves eval.
Why: main-decision-s0 (2026-12-05) lost 94.2 -> 50.8 on the labelled set in
its last eval phase; a replay tells which settings of that phase (its
batches, rate, steps) would have kept eval (bench/BENCHMARKS.md "Blue's
decision through the loop").
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eval_warm_orders import LABELS, read_out, restart  # noqa: E402

from lora_triplay.core.session import Session  # noqa: E402
from lora_triplay.model import activate, adapter_parameters, load_adapter_weights  # noqa: E402
from lora_triplay.recipe import load_recipe  # noqa: E402
from lora_triplay.triplay.eval_steps import judged  # noqa: E402
from lora_triplay.triplay.rundata import load_gold_pairs  # noqa: E402


def parse_variant(spec: str) -> tuple[str, list[str]]:
    name, sep, overrides = spec.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant {spec!r}: write NAME=KEY=VALUE[,KEY=VALUE] (or NAME= for the run's own settings)")
    return name, [o for o in overrides.split(",") if o]


def replay_pool(panel: list[dict], iteration: int, drop_current: set[str] = frozenset()) -> list[dict]:
    """The pool eval's phase N drew from: every labelled pair up to
    iteration N, less iteration N's own pairs with a label in
    `drop_current` (to ask whether those few new pairs steered the phase)."""
    return [r for r in panel if r.get("panel_label") and r["iteration"] <= iteration
            and not (r["iteration"] == iteration and r["panel_label"] in drop_current)]


def relabelled(rows: list[dict]) -> list[dict]:
    """The pool's labels given again by today's rule expert (judging/refusals.py),
    for a run whose panel was the rule expert alone: what eval would have
    been taught had the rules then been what they are now."""
    from lora_triplay.judging.refusals import rules_label

    return [{**r, "panel_label": rules_label(r["response"], r.get("kind", "harmful"), r.get("generic", False))} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--iteration", type=int, required=True, help="the eval phase to replay (>= 2: it starts from eval@N-1)")
    ap.add_argument("--gold", required=True, help="the labelled answer set (bench/evidence.py's heldout/labelled-pairs.jsonl)")
    ap.add_argument("--variant", action="append", default=[], help="NAME=OVERRIDES (default: as-run=, the run's own settings)")
    ap.add_argument("--orders", default="0,1")
    ap.add_argument("--out", default=None)
    ap.add_argument("--random-sign", default="", help="also check eval@(N-1) with every weight moved by +-EPS at random "
                    "(comma-separated EPS values; one draw per order)")
    ap.add_argument("--gold-limit", type=int, default=None, help="check the first N labelled answers only (a smoke run)")
    ap.add_argument("--drop-current", default="", help="leave iteration N's own pairs with these labels out of the pool "
                    "(comma-separated, e.g. rejective)")
    ap.add_argument("--relabel", action="store_true", help="the pool labelled again by today's rule expert (a run whose panel "
                    "was the rule expert alone)")
    ap.add_argument("--fresh-optimizer", action="store_true", help="start every variant from an empty optimizer even where "
                    "the run kept eval's moments")
    args = ap.parse_args()
    run = Path(args.run)
    start_dir = run / "eval" / f"iter-{args.iteration - 1:04d}"
    if args.iteration < 2 or not start_dir.is_dir():
        raise SystemExit(f"{start_dir}: no eval adapter to start from (give an iteration N >= 2 the run finished N-1 of)")
    variants = [parse_variant(v) for v in args.variant] or [("as-run", [])]
    run_recipe = load_recipe(run / "recipe.yaml")
    steps = run_recipe.phases.eval.steps
    session = Session.open(run_recipe, Path(tempfile.mkdtemp(prefix="eval-replay-")))
    game = session.game
    evals, adapter, learner = game.phases.evals, game.roles["eval"], session.learners["eval"]
    params = adapter_parameters(session.model, adapter)
    load_adapter_weights(session.model, adapter, start_dir, expect_rank=run_recipe.lora.rank)
    start = {k: v.detach().clone() for k, v in params.items()}
    moments = (start_dir / "optimizer.safetensors").is_file() and not args.fresh_optimizer
    activate(session.model, adapter)  # as the session does for a phase: eval's adapter the one the update trains
    session.model.eval()
    panel = [json.loads(line) for line in (run / "panel.jsonl").read_text().splitlines() if line.strip()]
    if args.relabel:
        experts = run_recipe.experts
        if not experts.rule_based or experts.safety_experts or experts.utility_experts:
            raise SystemExit("--relabel: this run's panel was not the rule expert alone; its labels cannot be given again by the rules")
        before = [r["panel_label"] for r in panel]
        panel = relabelled(panel)
        print(f"--relabel: {sum(a != r['panel_label'] for a, r in zip(before, panel))} of {len(panel)} labels changed", flush=True)
    pool = replay_pool(panel, args.iteration, set(args.drop_current.split(",")) - {""})
    game.data.labelled, game.data.pending = pool, []
    game.data.pairs.iteration = args.iteration
    gold_rows = load_gold_pairs(args.gold)[: args.gold_limit]
    drawn: list[dict] = []  # every pair the phase's batches drew, to count repeats
    sample = game.data.sample_labelled_pairs

    def recording(k: int) -> list[dict]:
        batch = sample(k)
        drawn.extend(batch)
        return batch

    game.data.sample_labelled_pairs = recording
    gold = [r["label"] for r in gold_rows]

    def check() -> dict:
        session.engine.sync_adapter(adapter)
        probs = evals._choice_probs([evals._request(x) for x in gold_rows])
        preds = [judged(p) for p in probs]
        out = read_out([[float(p == c) for c in LABELS] for p in preds], gold)
        out["mean_probs"] = [round(sum(p[i] for p in probs) / len(probs), 5) for i in range(len(LABELS))]
        out.update({f"pred_rate_{c}": round(sum(p == c for p in preds) / len(preds), 4) for c in LABELS})
        return out

    fresh = {c: sum(r["iteration"] == args.iteration and not r.get("heldout") for r in pool if r["panel_label"] == c) for c in LABELS}
    result = {"run": str(run), "iteration": args.iteration, "steps": steps, "lr": run_recipe.phases.eval.lr, "run_moments": moments,
              "dropped_current": args.drop_current, "relabelled": args.relabel,
              "current_iteration_labels": fresh, "pool": {c: sum(not r.get("heldout") for r in pool if r["panel_label"] == c) for c in LABELS},
              "start": check(), "variants": {}}
    print(f"eval@{args.iteration - 1}: {result['start']}; iteration {args.iteration}'s labels {fresh}", flush=True)
    for name, overrides in variants:
        # the batches (data.recipe) and the rate and steps (game.recipe) alike
        game.recipe = game.data.recipe = variant = load_recipe(run / "recipe.yaml", overrides)
        steps = variant.phases.eval.steps
        for order in [int(x) for x in args.orders.split(",")]:
            t0 = time.perf_counter()
            restart(params, start, learner, 20_000 + order)
            if moments:  # Adam's moments as the run had them when the phase began
                session.store.load_optimizer(start_dir, learner.optimizer)
            updates_before = learner.updates_done()  # the run's eval steps so far with its moments, else 0
            drawn.clear()
            steps_seen = []
            for step in range(1, steps + 1):
                learner.lr = game.phase_lr("eval", step, steps)
                res = evals.train(args.iteration, step, [], {}, "eval")
                stats = learner.step([], res.examples, res.smoothing)
                steps_seen.append({"ce_loss": round(stats.extra.get("ce_loss", float("nan")), 4), "grad_norm": round(stats.grad_norm, 5)})
            now = [r for r in drawn if r["iteration"] == args.iteration]
            moved = max((p.detach() - start[k]).abs().max().item() for k, p in params.items())
            mean_moved = sum((p.detach() - start[k]).abs().sum().item() for k, p in params.items()) / sum(p.numel() for p in params.values())
            out = {"seconds": round(time.perf_counter() - t0, 1), "optimizer_steps_before": updates_before,
                   "max_weight_change": moved, "mean_weight_change": mean_moved,
                   "steps": steps_seen, **check(),
                   # per label: draws from the current iteration / distinct pairs among them / all draws
                   "fresh_draws": {c: [sum(r["panel_label"] == c for r in now), len({r["pair"] for r in now if r["panel_label"] == c}),
                                       sum(r["panel_label"] == c for r in drawn)] for c in LABELS}}
            result["variants"].setdefault(name, {"overrides": overrides, "orders": {}})["orders"][str(order)] = out
            print(f"{name} order {order}: {out}", flush=True)
    # the yardstick for "the batches did it": eval@(N-1) moved as far as Adam's first step moves it (every
    # weight by +-EPS), in a random direction; if that collapses eval as well, eval sits on a cliff
    for eps in [float(x) for x in args.random_sign.split(",") if x]:
        for order in [int(x) for x in args.orders.split(",")]:
            gen = torch.Generator().manual_seed(30_000 + order)
            with torch.no_grad():
                for k, p in params.items():
                    p.copy_(start[k] + eps * (torch.randint(0, 2, p.shape, generator=gen) * 2 - 1).to(p.dtype))
            out = check()
            result.setdefault("random_sign", {}).setdefault(str(eps), {})[str(order)] = out
            print(f"random sign {eps} order {order}: {out}", flush=True)
    path = Path(args.out) if args.out else run / f"eval-replay-it{args.iteration}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
