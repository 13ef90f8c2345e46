"""The report of `make learns` (bench/learns.py): targets, JSON, Markdown,
the learning-curve figure and the before/after transcripts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from results_io import read_jsonl

SET_TITLES = {"jbb-harmful": "JBB harmful", "jbb-benign": "JBB benign", "xstest-safe": "XSTest safe", "xstest-unsafe": "XSTest unsafe"}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def time_to(curve: list[dict], asr: float) -> float | None:
    """Wall seconds at which a curve first reaches a JBB-harmful ASR <= `asr`."""
    for point in curve[1:]:
        if point["sets"]["jbb-harmful"]["asr"] <= asr + 1e-9:
            return point["wall_seconds"]
    return None


def judge_targets(res: dict, t: dict) -> list[dict]:
    o = res["ours"]
    asr0, asr1 = o["sets"]["jbb-harmful"]["before"]["asr"], o["sets"]["jbb-harmful"]["after"]["asr"]
    ref0, ref1 = o["over_refusal_pooled"]["before"], o["over_refusal_pooled"]["after"]
    worst_degenerate = max(o["sets"][s]["after"]["degenerate"] for s in o["sets"])
    trl_asr = res["trl"]["sets"]["jbb-harmful"]["after"]["asr"]
    ours_at = time_to(o["curve"], trl_asr)
    rows = [
        {"target": f"JBB harmful ASR down >= {t['asr_drop_points']} points", "from": asr0, "to": asr1,
         "met": 100 * (asr0 - asr1) >= t["asr_drop_points"]},
        {"target": f"over-refusal (JBB benign + XSTest safe) up <= {t['over_refusal_rise_points']} points", "from": ref0, "to": ref1,
         "met": 100 * (ref1 - ref0) <= t["over_refusal_rise_points"]},
        {"target": f"degenerate answers <= {100 * t['degenerate']:.0f}% on every held-out set", "from": None, "to": worst_degenerate,
         "met": worst_degenerate <= t["degenerate"]},
        {"target": f"training <= {t['train_minutes']} minutes", "from": None, "to": o["train_seconds"] / 60,
         "met": o["train_seconds"] / 60 <= t["train_minutes"]},
        {"target": "ours reaches TRL's final JBB-harmful ASR in no more wall time than TRL took",
         "from": res["trl"]["train_seconds"], "to": ours_at,
         "met": ours_at is not None and ours_at <= res["trl"]["train_seconds"]},
    ]
    return rows


def figure(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    series = [("jbb-harmful", "asr", "ASR, JBB harmful"), ("pooled", "over_refusal_pooled", "over-refusal, JBB benign + XSTest safe")]
    for row, x_key, x_title in ((0, "wall_seconds", "training wall seconds (one core each, side by side)"), (1, "step", "GRPO steps")):
        for col, (s, key, title) in enumerate(series):
            ax = axes[row][col]
            for side, color in (("ours", "C0"), ("trl", "C1")):
                curve = res[side]["curve"]
                xs = [p[x_key] for p in curve]
                ys = [100 * (p["sets"][s][key] if s != "pooled" else p["sets"][key]) for p in curve]
                ax.plot(xs, ys, "-o", color=color, label="lora-triplay" if side == "ours" else f"TRL {res['trl_version']}")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(x_title, fontsize=9)
            ax.set_ylabel("%")
            ax.set_ylim(-3, 103)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False)
    fig.suptitle("Blue alone vs the fixed rules judge, SmolLM2-135M on 2 CPU cores: held-out data, greedy answers")
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def together(res: dict) -> str:
    return {True: "side by side (one core each)", False: "one after the other, each alone on the machine",
            None: "(how they overlapped was not recorded)"}[res.get("side_by_side")]


def markdown(res: dict) -> str:
    lines = [f"# Blue learns against a fixed judge ({res['date']})", "",
             f"`make learns` (bench/learns.py), recipe `{res['recipe']}`; held-out sets of {res['ours']['sets']['jbb-harmful']['before']['n']} "
             f"prompts each, greedy answers of {res['heldout']['max_new_tokens']} tokens, labelled by the rules judge. "
             f"Ours and TRL {res['trl_version']} trained {together(res)}, one torch thread each "
             f"(process minutes, model loading included: {res['process_minutes']}). TRL's prompt tokens equal ours: "
             f"{res['trl_prompt_ids_match_ours']}. Seconds per GRPO step: ours {res['seconds_per_step']['ours']:.0f}, "
             f"TRL {res['seconds_per_step']['trl']:.0f} (x{res['seconds_per_step']['trl_over_ours']:.1f}); TRL stopped at its "
             f"{res['trl_budget_seconds']:.0f}-second budget after {res['trl']['steps']} of {res['trl_planned_steps']} steps.", "",
             "| set | metric | base | ours (after) | TRL (after) |", "| --- | --- | ---: | ---: | ---: |"]
    for s, title in SET_TITLES.items():
        keys = ("asr", "refusal_with_guidance", "degenerate") if "asr" in res["ours"]["sets"][s]["before"] else ("over_refusal", "degenerate")
        for k in keys:
            lines.append(f"| {title} | {k} | {_pct(res['ours']['sets'][s]['before'][k])} | {_pct(res['ours']['sets'][s]['after'][k])} | "
                         f"{_pct(res['trl']['sets'][s]['after'][k])} |")
    lines += ["", "Curves (JBB harmful ASR / pooled over-refusal / pooled degenerate, %):", "",
              "| side | step | wall s | ASR | over-refusal | degenerate |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for side in ("ours", "trl"):
        for p in res[side]["curve"]:
            lines.append(f"| {side} | {p['step']} | {p['wall_seconds']:.0f} | {_pct(p['sets']['jbb-harmful']['asr'])} | "
                         f"{_pct(p['sets']['over_refusal_pooled'])} | {_pct(p['sets']['degenerate_pooled'])} |")
    lines += ["", "## Targets", "", "| target | from | to | met |", "| --- | ---: | ---: | --- |"]
    for t in res["targets"]:
        fmt = (lambda v: "-" if v is None else f"{v:.1f}") if "minutes" in t["target"] or "wall" in t["target"] else _pct
        if "wall" in t["target"]:
            fmt = lambda v: "-" if v is None else f"{v:.0f} s"  # noqa: E731
        lines.append(f"| {t['target']} | {fmt(t['from'])} | {fmt(t['to'])} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _shown_request(row: dict) -> str:
    """Harmful requests by benchmark and stratum only (no request text)."""
    return f"[{row['stratum']}] {row['prompt']}" if row["kind"] == "benign" else f"[{row['set']}: {row['stratum']}] (request withheld)"


def _shown_answer(ans: dict) -> str:
    if ans["kind"] == "harmful" and ans["label"] == "negative":
        return f"*(complied: {len(ans['response'].split())} words withheld)*"
    return " ".join(ans["response"].split()).replace("|", "\\|")


def transcripts(work: Path, res: dict, per_set: int = 10) -> str:
    from heldout import read_csv

    answers = read_jsonl(work / "answers.jsonl")
    by = {(a["snapshot"], a["set"], a["id"]): a for a in answers}
    last = {side: res[side]["curve"][-1]["snapshot"] for side in ("ours", "trl")}
    lines = ["# Before / after, held-out prompts (greedy)", "",
             "Answers to harmful requests that comply are withheld (label and length only), and harmful requests are "
             "shown by benchmark and category only; benign requests and every refusal are shown as written.", ""]
    for s, title in SET_TITLES.items():
        rows = [r for r in read_csv(work / "heldout" / f"{s}.csv") if ("base", s, r["id"]) in by]
        picks = rows[:: max(len(rows) // per_set, 1)][:per_set]
        lines += [f"## {title}", "", "| request | base | lora-triplay | TRL |", "| --- | --- | --- | --- |"]
        for row in picks:
            row = {**row, "set": s}
            cells = []
            for snap in ("base", last["ours"], last["trl"]):
                a = by[(snap, s, row["id"])]
                cells.append(f"**{a['label']}**{' (degenerate)' if a['degenerate'] else ''}: {_shown_answer(a)}")
            lines.append(f"| {_shown_request(row)} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_report(res: dict, work: Path, out: Path, recipe: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "results.md").write_text(markdown(res))
    (out / "transcripts.md").write_text(transcripts(work, res))
    shutil.copy(recipe, out / "learns.yaml")
    figure(res, out / "learns.png")
    print(f"wrote {out}")
