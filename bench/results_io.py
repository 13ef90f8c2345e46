"""What the bench scripts share: timing a call, reading a column of a
held-out CSV, saving results as JSON, an engine with the role adapters."""
from __future__ import annotations

import csv
import json
import statistics
import time
from pathlib import Path


def call_times(fn, repeats: int, warm: int = 0) -> list[float]:
    """Wall seconds of each of `repeats` calls of `fn`, after `warm` untimed ones."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_time(fn, repeats: int, warm: int = 0) -> float:
    return statistics.median(call_times(fn, repeats, warm))


def csv_column(path: str | Path, column: str, where: tuple[str, str] | None = None) -> list[str]:
    """One column of a CSV file, of the rows whose `where` = (column, value) holds."""
    with Path(path).open(newline="") as f:
        return [r[column] for r in csv.DictReader(f) if where is None or r[where[0]] == where[1]]


def save_results(out: str | Path, results: dict, note: str = "") -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}{note}")
    return out


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file. Split on newlines only: `str.splitlines()` also
    splits on U+2028 and other separators that generated text may carry
    inside a JSON string (an answer in the 2026-12-01 evidence run did)."""
    return [json.loads(line) for line in Path(path).read_text().split("\n") if line.strip()]


def auc(pos: list[float], neg: list[float]) -> float:
    """P(a score of `pos` above one of `neg`), ties half: how well a score
    tells harmful from benign requests, whatever its rate."""
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def role_engine(base: str, max_batch_size: int = 64):
    """The HF engine on `base` (CPU, float32) with the three role adapters at
    the evidence recipe's LoRA (rank 16, alpha 32), their B matrices small and
    random so that each adapter computes something of its own."""
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.model import attach_role_adapters, load_base
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.tiny import randomize_lora_b
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    model, tok, _ = load_base(ModelConfig(base=base, device="cpu", dtype="float32"))
    lora = LoraConfig(rank=16, alpha=32)
    model = attach_role_adapters(model, lora, seed=0, names=list(ROLE_ADAPTERS.values()))
    randomize_lora_b(model, seed=1, scale=0.01)
    model.eval()
    return HFEngine(model, tok, max_batch_size=max_batch_size, lora=lora)


def compare_variants(times: dict[str, list[float]], tokens: dict[str, list[int]], before: str, after: str) -> dict:
    """Per variant its median seconds, median tokens per second and every
    time; `ratio`: after's median over before's."""
    res = {}
    for k in times:
        res[f"{k}_s"] = statistics.median(times[k])
        res[f"{k}_tokens_per_s"] = statistics.median(n / s for n, s in zip(tokens[k], times[k]))
        res[f"{k}_all_s"] = times[k]
    res["ratio"] = res[f"{after}_s"] / res[f"{before}_s"]
    return res
