"""Every eval warm-start draw of a run (`phases.eval_warmup.draws`) read on a labelled answer set.

    python bench/eval_draws_gold.py RUN_DIR --gold WORK/heldout/labelled-pairs.jsonl [--out F]

The run keeps the draw its held-out slice ranks first and checks only that
one against the labelled set (`eval_gold`); this reads each draw's saved
weights (RUN_DIR/eval_draws/draw-K.safetensors) on the same set, beside the
slice scores the run ranked them by, so the selector can be checked against
what it did not see. The model is built from RUN_DIR/recipe.yaml in a
scratch folder; the run folder is only read.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from eval_warm_orders import read_out  # noqa: E402

from lora_triplay.core.session import Session  # noqa: E402
from lora_triplay.recipe import load_recipe  # noqa: E402
from lora_triplay.triplay.rundata import load_gold_pairs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--gold", required=True)
    ap.add_argument("--out", default=None, help="JSON path (default: RUN/eval-draws-gold.json)")
    args = ap.parse_args()
    state = json.loads((args.run / "state.json").read_text())
    if not state.get("eval_draws"):
        raise SystemExit(f"{args.run} holds no eval warm-start draws (phases.eval_warmup.draws > 1 writes them)")
    rows = [json.loads(x) for x in (args.run / "metrics.jsonl").read_text().splitlines()]
    decision = next((r for r in rows if r["phase"] == "eval_draws"), None)
    gold_rows = load_gold_pairs(args.gold)
    gold = [r["label"] for r in gold_rows]
    kinds = [r.get("kind", "harmful") for r in gold_rows]
    with tempfile.TemporaryDirectory() as scratch:
        session = Session.open(load_recipe(args.run / "recipe.yaml"), Path(scratch) / "run")
        evals = session.game.phases.evals
        out = {"run": str(args.run), "kept": decision and decision["kept"], "gold_n": len(gold), "draws": []}
        for entry in state["eval_draws"]:
            session.reset_role("eval", load_file(str(args.run / "eval_draws" / f"draw-{entry['draw']}.safetensors")))
            probs = evals._choice_probs([evals._request(x) for x in gold_rows])
            read = read_out(probs, gold, kinds)
            out["draws"].append({**entry, "gold": read})
            print(f"draw {entry['draw']}: held-out harmful-compliance recall {entry['score']}, held-out accuracy "
                  f"{entry['accuracy']:.3f} -> labelled set {read['accuracy']:.3f} (neg {read['recall_negative']:.2f} "
                  f"rej {read['recall_rejective']:.2f} pos {read['recall_positive']:.2f})"
                  f"{'  <- kept' if out['kept'] == entry['draw'] else ''}", flush=True)
        session.store.unlock()
    path = Path(args.out) if args.out else args.run / "eval-draws-gold.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
