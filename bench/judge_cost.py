"""Where does a blue step's judging time go?

In the evidence runs of 2026-12-03 a blue step took ~56 s, of which ~29 s
judging its 64 answers with eval in choice mode (metrics.jsonl
`seconds_judge`) against ~15 s generating them. This script times the
eval adapter on 64 pairs from a run's transcripts the way the loop asks it
(Phases.judge: forced choice over the three labels), beside the prefill
alone (one generated token: the same prompts, no choices) and a forced
choice with one label, so the cost of scoring three label lines after a
shared prompt shows apart from the prompt's own. The three labels are timed
both ways the engine scores choices: as one token tree per prompt (the
default since 2026-12-03) and as one row per label on a copy of the
prompt's cache (`three_labels_rows_s`, the path before), with the largest
difference in any label's log-prob between the two.

Run: OMP_NUM_THREADS=2 .venv/bin/python bench/judge_cost.py RUN --out FILE
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_io import median_time, save_results  # noqa: E402

from lora_triplay.core.runs import open_run  # noqa: E402
from lora_triplay.engine.base import Request, Sampling  # noqa: E402
from lora_triplay.triplay.roles import eval_messages  # noqa: E402

LABELS = ("Label: negative", "Label: rejective", "Label: positive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    run = open_run(Path(args.run))
    rows = [json.loads(line) for line in (Path(args.run) / "transcripts.jsonl").open()]
    # distinct pairs (a repeated one would share its whole prompt with its twin), blue's own first
    pairs = list(dict.fromkeys((r["prompt"], r["response"]) for r in sorted(rows, key=lambda r: r.get("phase") != "blue")
                               if r.get("prompt") and r.get("response")))[: args.pairs]
    msgs = [eval_messages(p, a) for p, a in pairs]
    adapter = run.adapter("eval")
    eng = run.engine
    lengths = [len(eng.encode(m)) for m in msgs]
    res = {"run": args.run, "pairs": len(msgs), "prompt_tokens_mean": statistics.mean(lengths),
           "shared_prefix_tokens": next((i for i, t in enumerate(zip(*[eng.encode(m) for m in msgs[:2]])) if t[0] != t[1]), None)}
    greedy = Sampling(max_new_tokens=1, temperature=0.0)
    three = [Request(adapter, m, 1, LABELS) for m in msgs]
    res["three_labels_s"] = median_time(lambda: eng.generate(three, greedy), args.repeats, warm=1)
    tree_scores = eng.score_choices(three)
    tree_path = type(eng)._tree_attention
    type(eng)._tree_attention = lambda self: False
    try:
        res["three_labels_rows_s"] = median_time(lambda: eng.generate(three, greedy), args.repeats, warm=1)
        rows_scores = eng.score_choices(three)
    finally:
        type(eng)._tree_attention = tree_path
    res["tree_vs_rows_max_abs_logprob_diff"] = max(abs(a - b) for t, r in zip(tree_scores, rows_scores)
                                                   for x, y in zip(t, r) for a, b in zip(x, y))
    res["one_label_s"] = median_time(lambda: eng.generate([Request(adapter, m, 1, LABELS[:1]) for m in msgs], greedy), args.repeats, warm=1)
    res["prefill_one_token_s"] = median_time(lambda: eng.generate([Request(adapter, m) for m in msgs], greedy), args.repeats, warm=1)
    res["prompt_tokens_per_s_prefill"] = sum(lengths) / res["prefill_one_token_s"]
    for k, v in res.items():
        print(k, round(v, 2) if isinstance(v, float) else v, flush=True)
    save_results(args.out, res)


if __name__ == "__main__":
    main()
