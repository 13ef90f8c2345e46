"""`lora-triplay report` on a hand-written run folder: series, boundaries,
tables, PNGs; no model needed (the tiny-run report test is in test_eval_command)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lora_triplay.cli import app
from lora_triplay.report import (
    EVALUATION_DASH,
    TRAINING_DASH,
    evaluation_series,
    iteration_boundaries,
    make_report,
    read_metrics,
    training_series,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _rows():
    rows, g = [], 0
    for it in (1, 2, 3):
        for phase, steps in (("red", 3), ("blue", 2), ("eval", 1)):
            for s in range(1, steps + 1):
                g += 1
                row = {"iteration": it, "phase": phase, "step": s, "global_step": g, "reward_mean": 0.1 * g, "entropy": 2.0}
                if phase == "red":
                    row.update(asr_blue=0.5, asr_base=0.25, **{"asr_blue@1": 0.75}, diversity_penalty=0.3, s_bleu=0.1, s_cos=0.2)
                elif phase == "blue":
                    row.update(rate_negative=0.2, rate_rejective=0.5, rate_positive=0.3)
                else:
                    row.update(accuracy=0.5 + 0.1 * it, panel_agreement=0.8, labelled_pairs=10.0 * it)
                rows.append(row)
    rows[0]["entropy"] = float("nan")  # a non-finite value is not a point
    return rows


RESULTS = {
    "run": "r", "judge": "rules", "limit": 10, "finished": "now",
    "benchmarks": {
        "jbb": {"harmful": 10, "benign": 0, "iterations": {
            "0": {"asr": 0.4, "over_refusal": None}, "1": {"asr": 0.3, "over_refusal": None}, "3": {"asr": 0.1, "over_refusal": None}}},
        "xstest": {"harmful": 4, "benign": 6, "iterations": {
            "0": {"asr": 0.5, "over_refusal": 0.1}, "1": {"asr": None, "over_refusal": 0.2}, "3": {"asr": 0.25, "over_refusal": 0.3}}},
    },
    "red": {"defenders": ["base", "blue@3"], "iterations": {
        "0": {"asr": {"base": 0.1, "blue@3": 0.0}, "od": 0.5}, "3": {"asr": {"base": 0.4, "blue@3": 0.2}, "od": 0.6}}},
    "eval_accuracy": {"iterations": {"0": {"accuracy": 0.3}, "3": {"accuracy": 0.7}}},
}


@pytest.fixture()
def run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()) + '{"cut half')
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    return run


def test_training_series_points_and_boundaries(run_dir):
    rows = read_metrics(run_dir)
    assert len(rows) == 18  # the half-written last line is skipped
    panels = training_series(rows)
    assert {k: len(v["x"]) for k, v in panels["reward"].items()} == {"red": 9, "blue": 6, "eval": 3}
    assert panels["reward"]["blue"]["x"] == [4, 5, 10, 11, 16, 17]
    assert {k: len(v["y"]) for k, v in panels["red_asr"].items()} == {"base": 9, "blue": 9, "blue@1": 9}
    assert len(panels["entropy"]["red"]["x"]) == 8  # the NaN row dropped
    assert panels["eval_accuracy"]["accuracy"]["y"] == pytest.approx([0.6, 0.7, 0.8])
    assert set(panels["diversity"]) == {"diversity_penalty", "s_bleu", "s_cos"}
    assert iteration_boundaries(rows) == [{"iteration": 1, "step": 1}, {"iteration": 2, "step": 7}, {"iteration": 3, "step": 13}]


def test_evaluation_series_skips_missing_values():
    panels = evaluation_series(RESULTS)
    assert panels["blue_asr"]["jbb"] == {"x": [0, 1, 3], "y": [0.4, 0.3, 0.1]}
    assert panels["blue_asr"]["xstest"] == {"x": [0, 3], "y": [0.5, 0.25]}
    assert "jbb" not in panels["over_refusal"] and panels["over_refusal"]["xstest"]["x"] == [0, 1, 3]
    assert panels["red_asr"]["blue@3"]["y"] == [0.0, 0.2] and panels["red_od"]["OD"]["x"] == [0, 3]
    assert panels["eval_accuracy"]["accuracy"]["y"] == [0.3, 0.7]


def test_report_files(run_dir, tmp_path):
    result = CliRunner().invoke(app, ["report", str(run_dir), "--eval", str(tmp_path / "results.json"), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    rep = tmp_path / "rep"
    for png in ("training.png", "evaluation.png"):
        data = (rep / png).read_bytes()
        assert data[:8] == PNG and len(data) > 1000
    report = json.loads((rep / "report.json").read_text())
    assert report["metrics_rows"] == 18 and report["files"] == ["training.png", "evaluation.png", "summary.md", "report.json"]
    assert sum(len(s["x"]) for s in report["training"]["panels"]["reward"].values()) == 18
    md = (rep / "summary.md").read_text().splitlines()
    train = [line for line in md if line.startswith("| ") and line[2:3].isdigit()]
    assert [line.split(" | ")[0] for line in train] == ["| 1", "| 2", "| 3", "| 0", "| 1", "| 3"]  # training, then evaluation rows
    assert "| iteration | jbb ASR | xstest ASR | xstest over-refusal | red ASR vs base | red ASR vs blue@3 | red OD | eval accuracy |" in md
    assert "| 1 | 0.300 | - | 0.200 | - | - | - | - |" in md
    # every `-` is explained under its table; a table without one gets no note
    assert md.count(EVALUATION_DASH) == 1 and md.index(EVALUATION_DASH) > md.index("| 3 | 0.100 | 0.250 | 0.300 | 0.400 | 0.200 | 0.600 | 0.700 |")
    assert TRAINING_DASH not in md


def test_training_dash_is_explained(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [r for r in _rows() if not (r["iteration"] == 1 and r["phase"] == "red")]  # iteration 1 without P_red
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    make_report(run, tmp_path / "rep")
    md = (tmp_path / "rep" / "summary.md").read_text().splitlines()
    assert any(line.startswith("| 1 | - |") for line in md) and md.count(TRAINING_DASH) == 1


def test_report_without_eval_and_errors(run_dir, tmp_path):
    report = make_report(run_dir, tmp_path / "only-train")
    assert report["files"] == ["training.png", "summary.md", "report.json"] and "evaluation" not in report
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nope"), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "no metrics" in result.output
    result = CliRunner().invoke(app, ["report", str(run_dir), "--eval", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "missing.json" in result.output
    (tmp_path / "cut.json").write_text('{"run": "r", "bench')  # a results file cut short
    result = CliRunner().invoke(app, ["report", str(run_dir), "--eval", str(tmp_path / "cut.json"), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "cut.json is not a results file" in result.output and "Traceback" not in result.output


# The eval results of issue 25: red's OD is a flat line near the top, where
# `loc="best"` still drew the legend over iteration 0's point.
FLAT_OD = {"run": "r", "judge": "rules", "limit": 5, "finished": "now",
           "benchmarks": {"jbb": {"harmful": 5, "benign": 0, "iterations": {
               "0": {"asr": 1.0, "over_refusal": None}, "1": {"asr": 1.0, "over_refusal": None}}}},
           "red": {"defenders": ["base"], "iterations": {"0": {"asr": {"base": 1.0}, "od": 0.925},
                                                         "1": {"asr": {"base": 1.0}, "od": 0.930}}}}


def _drawn_figures(monkeypatch, make):
    """The figures `make()` saves, laid out as saved (they are closed after)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figures, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self), save(self, *a, **k))[1])
    make()
    for fig in figures:
        FigureCanvasAgg(fig).draw()  # closing the figure took its canvas
    return figures


@pytest.mark.parametrize("results", [FLAT_OD, RESULTS], ids=["flat-od", "several-series"])
def test_legends_cover_no_point_and_no_axes(monkeypatch, run_dir, tmp_path, results):
    (tmp_path / "r.json").write_text(json.dumps(results))
    figures = _drawn_figures(monkeypatch, lambda: make_report(run_dir, tmp_path / "rep", tmp_path / "r.json"))
    assert len(figures) == 2  # training.png, evaluation.png
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        axes = [ax for ax in fig.axes if ax.get_visible()]
        legends = [(ax, ax.get_legend().get_window_extent(renderer)) for ax in axes if ax.get_legend() is not None]
        assert legends
        for owner, box in legends:
            for ax in axes:
                assert not box.overlaps(ax.get_window_extent(renderer)), f"{owner.get_title()}: legend over {ax.get_title()}"
                assert not box.overlaps(ax.xaxis.label.get_window_extent(renderer)), owner.get_title()
                for line in ax.lines:
                    radius = line.get_markersize() * fig.dpi / 72 / 2
                    for x, y in ax.transData.transform(line.get_xydata()):
                        covered = box.x0 - radius < x < box.x1 + radius and box.y0 - radius < y < box.y1 + radius
                        assert not covered, f"{owner.get_title()}: legend covers ({x:.0f}, {y:.0f}) of {ax.get_title()}"


def test_warm_starts_get_their_own_table(tmp_path):
    """Both warm starts' rows (supervised steps before iteration 1's
    phases) are read first and last; a run without them has no such table."""
    warm = [{"iteration": 1, "phase": "eval_warmup", "step": s, "global_step": s, "ce_loss": 1.2 - 0.2 * s, "accuracy": 0.3 * s}
            for s in (1, 2, 3)]
    warm += [{"iteration": 1, "phase": "blue_warmup", "step": 1, "global_step": 4, "ce_loss": 1.9, "kept_answers": 60.0,
              "harmful_kept_share": 0.875, "benign_kept_share": 1.0},
             {"iteration": 1, "phase": "blue_warmup", "step": 2, "global_step": 5, "ce_loss": 1.1, "kept_answers": 60.0}]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in warm + _rows()))
    make_report(run, tmp_path / "rep")
    md = (tmp_path / "rep" / "summary.md").read_text().splitlines()
    at = md.index("## Warm starts (supervised, before the first iteration's phases)")
    table = md[at + 2: at + 2 + 2 + 6]
    assert "| eval_warmup | ce_loss | 1.000 | 0.600 | 3 |" in table and "| eval_warmup | accuracy | 0.300 | 0.900 | 3 |" in table
    assert "| blue_warmup | ce_loss | 1.900 | 1.100 | 2 |" in table and "| blue_warmup | harmful_kept_share | 0.875 | 0.875 | 2 |" in table
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    make_report(run, tmp_path / "rep2")
    assert not any(line.startswith("## Warm starts") for line in (tmp_path / "rep2" / "summary.md").read_text().splitlines())
