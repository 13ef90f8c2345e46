"""What the commands that read a finished run do with a damaged run folder,
a damaged results file, or an output path that would overwrite something
they did not write: one `error:` line and exit 2, or a warning and the
rest of the work; never a traceback, never a file lost."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from lora_triplay.cli import app


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], result.output
    assert "Traceback" not in result.output


@pytest.fixture()
def run_copy(finished_run, tmp_path):
    return shutil.copytree(finished_run, tmp_path / "run")


def test_no_output_path_overwrites_what_the_command_did_not_write(run_copy, tmp_path):
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(json.dumps({"prompt": "p", "response": "I can't.", "label": "refusal"}) + "\n")
    state = (run_copy / "state.json").read_bytes()
    eval_args = ["eval", run_copy, "--eval-set", labelled, "--roles", "eval", "--iterations", "1", "--no-progress"]
    one_error_line(invoke(*eval_args, "--out", run_copy / "state.json"), "would write into state.json of the run folder")
    assert (run_copy / "state.json").read_bytes() == state
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}\n')
    one_error_line(invoke(*eval_args, "--out", notes), "exists and is not the results of an earlier `eval`")
    one_error_line(invoke(*eval_args, "--out", labelled), "exists and is not the results of an earlier `eval`")
    assert notes.read_text() == '{"mine": 1}\n' and "refusal" in labelled.read_text()
    ok = invoke(*eval_args, "--out", run_copy / "eval.json")  # beside the run's files: fine, and again over its own results
    assert ok.exit_code == 0 and invoke(*eval_args, "--out", run_copy / "eval.json").exit_code == 0, ok.output

    one_error_line(invoke("export", run_copy, "--role", "blue", "--out", run_copy / "checkpoints" / "blue" / "mine"),
                   "would write into checkpoints/ of the run folder")  # a resume prunes that folder
    one_error_line(invoke("export", run_copy, "--role", "blue", "--out", run_copy / "blue" / "iter-0005"),
                   "would write into blue/ of the run folder")

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.md").write_text("my notes\n")
    one_error_line(invoke("report", run_copy, "--out", mine), "already holds summary.md, not written by an earlier `report`")
    assert (mine / "summary.md").read_text() == "my notes\n"
    first = invoke("report", run_copy, "--out", run_copy / "report")
    assert first.exit_code == 0 and invoke("report", run_copy, "--out", run_copy / "report").exit_code == 0, first.output


def test_a_damaged_run_folder_is_one_line(run_copy, finished_run, tmp_path):
    (run_copy / "recipe.yaml").write_text("model: [unclosed\n")
    for args in (["play", run_copy, "hi"], ["report", run_copy, "--out", tmp_path / "r"]):
        one_error_line(invoke(*args), "recipe.yaml: not valid YAML at line")
    (run_copy / "recipe.yaml").write_bytes(b"iterations: 1\xff\n")
    one_error_line(invoke("play", run_copy, "hi"), "recipe.yaml: not UTF-8 text")

    shutil.copy(finished_run / "recipe.yaml", run_copy / "recipe.yaml")
    for bad in ("[]", '{"checkpoints": 5}'):
        (run_copy / "state.json").write_text(bad)
        one_error_line(invoke("export", run_copy, "--role", "blue", "--out", tmp_path / "x"), "is not a run's state")


def test_report_leaves_out_damaged_metrics_rows(run_copy, tmp_path, caplog):
    metrics = run_copy / "metrics.jsonl"
    good = len(metrics.read_text().splitlines())
    with open(metrics, "ab") as f:
        f.write(b'[1, 2]\n5\n{"global_step": "abc", "phase": "red"}\n{"iteration": "x"}\n\xff\xfe\n')
    result = invoke("report", run_copy, "--out", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r" / "report.json").read_text())["metrics_rows"] <= good
    bad_eval = tmp_path / "list.json"
    bad_eval.write_text("[1]")
    one_error_line(invoke("report", run_copy, "--eval", bad_eval, "--out", tmp_path / "r2"), "is JSON but not `eval`'s results")


def test_eval_recomputes_damaged_item_rows_and_checks_its_options(run_copy, tmp_path):
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(json.dumps({"prompt": "p", "response": "Sure, here.", "label": "safe"}) + "\n")
    args = ["eval", run_copy, "--eval-set", labelled, "--roles", "eval", "--iterations", "1", "--no-progress", "--out", tmp_path / "e.json"]
    assert invoke(*args).exit_code == 0
    items = tmp_path / "e.json.items.jsonl"
    rows = items.read_bytes()
    items.write_bytes(b"[1]\n\xff\xfe\n" + rows)
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "e.json").read_text())["work"]["reused"] == len(rows.splitlines())
    one_error_line(invoke(*args, "--device", "tpu"), "--device 'tpu': use cpu, cuda or auto")
    one_error_line(invoke(*args, "--roles", ","), "--roles: no role given")


def test_a_request_longer_than_the_base_reads_is_one_line(finished_run, tmp_path):
    """The tiny base reads 4,096 positions; a 6,000-word request ran past
    them for a minute before (a GPU would run out of memory instead)."""
    long = " ".join(["word"] * 6000)
    one_error_line(invoke("play", finished_run, long, "--max-new-tokens", "4"), "pass the base's 4096 positions")
    chat = CliRunner().invoke(app, ["chat", str(finished_run), "--max-new-tokens", "4"], input=f"{long}\nhello\n")
    assert chat.exit_code == 0 and "[error: a prompt of" in chat.output, chat.output
    assert [line for line in chat.stdout.splitlines() if line.startswith("blue: ")]  # the chat went on
