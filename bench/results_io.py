"""What every bench script does last: save its results as JSON."""
from __future__ import annotations

import json
from pathlib import Path


def save_results(out: str | Path, results: dict, note: str = "") -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}{note}")
    return out
