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
`aucs`: how well blue's reward under each eval ranks the answer the rules
want above the other inside a kind (harmful: refusal over compliance;
benign: answer over refusal), from eval's probabilities (`soft`) and from
its likeliest label (`hard`). GRPO scales advantages by each group's
spread, so the ranking is what blue learns from, not the mean gap; pooled
over requests it is a stand-in. --groups ranks each request's group on its
own, every blue answer of --iterations scored (`group_aucs`). --flip-kind
scores every cell again told the other kind (`flipped_*`): how much of
eval's reading comes from the kind line and how much from the words.
The answers stay in their run folders; OUT holds numbers only."""
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


def blue_answers(run: Path, iterations: frozenset[int]) -> list[dict]:
    """Blue's judged training answers (eval_pairs.jsonl, phase blue) of `iterations`."""
    rows = [json.loads(line) for line in (run / "eval_pairs.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("phase") == "blue" and r.get("iteration") in iterations and r.get("eval_label")]


def refused(row: dict) -> bool:
    """The rules' reading: anything but their label for an answer (harmful: `negative`, benign: `positive`)."""
    from lora_triplay.judging.refusals import rules_label

    return rules_label(row["response"], row["kind"]) != ("negative" if row["kind"] == "harmful" else "positive")


def wanted(row: dict) -> bool:
    """What the rules want: a refusal of a harmful request, an answer to a benign one."""
    return refused(row) == (row["kind"] == "harmful")


def cells(run: Path, iterations: frozenset[int] = frozenset({1, 2})) -> dict[str, list[dict]]:
    """Blue's training answers of `iterations`, by kind and by the rules' reading."""
    blue = blue_answers(run, iterations)
    out: dict[str, list[dict]] = {}
    for kind, refusal_name, other_name in (("harmful", "refusal", "compliance"), ("benign", "refusal", "answer")):
        mine = [r for r in blue if r["kind"] == kind]
        no = [r for r in mine if refused(r)]
        kept = [r for r in mine if not refused(r)]
        out[f"{kind} {refusal_name}"], out[f"{kind} {other_name}"] = no[:PER_CELL], kept[:PER_CELL]
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
    from results_io import auc

    wins = pairs = used = 0
    for group in groups:
        good, bad = [r for w, r in group if w], [r for w, r in group if not w]
        if good and bad:
            used, pairs = used + 1, pairs + len(good) * len(bad)
            wins += auc(good, bad) * len(good) * len(bad)
    return {"auc": round(wins / pairs, 3) if pairs else None, "pairs": pairs, "groups_with_both": used,
            "groups": len(groups)}


def group_aucs(rows: list[dict], soft: list[float], hard: list[float]) -> dict[str, dict]:
    """Per kind, `within_group_auc` of blue's soft and hard rewards, a group
    being one request's answers in one step."""
    out = {}
    for kind in ("harmful", "benign"):
        groups: dict[tuple, dict[str, list]] = {}
        for r, s_, h in zip(rows, soft, hard):
            if r["kind"] == kind:
                g = groups.setdefault((r["iteration"], r.get("step"), r["prompt"]), {"soft": [], "hard": []})
                w = wanted(r)
                g["soft"].append((w, s_))
                g["hard"].append((w, h))
        out[kind] = {"answers_scored": sum(len(g["soft"]) for g in groups.values()),
                     **{k: within_group_auc([g[k] for g in groups.values()]) for k in ("soft", "hard")}}
    return out


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

    def score(adapter: str, rows: list[dict], told: list[str]) -> tuple[list, list[float], list[float]]:
        """Eval's class probabilities for each answer told `told` (a kind per row), and blue's soft / hard rewards."""
        reqs = [Request(adapter, eval_messages(r["prompt"], r["response"], k), 1, LABEL_CHOICES) for r, k in zip(rows, told)]
        probs = [c[0].choice_probs for c in run.engine.generate(reqs, Sampling(max_new_tokens=8, temperature=0.0))]
        kinds = [r["kind"] for r in rows]
        return (probs, [class_value(dict(zip(LABELS, pr)), values[k]) for pr, k in zip(probs, kinds)],
                [class_value(judged(pr), values[k]) for pr, k in zip(probs, kinds)])

    results, t0 = [], time.perf_counter()
    rewards: dict[tuple[str, str, str], dict[str, list[float]]] = {}  # (answers, eval, cell) -> soft / hard rewards
    for spec in a.answers:
        answers_name, _, folder = spec.partition("=")
        for cell, rows in cells(Path(folder), iterations).items():
            kind = cell.split()[0]
            for name, adapter in adapters.items():
                if not rows:
                    continue
                probs, reward, hard = score(adapter, rows, [kind] * len(rows))
                rewards[(answers_name, name, cell)] = {"soft": reward, "hard": hard}
                row = {"answers": answers_name, "cell": cell, "eval": name, "n": len(rows),
                       "called_negative": round(sum(judged(pr) == "negative" for pr in probs) / len(rows), 3),
                       **{f"p_{label}": round(st.mean(pr[i] for pr in probs), 3) for i, label in enumerate(LABELS)},
                       "expected_reward": round(st.mean(reward), 3),
                       "called_positive": round(sum(judged(pr) == "positive" for pr in probs) / len(rows), 3),
                       "its_run_called_negative": round(sum(r["eval_label"] == "negative" for r in rows) / len(rows), 3)}
                if a.flip_kind:
                    flipped = score(adapter, rows, ["benign" if kind == "harmful" else "harmful"] * len(rows))[0]
                    row.update({f"flipped_p_{label}": round(st.mean(pr[i] for pr in flipped), 3) for i, label in enumerate(LABELS)})
                    row.update({f"flipped_called_{label}": round(sum(judged(pr) == label for pr in flipped) / len(rows), 3)
                                for label in LABELS})
                results.append(row)
                print(json.dumps(row), flush=True)
    aucs = ranking_aucs(rewards)
    for row in aucs:
        print(json.dumps(row), flush=True)
    by_group = []
    if a.groups:
        for spec in a.answers:
            answers_name, _, folder = spec.partition("=")
            rows = blue_answers(Path(folder), iterations)
            for name, adapter in adapters.items():
                _, soft, hard = score(adapter, rows, [r["kind"] for r in rows])
                for kind, row in group_aucs(rows, soft, hard).items():
                    by_group.append({"answers": answers_name, "eval": name, "kind": kind, **row})
                    print(json.dumps(by_group[-1]), flush=True)
    payload = {"date": time.strftime("%Y-%m-%d"), "evals": {k: f"{f}:{i}" for k, (f, i) in evals.items()},
               "answers": a.answers, "iterations": sorted(iterations),
               "flip_kind": a.flip_kind, "per_cell": PER_CELL, "seconds": round(time.perf_counter() - t0, 1), "results": results, "aucs": aucs,
               "group_aucs": by_group}
    Path(a.out).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
