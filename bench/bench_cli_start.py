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

    python bench/bench_cli_start.py [--repeats 5] [--out FILE]
"""
from __future__ import annotations

import argparse
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


def wall(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    names = list(CASES)
    times: dict[str, list[float]] = {name: [] for name in names}
    for k in range(args.repeats + 1):  # the first round fills the page cache and is not kept
        for name in names[:: 1 if k % 2 else -1]:
            seconds = wall(CASES[name])
            if k:
                times[name].append(round(seconds, 3))
    med = {name: round(statistics.median(t), 3) for name, t in times.items()}
    plain, skipped = med[names[0]], med[names[1]]
    result = {"repeats": args.repeats, "seconds": times, "median_seconds": med,
              "saved_seconds": round(plain - skipped, 3), "ratio_skipped_to_plain": round(skipped / plain, 3)}
    for name in names:
        print(f"{name}: {med[name]:.2f} s")
    print(f"saved {result['saved_seconds']:.2f} s a model-loading command (x{result['ratio_skipped_to_plain']})")
    if args.out:
        save_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
