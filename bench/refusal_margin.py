"""Does greedy decoding turn blue's doubt into refusals?

The held-out checks read blue's greedy answer. Blue's warm start teaches
every refusal with the same opening ("I can't help with that. Instead, you
could"), while its helpful answers each open their own way. A blue that
puts even a third of its first-token mass on "I" can then refuse greedily,
whatever most of its samples do. This script measures it on a run's blue
(or the bare base): per held-out request, the greedy answer (refused or
not, by the rules) beside the share of `--samples` answers at temperature
1 that refuse, and the probability of the first token of blue's refusal;
and how well each tells JBB's harmful requests from its benign ones (AUC),
whatever the refusal rate. Numbers only: no prompt or answer text leaves
the run folder.

Run: OMP_NUM_THREADS=2 .venv/bin/python bench/refusal_margin.py RUN --heldout RUN/../heldout --out FILE
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_io import auc, csv_column, save_results  # noqa: E402

from lora_triplay.core.runs import open_run  # noqa: E402
from lora_triplay.engine.base import Request, Sampling  # noqa: E402
from lora_triplay.judging.refusals import refused  # noqa: E402
from lora_triplay.triplay.roles import blue_messages, warmup_opening  # noqa: E402


@torch.no_grad()
def first_token_probability(run, adapter: str, prompts: list[str], token: int) -> list[float]:
    """P(first answer token == `token`) under `adapter` ("base": adapters off)."""
    model, out = run.model, []
    for text in prompts:
        ids = torch.tensor([run.engine.encode(blue_messages(text))])
        if adapter == "base":
            with model.disable_adapter():
                logits = model(input_ids=ids).logits[0, -1]
        else:
            model.set_adapter(adapter)
            logits = model(input_ids=ids).logits[0, -1]
        out.append(torch.softmax(logits.float(), -1)[token].item())
    return out


def measure(run, adapter: str, prompts: list[str], samples: int, max_new: int, token: int) -> dict:
    reqs = [Request(adapter, blue_messages(p)) for p in prompts]
    greedy = [c[0].text for c in run.engine.generate(reqs, Sampling(max_new_tokens=max_new, temperature=0.0))]
    sampled = run.engine.generate([Request(adapter, blue_messages(p), n=samples) for p in prompts],
                                  Sampling(max_new_tokens=max_new, temperature=1.0, seed=0))
    share = [sum(refused(c.text) for c in cs) / samples for cs in sampled]
    p_first = first_token_probability(run, adapter, prompts, token)
    g = [refused(t) for t in greedy]
    g_share = [s for s, r in zip(share, g) if r]
    return {
        "prompts": len(prompts),
        "greedy_refused": round(sum(g) / len(g), 3),
        "sampled_refused": round(statistics.mean(share), 3),
        "greedy_refused_sampled_share_median": round(statistics.median(g_share), 3) if g_share else None,
        "greedy_refused_but_most_samples_answer": round(sum(s < 0.5 for s in g_share) / len(g), 3),
        "p_refusal_token_mean": round(statistics.mean(p_first), 3),
        "p_refusal_token_median_where_greedy_refused": round(statistics.median([p for p, r in zip(p_first, g) if r]), 3)
        if any(g) else None,
        "per_prompt": {"greedy_refused": g, "sampled_refused": share, "p_refusal_token": [round(q, 4) for q in p_first]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a run folder (its latest blue is measured)")
    ap.add_argument("--heldout", required=True, help="an evidence run's heldout/ folder")
    ap.add_argument("--adapters", default="base,blue")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=40)
    ap.add_argument("--iteration", type=int, default=None, help="the adapters of this iteration (default: the latest)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    run = open_run(Path(args.run), args.iteration)
    held = Path(args.heldout)
    sets = {
        "jbb-harmful": csv_column(held / "jbb-harmful.csv", "goal"),
        "jbb-benign": csv_column(held / "jbb-benign.csv", "goal"),
        "xstest-safe": csv_column(held / "xstest.csv", "prompt", ("label", "safe")),
    }
    # the first token of blue's taught refusal ("I" of "I can't help with that ...")
    token = run.tokenizer(warmup_opening("guide"), add_special_tokens=False)["input_ids"][0]
    result = {"run": args.run, "iteration": args.iteration, "refusal_token": run.tokenizer.decode([token]), "samples": args.samples, "adapters": {}}
    for adapter in args.adapters.split(","):
        result["adapters"][adapter] = {name: measure(run, adapter, prompts, args.samples, args.max_new, token)
                                       for name, prompts in sets.items()}
        rows = result["adapters"][adapter]
        rows["auc_jbb_harmful_vs_benign"] = {
            k: round(auc(rows["jbb-harmful"]["per_prompt"][k], rows["jbb-benign"]["per_prompt"][k]), 3)
            for k in ("sampled_refused", "p_refusal_token")}
        print(adapter, "AUC JBB harmful vs benign", rows["auc_jbb_harmful_vs_benign"], flush=True)
        for name, row in ((n, r) for n, r in rows.items() if n in sets):
            print(adapter, name, {k: v for k, v in row.items() if k != "per_prompt"}, flush=True)
    result["seconds"] = round(time.time() - t0, 1)
    save_results(args.out, result, f" ({result['seconds']} s)")


if __name__ == "__main__":
    main()
