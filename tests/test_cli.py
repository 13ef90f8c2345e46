"""The command line as a user meets it, through the real entry point
(`python -m lora_triplay`): one-line errors for command-line mistakes,
`--version`, and help text that survives rich's markdown rendering."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "lora_triplay", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_version_names_the_package_and_its_libraries():
    from lora_triplay import __version__

    proc = cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"lora-triplay {__version__} (") and "torch " in proc.stdout and "peft " in proc.stdout


@pytest.mark.parametrize("args, needle", [
    (["plan", "recipes/14b.yaml", "--gpus", "0"], "Invalid value for '--gpus'"),
    (["run"], "Missing argument 'RECIPE'"),
    (["chat", "adapters/x", "--bogus"], "No such option: --bogus"),
    (["nonsense"], "No such command 'nonsense'"),
])
def test_command_line_mistakes_are_one_line_with_exit_code_2(args, needle):
    proc = cli(*args)
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr  # no usage box, no traceback
    assert lines[0].startswith("error: ") and needle in lines[0] and "--help`" in lines[0]
    assert proc.stdout == ""


def test_run_help_shows_the_default_run_folder():
    """rich's markdown mode used to swallow `<recipe>-<time>` as an HTML tag."""
    proc = cli("run", "--help")
    assert proc.returncode == 0
    assert "<run.root>/<recipe>-<date>-<time>" in proc.stdout


def test_help_without_arguments_still_shows_the_usage():
    proc = cli("plan")
    assert proc.returncode == 2 and "Missing argument 'RECIPE'" in proc.stderr
    top = cli()
    assert "Usage: lora-triplay" in top.stdout + top.stderr and "run" in top.stdout + top.stderr


def test_the_command_line_keeps_scikit_learn_and_scipy_out_of_transformers():
    """transformers imports scikit-learn and scipy whenever they are
    installed; the command line tells it not to, before any model code
    loads. A plain process still gets transformers' own behaviour. Each is
    checked on its own: where transformers still imports it, the skip
    must keep it out."""
    load = ("import transformers.models.qwen3.modeling_qwen3, transformers.generation.candidate_generator, peft, sys; "
            "print(sorted({'sklearn', 'scipy'} & set(sys.modules)))")
    plain = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True)
    cli = subprocess.run([sys.executable, "-c", "from lora_triplay.cli import skip_unused_transformers_imports; "
                          "skip_unused_transformers_imports(); " + load], capture_output=True, text=True)
    assert plain.returncode == 0 and cli.returncode == 0, plain.stderr[-2000:] + cli.stderr[-2000:]
    imported = ast.literal_eval(plain.stdout.splitlines()[-1])
    if not imported:
        pytest.skip("this transformers imports neither scikit-learn nor scipy by itself: skip_unused_transformers_imports can go")
    assert cli.stdout.splitlines()[-1] == "[]", cli.stderr[-2000:]


@pytest.mark.parametrize("args", [["--help"], ["plan", "recipes/14b.yaml", "--gpus", "1", "--gpu-memory", "80"],
                                  ["validate", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").glob("*.yaml"))]])
def test_commands_without_a_model_never_import_torch_or_transformers(args):
    """The scikit-learn skip above imports transformers.utils (~1 s) and
    torch takes 1-2 s more: the commands that load no model pay neither
    (validate reads every game's roles, so no game module may import torch
    at its top: training/advantages.py)."""
    code = ("import atexit, sys; atexit.register(lambda: print(sorted({'torch', 'transformers'} & set(sys.modules)))); "
            f"sys.argv = ['lora-triplay', *{args!r}]; from lora_triplay.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "[]"


def test_start_bench_alternates_the_cases_and_reports_the_saving(tmp_path, monkeypatch):
    """bench/bench_cli_start.py's bookkeeping (its processes are the ones
    the tests above start): every case timed `repeats` times after an untimed
    round, in alternating order, and the saving is plain minus skipped."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import bench_cli_start

    order = []
    cost = dict(zip(bench_cli_start.CASES.values(), (6.0, 5.0, 0.2, 0.3, 0.4)))
    monkeypatch.setattr(bench_cli_start, "wall", lambda code, tree=None: order.append(code) or cost[code])
    out = tmp_path / "start.json"
    assert bench_cli_start.main(["--repeats", "2", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert len(order) == 3 * 5 and order[:5] == order[5:10][::-1]  # the warm round, then alternating
    assert all(len(t) == 2 for t in got["seconds"].values())
    assert got["saved_seconds"] == 1.0 and got["ratio_skipped_to_plain"] == round(5 / 6, 3)

    # --baseline: the no-model commands also run in another checkout, in the same alternation
    trees = []
    monkeypatch.setattr(bench_cli_start, "wall", lambda code, tree=None: trees.append(tree) or cost[code] * (2 if tree == tmp_path else 1))
    assert bench_cli_start.main(["--repeats", "2", "--baseline", str(tmp_path), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert trees.count(tmp_path) == 3 * len(bench_cli_start.NO_MODEL) and len(trees) == 3 * (5 + 3)
    assert got["baseline"]["ratio_to_baseline"] == {name: 0.5 for name in bench_cli_start.NO_MODEL}
    assert got["baseline"]["commit"] is None  # not a git checkout


def test_an_interrupt_says_how_to_go_on(tmp_path):
    """Ctrl-C on `run`: with a commit in the folder, the command that resumes
    it (the run's own flags kept); before the first commit (a new run leaves
    no folder), the command that starts it again, not a --resume that fails."""
    import shlex

    from lora_triplay.cli.train import _interrupted

    fresh = _interrupted(Path("r.yaml"), ["iterations=2"], tmp_path / "run", 2, False, True)
    assert fresh.startswith("interrupted before the run's first commit")
    assert shlex.split(fresh.split("with: ")[1]) == ["lora-triplay", "run", "r.yaml", "iterations=2", "--nproc", "2",
                                                     "--skip-plan-check", "--run-dir", str(tmp_path / "run")]
    assert "--run-dir" not in _interrupted(Path("r.yaml"), [], None, 1, False, False)  # Ctrl-C while the recipe was read
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "state.json").write_text("{}")
    again = _interrupted(Path("r.yaml"), [], tmp_path / "run", 1, True, False)
    assert shlex.split(again.split("Continue with: ")[1]) == ["lora-triplay", "run", "r.yaml", "--resume", "--run-dir",
                                                              str(tmp_path / "run"), "--allow-recipe-change"]
