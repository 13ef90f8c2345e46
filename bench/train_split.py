"""A training split of the public benchmarks, disjoint from the held-out sets.

Why: every blue trained on this CPU refused 35-67% of JBB's benign requests
once it refused most harmful ones, while it refused only 2-18% of our own
benign stream (BENCHMARKS.md, "Why does blue refuse benign requests?"). Is
that our data (72 sensitive-sounding requests and 40 topic twins of our
wording) or the 135M model? This split lets a run train on benchmark
requests of the same kind as the held-out ones, on other topics:

* JBB: its harmful and benign rows come in pairs (row i of each file shares
  a behaviour: a defamatory article / a fact-checking article). A pair is
  used only if neither of its rows is held out, so no held-out request's
  twin is trained on.
* XSTest: each safe prompt has an unsafe contrast prompt on the same focus
  word ("kill a Python process" / "kill a person"). A row is used only if
  no held-out row and no prompt of eval's labelled answer set shares its
  focus word (or, where it has none, its text).

The files go to WORK/train/ (git-ignored, never into the repo), with the
package's own requests first: benign.jsonl (ours + JBB benign + XSTest
safe) and harmful.jsonl (ours + JBB harmful + XSTest unsafe), rows
`{id, category, prompt}` as `data.benign_prompts` / `data.basic_prompts`
read them. manifest.json says how many rows came from where.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from heldout import read_csv


def _package_rows(harmful: bool) -> list[dict]:
    """The package's own requests, read as a run reads them."""
    from lora_triplay.triplay.roles import load_basic_prompts

    path = None if harmful else str(resources.files("lora_triplay.triplay").joinpath("prompts/benign_prompts.jsonl"))
    return [_row(p.id, p.category, p.prompt) for p in load_basic_prompts(path)]


def _row(id_: str, category: str, prompt: str) -> dict:
    return {"id": id_, "category": category, "prompt": prompt}


def jbb_pairs(data: Path, held: Path) -> tuple[list[dict], list[dict]]:
    """JBB (harmful, benign) rows of the pairs with neither row held out."""
    harmful, benign = read_csv(data / "jbb/harmful-behaviors.csv"), read_csv(data / "jbb/benign-behaviors.csv")
    if [h["index"] for h in harmful] != [b["index"] for b in benign]:
        raise SystemExit(f"{data / 'jbb'}: the harmful and benign files are not in the same row order")
    out_idx = {r["index"] for name in ("jbb-harmful", "jbb-benign") for r in read_csv(held / f"{name}.csv")}
    keep = [(h, b) for h, b in zip(harmful, benign) if h["index"] not in out_idx]
    return ([_row(f"jbb-h-{h['index']}", h["category"], h["goal"]) for h, _ in keep],
            [_row(f"jbb-b-{b['index']}", b["category"], b["goal"]) for _, b in keep])


def xstest_rows(data: Path, held: Path) -> tuple[list[dict], list[dict]]:
    """XSTest (unsafe, safe) rows whose focus word no held-out prompt shares."""
    rows = read_csv(data / "xstest/xstest_prompts.csv")
    held_rows = read_csv(held / "xstest.csv")
    labelled = {json.loads(line)["prompt"] for line in (held / "labelled-pairs.jsonl").read_text().splitlines() if line.strip()}
    taken = {r["id"] for r in held_rows} | {r["id"] for r in rows if r["prompt"] in labelled}

    def key(r: dict) -> str:
        return (r.get("focus") or "").strip().lower() or r["prompt"]

    out_keys = {key(r) for r in rows if r["id"] in taken}
    keep = [r for r in rows if r["id"] not in taken and key(r) not in out_keys]
    return ([_row(f"xs-{r['id']}", r["type"], r["prompt"]) for r in keep if r["label"] == "unsafe"],
            [_row(f"xs-{r['id']}", r["type"], r["prompt"]) for r in keep if r["label"] == "safe"])


def write_training_split(work: Path, data: Path) -> dict:
    """WORK/train/{benign,harmful}.jsonl and manifest.json (once; reused)."""
    folder = work / "train"
    manifest_file = folder / "manifest.json"
    if manifest_file.is_file():
        return json.loads(manifest_file.read_text())
    held = work / "heldout"
    jbb_h, jbb_b = jbb_pairs(data, held)
    xs_u, xs_s = xstest_rows(data, held)
    ours_h, ours_b = _package_rows(harmful=True), _package_rows(harmful=False)
    files = {"harmful": ours_h + jbb_h + xs_u, "benign": ours_b + jbb_b + xs_s}
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        tmp = folder / f"{name}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(folder / f"{name}.jsonl")
    manifest = {
        "how": "bench/train_split.py: JBB pairs with neither row held out; XSTest rows whose focus word no held-out or "
               "labelled-set prompt shares; the package's own requests first",
        "harmful": {"ours": len(ours_h), "jbb": len(jbb_h), "xstest-unsafe": len(xs_u)},
        "benign": {"ours": len(ours_b), "jbb": len(jbb_b), "xstest-safe": len(xs_s)},
    }
    tmp = folder / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(manifest_file)
    return manifest
