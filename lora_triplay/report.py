"""`lora-triplay report`: plots and a Markdown summary of one run.

Writes into the output folder:
* `training.png`: the main figure, one panel per training signal from
  `metrics.jsonl` (reward per phase, red's ASR per defender, diversity
  penalty, entropy per phase, eval accuracy, panel label agreement) against
  the global step, with dashed lines where an iteration starts;
* `evaluation.png` (with `--eval results.json`): per iteration, blue's ASR
  and over-refusal per benchmark, red's ASR per defender and its OD, eval's
  accuracy;
* `summary.md`: a table with one row per iteration for training (means over
  the iteration's steps) and for evaluation;
* `report.json`: every plotted series as {x, y} (one point per metrics row
  that carries the value), the iteration boundaries and the files written.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from .errors import UserError
from .triplay.control import CONTROL

log = logging.getLogger(__name__)

PHASES = ("red", "blue", "eval")
# panel -> (title, y label, [(series name, phase or None, metrics key)])
TRAINING_PANELS = {
    "reward": ("reward per phase", "reward_mean", [(p, p, "reward_mean") for p in PHASES]),
    "red_asr": ("red ASR per defender (train-time eval judge)", "ASR", []),  # keys found in the rows
    "diversity": ("red diversity penalty", "value", [("diversity_penalty", "red", "diversity_penalty"),
                                                    ("s_bleu", "red", "s_bleu"), ("s_cos", "red", "s_cos")]),
    "entropy": ("policy entropy per phase", "entropy", [(p, p, "entropy") for p in PHASES]),
    "eval_accuracy": ("eval accuracy vs panel labels", "accuracy", [("accuracy", "eval", "accuracy")]),
    "label_agreement": ("expert panel agreement", "agreement", [("panel_agreement", "eval", "panel_agreement")]),
}
RATE_PANELS = {"red_asr", "eval_accuracy", "label_agreement"}  # shares in [0, 1]: a fixed y range
# the warm starts (supervised, before iteration 1's P_red): what each logs worth reading first and last
WARM_STARTS = {"eval_warmup": ("ce_loss", "accuracy"),
               "blue_warmup": ("ce_loss", "kept_answers", "harmful_kept_share", "benign_kept_share")}


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def read_metrics(run_dir: Path) -> list[dict]:
    file = Path(run_dir) / "metrics.jsonl"
    if not file.is_file():
        raise UserError(f"{file}: no metrics; pass a run folder written by `lora-triplay run`")
    rows, damaged = [], 0
    for line in file.read_bytes().splitlines():
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            row = None  # a line cut by a crash (the store trims it on resume), or damaged
        if isinstance(row, dict) and all(_is_int(row.get(k, 0)) for k in ("global_step", "iteration", "step")):
            rows.append(row)
        elif line.strip():
            damaged += 1
    if damaged:
        log.warning("%s: %d line(s) are not metrics rows and are left out", file, damaged)
    for i, r in enumerate(rows, 1):
        r.setdefault("global_step", i)
    return rows


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def game_of(run_dir: Path) -> str:
    """The run's game (recipe.yaml's `game`, TriPlay when absent)."""
    from .recipe import read_yaml

    file = Path(run_dir) / "recipe.yaml"
    return read_yaml(file).get("game", "triplay") if file.is_file() else "triplay"


def game_panels(game: str) -> dict:
    """Another game's panels: one per phase, its headline metrics (games/)."""
    from .games import game_class

    return {phase: (f"{phase}", "value", [(key, phase, key) for key in keys]) for phase, keys in game_class(game).headline.items()}


def training_series(rows: list[dict], spec: dict | None = None) -> dict:
    panels: dict[str, dict] = {}
    for name, (_, _, specs) in (spec or TRAINING_PANELS).items():
        if name == "red_asr":
            keys = sorted({k for r in rows if r.get("phase") == "red" for k in r if k.startswith("asr_")})
            specs = [(k[4:], "red", k) for k in keys]
        series = {}
        for label, phase, key in specs:
            pts = [(r["global_step"], _num(r.get(key))) for r in rows if (phase is None or r.get("phase") == phase)]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                series[label] = {"x": [x for x, _ in pts], "y": [y for _, y in pts]}
        panels[name] = series
    return panels


def iteration_boundaries(rows: list[dict]) -> list[dict]:
    """The first global step of each iteration."""
    out, seen = [], set()
    for r in rows:
        if r.get("iteration") not in seen:
            seen.add(r.get("iteration"))
            out.append({"iteration": r.get("iteration"), "step": r["global_step"]})
    return out


def evaluation_series(results: dict) -> dict:
    def pts(per_it: dict, get) -> dict:
        xy = sorted((int(it), get(m)) for it, m in per_it.items())
        xy = [(x, y) for x, y in xy if _num(y) is not None]
        return {"x": [x for x, _ in xy], "y": [float(y) for _, y in xy]}

    panels: dict[str, dict] = {"blue_asr": {}, "over_refusal": {}, "red_asr": {}, "red_od": {}, "eval_accuracy": {}}
    for name, b in results.get("benchmarks", {}).items():
        if b.get("harmful"):
            panels["blue_asr"][name] = pts(b["iterations"], lambda m: m["asr"])
        if b.get("benign"):
            panels["over_refusal"][name] = pts(b["iterations"], lambda m: m["over_refusal"])
    red = results.get("red")
    if red:
        for d in red["defenders"]:
            panels["red_asr"][d] = pts(red["iterations"], lambda m, d=d: m["asr"].get(d))
        panels["red_od"]["OD"] = pts(red["iterations"], lambda m: m["od"])
    acc = results.get("eval_accuracy")
    if acc:
        panels["eval_accuracy"]["accuracy"] = pts(acc["iterations"], lambda m: m["accuracy"])
    return {k: v for k, v in panels.items() if any(s["x"] for s in v.values())}


EVAL_TITLES = {
    "blue_asr": ("blue ASR on harmful prompts", "ASR"),
    "over_refusal": ("blue over-refusal on benign prompts", "refusal rate"),
    "red_asr": ("red ASR vs fixed defenders", "ASR"),
    "red_od": ("red output diversity (OD)", "OD"),
    "eval_accuracy": ("eval accuracy on the labelled set", "accuracy"),
}


def _grid(n: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, max(n, 1))
    rows = max(1, math.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return plt, fig, flat[:n]


# tick (3.5) + pad (3.5) + tick labels (~10) + label pad (4) + x label (~12) points
LEGEND_DROP_PT = 34


def _legend_below(ax) -> None:
    """The legend under the axes' x label, where it covers no point: inside
    the axes even `loc="best"` drew red's flat OD line's legend over one of
    its points. Anchored a fixed distance in points below the axes (past the
    tick labels and x label at any figure size); tight_layout makes room."""
    from matplotlib.transforms import offset_copy

    n = len(ax.get_legend_handles_labels()[1])
    ax.legend(fontsize=7, ncol=min(n, 4), frameon=False, loc="upper center", bbox_to_anchor=(0.5, 0),
              bbox_transform=offset_copy(ax.transAxes, fig=ax.figure, y=-LEGEND_DROP_PT, units="points"))


def plot_training(panels: dict, bounds: list[dict], file: Path, title: str) -> None:
    plt, fig, axes = _grid(len(TRAINING_PANELS))
    for ax, (name, (ptitle, ylabel, _)) in zip(axes, TRAINING_PANELS.items()):
        for b in bounds[1:]:
            ax.axvline(b["step"] - 0.5, color="grey", linestyle="--", linewidth=0.8)
        for label, s in panels.get(name, {}).items():
            ax.plot(s["x"], s["y"], marker="o", markersize=2.5, linewidth=1.2, label=label)
        ax.set_title(ptitle, fontsize=10)
        ax.set_xlabel("global step")
        ax.set_ylabel(ylabel)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if name in RATE_PANELS:
            ax.set_ylim(-0.03, 1.03)
        if panels.get(name):
            _legend_below(ax)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.suptitle(title + "  (dashed: iteration starts)", fontsize=11)
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)


def plot_evaluation(panels: dict, file: Path, title: str) -> None:
    plt, fig, axes = _grid(len(panels))
    for ax, (name, series) in zip(axes, panels.items()):
        for label, s in series.items():
            ax.plot(s["x"], s["y"], marker="o", linewidth=1.4, label=label)
        ptitle, ylabel = EVAL_TITLES[name]
        ax.set_title(ptitle, fontsize=10)
        ax.set_xlabel("iteration (0 = base / initial adapter)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.03, 1.03)
        ax.xaxis.get_major_locator().set_params(integer=True)
        _legend_below(ax)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)


def _fmt(v) -> str:
    v = _num(v)
    return "-" if v is None else f"{v:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def game_table(rows: list[dict], spec: dict) -> list[str]:
    cols = [(f"{phase} {key}", phase, key) for _, (_, _, specs) in spec.items() for _, phase, key in specs]
    return _iteration_table(rows, cols)


def training_table(rows: list[dict]) -> list[str]:
    asr_keys = sorted({k for r in rows if r.get("phase") == "red" for k in r if k.startswith("asr_")})
    cols = [("red reward", "red", "reward_mean"), ("blue reward", "blue", "reward_mean"), ("eval reward", "eval", "reward_mean")]
    cols += [(f"red {k}", "red", k) for k in asr_keys]
    cols += [("diversity penalty", "red", "diversity_penalty"), ("red entropy", "red", "entropy"),
             ("blue rate_negative", "blue", "rate_negative"), ("blue rate_rejective", "blue", "rate_rejective"),
             ("eval accuracy", "eval", "accuracy"), ("panel agreement", "eval", "panel_agreement")]
    return _iteration_table(rows, cols)


def warm_start_table(rows: list[dict]) -> list[str]:
    """Each warm start's metrics at its first and last logged value (empty: none ran)."""
    out = []
    for phase, keys in WARM_STARTS.items():
        mine = [r for r in rows if r.get("phase") == phase]
        for key in keys:
            vals = [v for v in (_num(r.get(key)) for r in mine) if v is not None]
            if vals:
                out.append([phase, key, _fmt(vals[0]), _fmt(vals[-1]), str(len(mine))])
    return _table(["warm start", "metric", "first", "last", "steps"], out) if out else []


def _iteration_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> list[str]:
    out = []
    for it in sorted({r["iteration"] for r in rows}):
        line = [str(it)]
        for _, phase, key in cols:
            vals = [_num(r.get(key)) for r in rows if r["iteration"] == it and r.get("phase") == phase]
            vals = [v for v in vals if v is not None]
            line.append(_fmt(sum(vals) / len(vals)) if vals else "-")
        out.append(line)
    return _table(["iteration"] + [c[0] for c in cols], out)


def evaluation_table(results: dict) -> list[str]:
    cols: list[tuple[str, object]] = []
    for name, b in results.get("benchmarks", {}).items():
        if b.get("harmful"):
            cols.append((f"{name} ASR", lambda it, b=b: b["iterations"].get(it, {}).get("asr")))
        if b.get("benign"):
            cols.append((f"{name} over-refusal", lambda it, b=b: b["iterations"].get(it, {}).get("over_refusal")))
    red = results.get("red") or {}
    for d in red.get("defenders", []):
        cols.append((f"red ASR vs {d}", lambda it, d=d: red["iterations"].get(it, {}).get("asr", {}).get(d)))
    if red:
        cols.append(("red OD", lambda it: red["iterations"].get(it, {}).get("od")))
    acc = results.get("eval_accuracy") or {}
    if acc:
        cols.append(("eval accuracy", lambda it: acc["iterations"].get(it, {}).get("accuracy")))
    its = sorted({int(it) for b in results.get("benchmarks", {}).values() for it in b["iterations"]}
                 | {int(it) for it in red.get("iterations", {})} | {int(it) for it in acc.get("iterations", {})})
    return _table(["iteration"] + [c[0] for c in cols], [[str(it)] + [_fmt(get(str(it))) for _, get in cols] for it in its])


TRAINING_DASH = ("`-`: no step of that iteration logged the value (a phase that did not run, or a defender skipped "
                 "because it had the same weights as another: `base` while blue is still untrained).")
EVALUATION_DASH = ("`-`: no value at that iteration: the role was not measured there (blue always adds the base as "
                   "iteration 0; red and eval have their own snapshots), or nothing could be scored (no valid rewrite "
                   "for OD; no answer the judge could label).")


def _explained(table: list[str], note: str) -> list[str]:
    """A table, and under it what its `-` cells mean where it has any."""
    return table + (["", note] if any("| - |" in line for line in table) else [])


def make_report(run_dir: Path, out: Path, eval_results: Path | None = None) -> dict:
    """Write the plots, summary.md and report.json into `out`; return report.json's content."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("report needs matplotlib: `pip install matplotlib` (or `pip install lora-triplay[report]`)") from None
    run_dir, out = Path(run_dir), Path(out)
    rows = read_metrics(run_dir)
    decisions = [r for r in rows if r.get("phase") == CONTROL]  # control.py's rows, not GRPO steps
    rows = [r for r in rows if r.get("phase") != CONTROL]
    results = None
    if eval_results is not None:
        if not Path(eval_results).is_file():
            raise UserError(f"{eval_results}: no such results file; write it with `lora-triplay eval ... --out FILE`")
        try:
            results = json.loads(Path(eval_results).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{eval_results} is not a results file ({exc}); pass the JSON `lora-triplay eval ... --out FILE` wrote") from None
        if not isinstance(results, dict) or not {"run", "judge"} <= results.keys():
            raise UserError(f"{eval_results} is JSON but not `eval`'s results (no run and judge keys); pass the file "
                            "`lora-triplay eval ... --out FILE` wrote")
    if not rows and results is None:
        raise UserError(f"{run_dir}: metrics.jsonl has no rows yet and no --eval results were given; nothing to report")
    from .outputs import check_report_out

    check_report_out(out)
    out.mkdir(parents=True, exist_ok=True)
    name = run_dir.resolve().name
    report: dict = {"run": str(run_dir.resolve()), "metrics_rows": len(rows), "files": []}
    md = [f"# lora-triplay report: {name}", "", f"Run folder: `{run_dir.resolve()}`; {len(rows)} metrics rows logged.", ""]
    game = game_of(run_dir)
    spec = None if game == "triplay" else game_panels(game)
    if rows:
        panels, bounds = training_series(rows, spec), iteration_boundaries(rows)
        plot_training(panels, bounds, out / "training.png", f"{name}: training")
        report.update(training={"boundaries": bounds, "panels": panels})
        report["files"].append("training.png")
        md += ["## Training (mean over each iteration's steps)", "", "![training curves](training.png)", ""]
        md += _explained(training_table(rows) if spec is None else game_table(rows, spec), TRAINING_DASH) + [""]
        warm = warm_start_table(rows)
        if warm:
            md += ["## Warm starts (supervised, before the first iteration's phases)", ""] + warm + [""]
    if decisions:
        report["control"] = decisions
        md += ["## Control decisions (recipe `control:`)", ""]
        md += _table(["iteration", "after", "action", "reason"],
                     [[str(d["iteration"]), d.get("after", ""), d["action"], d["reason"]] for d in decisions]) + [""]
    if results is not None:
        panels = evaluation_series(results)
        report["evaluation"] = {"judge": results.get("judge"), "limit": results.get("limit"), "panels": panels}
        md += ["## Evaluation per iteration", "",
               f"Judge: `{results.get('judge')}`; limit: {results.get('limit')}; finished {results.get('finished')}.", ""]
        if panels:
            plot_evaluation(panels, out / "evaluation.png", f"{name}: evaluation (judge {results.get('judge')})")
            report["files"].append("evaluation.png")
            md += ["![evaluation](evaluation.png)", ""]
        md += _explained(evaluation_table(results), EVALUATION_DASH) + [""]
    (out / "summary.md").write_text("\n".join(md), encoding="utf-8")
    report["files"] += ["summary.md", "report.json"]
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report
