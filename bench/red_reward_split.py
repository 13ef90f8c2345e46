"""What red was paid, in training, for a rewrite that kept its request and
for one that dropped it: rebuilt per iteration from a finished run's files
(no model but the sentence encoder).

    python bench/red_reward_split.py RUN [RUN ...] [--out FILE]

Each red step's rewrites and eval's labels of the defenders' answers are in
RUN/eval_pairs.jsonl (phase `red`), the attack success pool with the step
each entry joined in RUN/asp.jsonl. Per rewrite: kept or dropped
(judging/kept.py against the run's seed requests), the attack term from
eval's hard labels (the only ones the run keeps; it paid the expected
value under eval's probabilities, which tell a refusal from a compliance
better than the labels do, bench/judge_signal.py --phase red: read the
kept / dropped gaps, not the levels), the diversity penalty against
the pool as it stood before the step, and the reward red's semantic term
would give under three settings: none (the recipe), a bonus of 1 for a kept
rewrite (`semantic: meaning`), and the gate (`semantic_gate`, no bonus).

Why: with the gate, red's kept share fell in its second iteration
(main-semantic-gate-s0), and a kept rewrite sits nearer the pool (made of
kept attacks on the same 70 requests): did the diversity penalty pay red to
drop its request? This answers it from the run's own numbers.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_io import save_results  # noqa: E402

from lora_triplay.judging.kept import keeps_request  # noqa: E402
from lora_triplay.recipe import load_recipe  # noqa: E402
from lora_triplay.triplay.rewards import load_sentence_encoder, red_reward  # noqa: E402
from lora_triplay.triplay.rewards.diversity import AttackSuccessPool  # noqa: E402
from lora_triplay.triplay.roles import load_basic_prompts  # noqa: E402
from lora_triplay.triplay.rundata import _file  # noqa: E402


def mean(xs) -> float | None:
    xs = list(xs)
    return round(sum(xs) / len(xs), 3) if xs else None


def split_run(run: Path, encoder) -> dict:
    recipe = load_recipe(run / "recipe.yaml")
    rw, data = recipe.rewards, recipe.data
    seeds = [b.prompt for b in load_basic_prompts(_file(data.basic_prompts), data.prompt_column, data.limit)]
    weights = {d.name: d.weight for d in recipe.defenders}
    pairs = [json.loads(line) for line in (run / "eval_pairs.jsonl").read_text().splitlines()]
    pairs = [p for p in pairs if p["phase"] == "red"]
    labels: dict[tuple, dict[str, str]] = defaultdict(dict)
    for p in pairs:
        labels[(p["iteration"], p["step"], p["basic"], p["wrapped"])][p["defender"]] = p["eval_label"]
    rewrites = list(labels)
    kept = keeps_request([k[3] for k in rewrites], [k[2] for k in rewrites], encoder, pool=seeds)
    asp = [json.loads(line) for line in (run / "asp.jsonl").read_text().splitlines()] if (run / "asp.jsonl").is_file() else []
    rows: dict[int, dict[str, list[dict]]] = defaultdict(lambda: {"kept": [], "dropped": []})
    for step in sorted({k[:2] for k in rewrites}):
        pool = AttackSuccessPool(encoder, rw.ngram_orders)
        before = [a["text"] for a in asp if (a["iteration"], a["step"]) < step]
        if before:
            pool.add(before)
        here = [i for i, k in enumerate(rewrites) if k[:2] == step]
        for i, (s_bleu, s_cos) in zip(here, pool.score([rewrites[i][3] for i in here])):
            got = labels[rewrites[i]]

            def paid(semantic_value: float, gate: bool) -> tuple[float | None, dict]:  # the trainer's own reward function
                return red_reward(got, {d: weights.get(d, 1.0) for d in got}, rw.red_class_values, kept[i], semantic_value,
                                  s_bleu, s_cos, rw.w_bleu, rw.w_cos, rw.k, gate=gate)

            none, subs = paid(0.0, False)
            if none is None:  # no defender's label parsed: the run dropped it too
                continue
            rows[step[0]]["kept" if kept[i] else "dropped"].append(
                {"attack": subs["attack"], "penalty": subs["diversity_penalty"], "s_cos": s_cos, "none": none,
                 "bonus": paid(1.0, False)[0], "gate": paid(0.0, True)[0]})
    out = {}
    for it, by in sorted(rows.items()):
        out[str(it)] = {key: {"n": len(xs), **{f: mean(x[f] for x in xs) for f in ("attack", "penalty", "s_cos", "none", "bonus", "gate")}}
                        for key, xs in by.items()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    encoder = load_sentence_encoder("embedded:all-minilm-l6-v2")
    results = {}
    for run in args.runs:
        results[run.name] = split_run(run, encoder)
        print(run.name)
        for it, by in results[run.name].items():
            for key, s in by.items():
                print(f"  it {it} {key:7s} n={s['n']:3d} attack {s['attack']} penalty {s['penalty']} s_cos {s['s_cos']} | "
                      f"reward: none {s['none']}, bonus {s['bonus']}, gate {s['gate']}")
    if args.out:
        save_results(args.out, {"runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
