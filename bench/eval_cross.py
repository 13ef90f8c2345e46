"""Which eval reads which blue's answers? Several runs' eval snapshots score
the same training answers of blue, so what an eval misreads can be told
apart from what a blue wrote.

    .venv/bin/python bench/eval_cross.py OUT.json \
        --evals main-warm=RUN_A:1 no-benign=RUN_B:1 --answers no-div=RUN_C no-benign=RUN_B
        [--iterations 1,2] [--flip-kind]

Each --answers run's blue training answers (eval_pairs.jsonl, phase blue,
--iterations, at most 60 per cell) are split by the rules judge into four
cells: refusals and compliances of harmful requests, refusals and answers of
benign ones. Every eval scores every cell in choice mode, told the request's
kind as in training. Printed and saved per (answers, cell, eval): how often
eval's most likely label was `negative`, its mean class probabilities, and
blue's expected reward under them (rewards.blue_class_values, and
rewards.blue_benign_class_values for benign requests, of the first --evals run's recipe).
`aucs`: how well blue's reward under each eval ranks the answer the
rules want above the other inside a kind (harmful: refusal over
compliance; benign: answer over refusal), from eval's probabilities
(`soft`) and from its likeliest label (`hard`): GRPO scales advantages by
each group's spread, so the ranking is what blue learns from, not the
mean gap. Pooled over requests, where a group holds one request's
answers: a stand-in for the within-group ranking, which --groups measures:
every blue answer of --iterations scored (true kind), each request's group
ranked on its own, pairs summed over groups (`group_aucs`). With --flip-kind every cell is scored a second time told the other kind
(`flipped_*`): how much of eval's reading comes from the kind line and how
much from the answer's words. The answers stay in their run folders; OUT holds numbers only."""
from __future__ import annotations

import argparse
import json
import statistics as st
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PER_CELL = 60


def cells(run: Path, iterations: frozenset[int] = frozenset({1, 2})) -> dict[str, list[dict]]:
    """Blue's training answers of `iterations`, by kind and by the rules' reading."""
    from lora_triplay.judging.refusals import rules_label

    rows = [json.loads(line) for line in (run / "eval_pairs.jsonl").read_text().splitlines() if line.strip()]
    blue = [r for r in rows if r.get("phase") == "blue" and r.get("iteration") in iterations and r.get("eval_label")]
    out: dict[str, list[dict]] = {}
    for kind, refusal_name, other_name in (("harmful", "refusal", "compliance"), ("benign", "refusal", "answer")):
        mine = [r for r in blue if r["kind"] == kind]
        answered = "negative" if kind == "harmful" else "positive"  # the rules' label for an answer that is not a refusal
        refused = [r for r in mine if rules_label(r["response"], kind) != answered]
        kept = [r for r in mine if rules_label(r["response"], kind) == answered]
        out[f"{kind} {refusal_name}"], out[f"{kind} {other_name}"] = refused[:PER_CELL], kept[:PER_CELL]
    return out


# inside each kind, the answer the rules want and the one they do not
WANTED_OVER = {"harmful refusal": "harmful compliance", "benign answer": "benign refusal"}


def ranking_aucs(rewards: dict[tuple[str, str, str], dict[str, list[float]]]) -> list[dict]:
    """Per (answers, eval, kind): P(blue's reward for a wanted answer > for an
    unwanted one), ties half, from the soft and the hard rewards."""
    from results_io import auc

    out = []
    for (answers_name, name, cell), wanted in rewards.items():
        unwanted = rewards.get((answers_name, name, WANTED_OVER.get(cell, "")))
        if unwanted and wanted["soft"] and unwanted["soft"]:
            out.append({"answers": answers_name, "eval": name, "kind": cell.split()[0],
                        **{k: round(auc(wanted[k], unwanted[k]), 3) for k in ("soft", "hard")}})
    return out


def within_group_auc(groups: list[list[tuple[bool, float]]]) -> dict:
    """GRPO's view: inside each group (one request's answers, (wanted by the
    rules, blue's reward) each), P(a wanted answer's reward > an unwanted
    one's), ties half, pairs summed over the groups that hold both."""
    wins = pairs = used = 0
    for group in groups:
        good = [r for w, r in group if w]
        bad = [r for w, r in group if not w]
        if good and bad:
            used += 1
            pairs += len(good) * len(bad)
            wins += sum((g > b) + 0.5 * (g == b) for g in good for b in bad)
    return {"auc": round(wins / pairs, 3) if pairs else None, "pairs": pairs, "groups_with_both": used,
            "groups": len(groups)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--evals", nargs="+", required=True, help="NAME=RUN_DIR:ITERATION (eval's snapshot of that run)")
    ap.add_argument("--answers", nargs="+", required=True, help="NAME=RUN_DIR (blue's training answers of that run)")
    ap.add_argument("--iterations", default="1,2", help="blue's training answers of these iterations (default 1,2)")
    ap.add_argument("--flip-kind", action="store_true", help="score each cell again told the other kind")
    ap.add_argument("--groups", action="store_true", help="also rank every answer of --iterations inside its request's group")
    a = ap.parse_args()
    iterations = frozenset(int(x) for x in a.iterations.split(","))

    from lora_triplay.core.runs import open_run, snapshot_folder
    from lora_triplay.core.store import RunStore
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.judging.parsing import LABEL_CHOICES, LABELS
    from lora_triplay.triplay.eval_steps import judged
    from lora_triplay.triplay.rewards.values import class_value
    from lora_triplay.triplay.roles import eval_messages

    evals = {}
    for spec in a.evals:
        name, _, where = spec.partition("=")
        folder, _, it = where.rpartition(":")
        evals[name] = (Path(folder), int(it))
    first = next(iter(evals.values()))[0]
    run = open_run(first, device="cpu", world=1)  # the base and one engine; each eval's snapshot loads beside it
    values = {kind: run.recipe.rewards.blue_values(kind) for kind in ("harmful", "benign")}
    adapters = {}
    for name, (folder, it) in evals.items():
        adapters[name] = f"cross_{name}"
        run.engine.load_adapter(adapters[name], str(snapshot_folder(RunStore(folder), "eval", it)))

    results, t0 = [], time.perf_counter()
    rewards: dict[tuple[str, str, str], dict[str, list[float]]] = {}  # (answers, eval, cell) -> soft / hard rewards
    for spec in a.answers:
        answers_name, _, folder = spec.partition("=")
        for cell, rows in cells(Path(folder), iterations).items():
            kind = cell.split()[0]
            for name, adapter in adapters.items():
                if not rows:
                    continue
                def score(told: str) -> list[list[float]]:
                    reqs = [Request(adapter, eval_messages(r["prompt"], r["response"], told), 1, LABEL_CHOICES) for r in rows]
                    return [c[0].choice_probs for c in run.engine.generate(reqs, Sampling(max_new_tokens=8, temperature=0.0))]

                probs = score(kind)
                reward = [class_value(dict(zip(LABELS, pr)), values[kind]) for pr in probs]  # blue's soft-label reward
                hard = [class_value(judged(pr), values[kind]) for pr in probs]  # ... and from its label
                rewards[(answers_name, name, cell)] = {"soft": reward, "hard": hard}
                row = {"answers": answers_name, "cell": cell, "eval": name, "n": len(rows),
                       "called_negative": round(sum(judged(pr) == "negative" for pr in probs) / len(rows), 3),
                       **{f"p_{label}": round(st.mean(pr[i] for pr in probs), 3) for i, label in enumerate(LABELS)},
                       "expected_reward": round(st.mean(reward), 3),
                       "called_positive": round(sum(judged(pr) == "positive" for pr in probs) / len(rows), 3),
                       "its_run_called_negative": round(sum(r["eval_label"] == "negative" for r in rows) / len(rows), 3)}
                if a.flip_kind:
                    flipped = score("benign" if kind == "harmful" else "harmful")
                    row.update({f"flipped_p_{label}": round(st.mean(pr[i] for pr in flipped), 3) for i, label in enumerate(LABELS)})
                    row.update({f"flipped_called_{label}": round(sum(judged(pr) == label for pr in flipped) / len(rows), 3)
                                for label in LABELS})
                results.append(row)
                print(json.dumps(row), flush=True)
    aucs = ranking_aucs(rewards)
    for row in aucs:
        print(json.dumps(row), flush=True)
    group_aucs = []
    if a.groups:
        from lora_triplay.judging.refusals import rules_label

        for spec in a.answers:
            answers_name, _, folder = spec.partition("=")
            rows = [json.loads(x) for x in (Path(folder) / "eval_pairs.jsonl").read_text().splitlines() if x.strip()]
            rows = [r for r in rows if r.get("phase") == "blue" and r.get("iteration") in iterations and r.get("eval_label")]
            # wanted by the rules: a refusal of a harmful request, an answer (not a refusal) to a benign one
            wanted = [(rules_label(r["response"], r["kind"]) != "negative") if r["kind"] == "harmful"
                      else (rules_label(r["response"], r["kind"]) == "positive") for r in rows]
            for name, adapter in adapters.items():
                reqs = [Request(adapter, eval_messages(r["prompt"], r["response"], r["kind"]), 1, LABEL_CHOICES) for r in rows]
                probs = [c[0].choice_probs for c in run.engine.generate(reqs, Sampling(max_new_tokens=8, temperature=0.0))]
                soft = [class_value(dict(zip(LABELS, pr)), values[r["kind"]]) for pr, r in zip(probs, rows)]
                hard = [class_value(judged(pr), values[r["kind"]]) for pr, r in zip(probs, rows)]
                for kind in ("harmful", "benign"):
                    keys = sorted({(r["iteration"], r.get("step"), r["prompt"]) for r in rows if r["kind"] == kind}, key=str)
                    index = {k: i for i, k in enumerate(keys)}
                    row = {"answers": answers_name, "eval": name, "kind": kind, "answers_scored": sum(r["kind"] == kind for r in rows)}
                    for label, rewards_of in (("soft", soft), ("hard", hard)):
                        groups: list[list[tuple[bool, float]]] = [[] for _ in keys]
                        for r, w, x in zip(rows, wanted, rewards_of):
                            if r["kind"] == kind:
                                groups[index[(r["iteration"], r.get("step"), r["prompt"])]].append((w, x))
                        row[label] = within_group_auc(groups)
                    group_aucs.append(row)
                    print(json.dumps(row), flush=True)
    payload = {"date": time.strftime("%Y-%m-%d"), "evals": {k: f"{f}:{i}" for k, (f, i) in evals.items()},
               "answers": a.answers, "iterations": sorted(iterations),
               "flip_kind": a.flip_kind, "per_cell": PER_CELL, "seconds": round(time.perf_counter() - t0, 1), "results": results, "aucs": aucs,
               "group_aucs": group_aucs}
    Path(a.out).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
