"""How much of eval's input is the same in every example, and how much of a
run's time goes to forwards over eval's template: where a run on the CPU
spends its time. The shared-prompt forward (training/forward.py)
computes that prefix once per micro-batch. Until 2026-12-06
forward.padded_tokens sized micro-batches as if every prompt ran whole, so
an eval update of the evidence recipe (8 examples of ~530 tokens,
2,048-token budget) ran in 3 micro-batches, the prefix 3 times; in one it
runs ~18% fewer tokens (bench/results/eval_prefix_share.json). The trainer
now counts the prefix once, and the recipe's budget holds an update in one
micro-batch (bench/bench_eval_update.py: x0.62 of the update's time).

    python bench/eval_prefix_share.py RUN_FOLDER [--pairs FILE] [--out FILE]

Tokenizes eval's chat (triplay/roles.py eval_messages, with each pair's kind
line where the run gives eval the kind) with the run's base tokenizer for
every labelled pair (default: the run's experts.gold_pairs, the held-out
labelled set of bench/evidence.py); reports the mean length, the prefix that
every example shares token for token, and its share. From the run's
metrics.jsonl: minutes per phase (step time) and the minutes spent on eval's
template (its warm start's and phases' updates, its judging in red's and
blue's steps, the panel, the held-out and gold checks). No model runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from results_io import save_results

from lora_triplay.bases import resolve_base
from lora_triplay.judging.parsing import LABEL_CHOICES
from lora_triplay.model import load_tokenizer
from lora_triplay.recipe import load_recipe
from lora_triplay.training.forward import SHARED, Rows, common_prefix, padded_tokens
from lora_triplay.training.supervised import ChoiceExample, _chunks
from lora_triplay.triplay.roles import eval_messages

# (phase, metrics key) of the work that forwards eval's template (or the panel's, of the same shape)
EVAL_TEMPLATE_WORK = {("eval_warmup", "update_seconds"): "eval warm start, updates",
                      ("eval", "update_seconds"): "eval phases, updates",
                      ("red", "seconds_judge"): "eval judging red's attacks",
                      ("blue", "seconds_judge"): "eval judging blue's answers",
                      ("*", "seconds_panel"): "expert panel",
                      ("eval_heldout", "check_seconds"): "eval's held-out check",
                      ("eval_gold", "check_seconds"): "eval's gold check"}


def run_tokens(rows: list[Rows]) -> int:
    """Tokens the shared-prompt forward runs for `rows` (forward.py
    _shared_hidden): the common prefix once, each distinct prompt's rest
    padded to the longest, each completion padded to the longest. Since
    2026-12-06 the trainer's own count (forward.padded_tokens); before, it
    counted every prompt whole."""
    return padded_tokens(rows, SHARED)


def step_packing(ids: list[list[int]], choices: list[list[int]], per_step: int, budget: int) -> dict:
    """One eval update of `per_step` examples (every label a row): the
    micro-batches the supervised update cuts at `budget` (supervised.py
    _chunks) and the tokens they run, against the same examples in one
    micro-batch (the prefix once a step)."""
    per_step = min(per_step, len(ids))
    parts, tokens, whole = [], [], []
    for lo in range(0, len(ids) - per_step + 1, per_step):
        cut = _chunks([ChoiceExample(p, choices, 0) for p in ids[lo: lo + per_step]], SHARED, budget)
        parts.append(len(cut))
        tokens.append(sum(run_tokens([Rows(ex.prompt_ids, c) for ex in chunk for c in choices]) for chunk in cut))
        whole.append(run_tokens([Rows(p, c) for p in ids[lo: lo + per_step] for c in choices]))
    return {"examples_per_step": per_step, "budget_tokens": budget, "microbatches_per_step": statistics.mean(parts),
            "tokens_run_per_step": round(statistics.mean(tokens)), "tokens_run_in_one_microbatch": round(statistics.mean(whole)),
            "saving_in_one_microbatch": round(1 - statistics.mean(whole) / statistics.mean(tokens), 3)}


def eval_examples(recipe, pairs: Path | None) -> tuple[list[list[int]], list[list[int]], int]:
    """(eval's prompt ids per labelled pair, the label choices' ids, examples
    per eval step) as the run's eval reads them (eval_steps.py examples)."""
    pairs = pairs or (Path(recipe.experts.gold_pairs) if recipe.experts.gold_pairs else None)
    if pairs is None or not pairs.is_file():
        raise SystemExit(f"labelled pairs {pairs}: not found; give --pairs (JSONL rows with prompt, response, kind)")
    tok = load_tokenizer(resolve_base(recipe.model.base), recipe.model)
    rows = [json.loads(line) for line in pairs.read_text().splitlines() if line.strip()]
    sees_kind = recipe.rewards.eval_sees_kind
    ids = [tok.apply_chat_template(eval_messages(r["prompt"], r["response"], r.get("kind") if sees_kind else None),
                                   add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] for r in rows]
    choices = [list(tok.encode(c, add_special_tokens=False)) + [tok.eos_token_id] for c in LABEL_CHOICES]  # engine choice_ids
    return ids, choices, recipe.phases.eval.prompts_per_step or recipe.grpo.prompts_per_step


def prefix_share(run: Path, pairs: Path | None) -> dict:
    recipe = load_recipe(run / "recipe.yaml")
    ids, choices, per_step = eval_examples(recipe, pairs)
    mean = statistics.mean(len(x) for x in ids)
    shared = common_prefix(ids, minimum=0)  # each prompt keeps its last token for its own pass, as in the forward
    pairs = pairs or Path(recipe.experts.gold_pairs)
    sees_kind = recipe.rewards.eval_sees_kind
    return {"pairs": str(pairs), "examples": len(ids), "eval_sees_kind": sees_kind, "mean_tokens": round(mean, 1),
            "min_tokens": min(len(x) for x in ids), "max_tokens": max(len(x) for x in ids),
            "shared_prefix_tokens": shared, "shared_share": round(shared / mean, 3),
            "update": step_packing(ids, choices, per_step, recipe.grpo.max_tokens_per_microbatch)}


def time_split(run: Path) -> dict:
    per_phase, template = defaultdict(float), defaultdict(float)
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        per_phase[row["phase"]] += row.get("step_seconds", 0.0) + row.get("check_seconds", 0.0)
        for (phase, key), name in EVAL_TEMPLATE_WORK.items():
            if phase in ("*", row["phase"]) and key in row:
                template[name] += row[key]
    minutes = {k: round(v / 60, 2) for k, v in per_phase.items()}
    return {"minutes_per_phase": minutes, "minutes_total": round(sum(per_phase.values()) / 60, 2),
            "minutes_on_eval_template": {k: round(v / 60, 2) for k, v in template.items()},
            "minutes_on_eval_template_total": round(sum(template.values()) / 60, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder (recipe.yaml, metrics.jsonl)")
    ap.add_argument("--pairs", type=Path, default=None, help="labelled pairs JSONL (default: the run's experts.gold_pairs)")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: print only)")
    args = ap.parse_args(argv)
    result = {"run": args.run.name, **prefix_share(args.run, args.pairs), **time_split(args.run)}
    print(json.dumps(result, indent=2))
    if args.out:
        save_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
