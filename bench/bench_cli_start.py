"""What a command's start costs before it does anything: the imports.

A model-loading command (`run`, `eval`, `play`, `chat`, `serve`, `export`)
imports transformers' model code and PEFT; transformers then also imports
scikit-learn and scipy if they are installed (sentence-transformers installs
them), for assisted generation and the object-detection losses, which
lora-triplay never uses. The command line tells transformers they are absent
(`cli.skip_unused_transformers_imports`).
This times, in fresh processes and alternated so a drifting host hits both
alike, the imports a model-loading command makes with and without that skip,
and the commands that load no model (`--help`, `validate`, `plan`: they must
stay light, importing neither torch nor transformers).

    python bench/bench_cli_start.py [--repeats 5] [--out FILE] [--baseline OLD_CHECKOUT]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_io import save_results

ROOT = Path(__file__).resolve().parents[1]
MODEL_IMPORTS = "import peft, transformers.models.qwen3.modeling_qwen3"
SKIP = "from lora_triplay.cli import skip_unused_transformers_imports; skip_unused_transformers_imports(); "
CASES = {
    "model imports, transformers as it comes": f"{MODEL_IMPORTS}",
    "model imports, scikit-learn and scipy skipped (the command line)": f"{SKIP}{MODEL_IMPORTS}",
    "lora-triplay --help": "import sys; sys.argv = ['lora-triplay', '--help']; from lora_triplay.cli import main; main()",
    # the commands that read recipes and load no model: no torch either (training/advantages.py)
    "lora-triplay validate recipes/*.yaml": ("import sys, glob; sys.argv = ['lora-triplay', 'validate', *sorted(glob.glob('recipes/*.yaml'))]; "
                                             "from lora_triplay.cli import main; main()"),
    "lora-triplay plan recipes/14b.yaml": ("import sys; sys.argv = ['lora-triplay', 'plan', 'recipes/14b.yaml']; "
                                           "from lora_triplay.cli import main; main()"),
}
NO_MODEL = tuple(name for name in CASES if name.startswith("lora-triplay "))  # the commands that load no model
BASELINE = " [baseline]"


def wall(code: str, tree: Path = ROOT) -> float:
    """One fresh process running `code` on the lora_triplay of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=tree, env=env)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout (e.g. a `git worktree` of an older commit): its no-model commands are timed "
                         "beside this one's, alternated")
    args = ap.parse_args(argv)
    runs = [(name, CASES[name], ROOT) for name in CASES]
    if args.baseline:
        runs += [(name + BASELINE, CASES[name], args.baseline.resolve()) for name in NO_MODEL]
    times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for k in range(args.repeats + 1):  # the first round fills the page cache and is not kept
        for name, code, tree in runs[:: 1 if k % 2 else -1]:
            seconds = wall(code, tree)
            if k:
                times[name].append(round(seconds, 3))
    med = {name: round(statistics.median(t), 3) for name, t in times.items()}
    names = list(CASES)
    plain, skipped = med[names[0]], med[names[1]]
    result = {"repeats": args.repeats, "seconds": times, "median_seconds": med,
              "saved_seconds": round(plain - skipped, 3), "ratio_skipped_to_plain": round(skipped / plain, 3)}
    if args.baseline:
        commit = subprocess.run(["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        result["baseline"] = {"tree": str(args.baseline), "commit": commit or None,
                              "ratio_to_baseline": {n: round(med[n] / med[n + BASELINE], 3) for n in NO_MODEL}}
    for name in times:
        print(f"{name}: {med[name]:.2f} s")
    print(f"saved {result['saved_seconds']:.2f} s a model-loading command (x{result['ratio_skipped_to_plain']})")
    if args.out:
        save_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
