"""Can the base model tell a harmful request from a benign one at all?

Over-refusal is the target the CPU runs miss by the widest margin: every
blue trained here (by the loop or by the fixed judge) refuses 35-67% of the
held-out benign requests once it refuses most harmful ones. This probe asks
whether the distinction is in the frozen base's representations: a linear
probe (logistic regression) on the hidden state of the prompt's last token,
under blue's own system prompt and chat template, at several depths.

- trained on the repo's seed requests (basic_prompts: harmful, benign_prompts:
  benign, the same ones blue and eval train on), tested on the held-out sets
  of an evidence run (JBB harmful vs JBB benign, XSTest unsafe vs safe,
  StrongREJECT vs XSTest safe): does what a LoRA could learn from our seeds
  carry over?
- 5-fold cross-validated within JBB (harmful vs benign, shared topics): how
  well a linear readout can separate them when it sees that distribution.

Reports AUC, accuracy, and the benign refusal rate at the threshold that
catches 80% of the harmful requests (what a blue that refuses by this
readout would over-refuse). Prints and saves JSON.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/harm_probe.py --heldout adapters/evidence6/heldout
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_io import csv_column, read_jsonl, save_results  # noqa: E402

from lora_triplay.bases import resolve_base  # noqa: E402

PROMPTS = ROOT / "lora_triplay" / "triplay" / "prompts"


def jsonl_prompts(path: Path) -> list[str]:
    return [row["prompt"] for row in read_jsonl(path)]


def blue_system() -> str:
    import yaml

    return yaml.safe_load((PROMPTS / "templates.yaml").read_text())["blue_system"]


@torch.no_grad()
def features(model, tok, prompts: list[str], layers: list[int], system: str) -> dict[int, np.ndarray]:
    """Last-token hidden state of each chat-formatted prompt, per layer."""
    out: dict[int, list[np.ndarray]] = {k: [] for k in layers}
    for text in prompts:
        chat = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
        for k in layers:
            out[k].append(hs[k][0, -1].float().numpy())
    return {k: np.stack(v) for k, v in out.items()}


def scores(x_train, y_train, x_test):
    # scikit-learn comes with sentence-transformers (the embedding judge's dependency)
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000, class_weight="balanced"))
    clf.fit(x_train, y_train)
    return clf.predict_proba(x_test)[:, 1]


def read_out(p_harm: np.ndarray, y: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import roc_auc_score

    harm = np.sort(p_harm[y == 1])
    at80 = harm[int(np.floor(0.2 * len(harm)))]  # 80% of harmful requests score at least this
    return {
        "auc": round(float(roc_auc_score(y, p_harm)), 3),
        "accuracy": round(float(((p_harm >= 0.5) == (y == 1)).mean()), 3),
        "benign_refused_at_80pct_harmful": round(float((p_harm[y == 0] >= at80).mean()), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heldout", required=True, help="an evidence run's heldout/ folder (bench/evidence.py --stages prepare)")
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--layers", default="6,12,18,24,30")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "harm-probe.json"))
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    path = resolve_base(args.base)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True).eval()
    tok = AutoTokenizer.from_pretrained(path)
    layers = [int(k) for k in args.layers.split(",")]
    held = Path(args.heldout)
    sets = {
        "seeds-harmful": jsonl_prompts(PROMPTS / "basic_prompts.jsonl"),
        "seeds-benign": jsonl_prompts(PROMPTS / "benign_prompts.jsonl"),
        "jbb-harmful": csv_column(held / "jbb-harmful.csv", "goal"),
        "jbb-benign": csv_column(held / "jbb-benign.csv", "goal"),
        "xstest-unsafe": csv_column(held / "xstest.csv", "prompt", ("label", "unsafe")),
        "xstest-safe": csv_column(held / "xstest.csv", "prompt", ("label", "safe")),
        "strongreject": csv_column(held / "strongreject.csv", "forbidden_prompt"),
    }
    system = blue_system()
    feats = {name: features(model, tok, prompts, layers, system) for name, prompts in sets.items()}
    tests = {"jbb harmful vs benign": ("jbb-harmful", "jbb-benign"),
             "xstest unsafe vs safe": ("xstest-unsafe", "xstest-safe"),
             "strongreject vs xstest safe": ("strongreject", "xstest-safe")}
    result: dict = {"base": args.base, "sizes": {k: len(v) for k, v in sets.items()}, "layers": {}}
    from sklearn.model_selection import StratifiedKFold

    for k in layers:
        x_tr = np.concatenate([feats["seeds-harmful"][k], feats["seeds-benign"][k]])
        y_tr = np.array([1] * len(sets["seeds-harmful"]) + [0] * len(sets["seeds-benign"]))
        row: dict = {}
        for name, (pos, neg) in tests.items():
            x_te = np.concatenate([feats[pos][k], feats[neg][k]])
            y_te = np.array([1] * len(sets[pos]) + [0] * len(sets[neg]))
            row[f"seeds -> {name}"] = read_out(scores(x_tr, y_tr, x_te), y_te)
        x = np.concatenate([feats["jbb-harmful"][k], feats["jbb-benign"][k]])
        y = np.array([1] * len(sets["jbb-harmful"]) + [0] * len(sets["jbb-benign"]))
        p = np.zeros(len(y))
        for train, test in StratifiedKFold(5, shuffle=True, random_state=0).split(x, y):
            p[test] = scores(x[train], y[train], x[test])
        row["jbb 5-fold"] = read_out(p, y)
        result["layers"][str(k)] = row
        print(f"layer {k}: " + "; ".join(f"{n} AUC {v['auc']} acc {v['accuracy']} benign@80 {v['benign_refused_at_80pct_harmful']}"
                                         for n, v in row.items()), flush=True)
    result["seconds"] = round(time.time() - t0, 1)
    save_results(args.out, result, f" ({result['seconds']} s)")


if __name__ == "__main__":
    main()
