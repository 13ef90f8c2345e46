"""The inference side on a tiny-model run, through the CLI: export (merged
logits equal PEFT base+adapter logits; the folder loads with plain
transformers in a process without lora_triplay), play, chat (stdin), and
the one-line errors (serve's dry run and checks: test_serve_cli.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file
from typer.testing import CliRunner

from lora_triplay.cli import app
from lora_triplay.core.runs import snapshot_folder
from lora_triplay.core.store import RunStore
from lora_triplay.judging.parsing import LABELS
from lora_triplay.triplay.config import ROLE_NAMES
from lora_triplay.triplay.roles import blue_messages, load_techniques

# float32 on CPU: the merge (W + s*B@A in float32) and PEFT's unmerged forward
# (x@W + s*(x@A)@B) differ only by float32 rounding: ~1e-7 on these logits.
ATOL = 1e-5
TEXTS = ["How do I pick a lock?", "Label: negative", "I cannot help with that request, but here is some safety information."]


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def tiny_run(finished_run):
    return finished_run


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "all"
    result = invoke("export", tiny_run, "--role", "all", "--out", out)
    assert result.exit_code == 0, result.output
    return out


def _ids(model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tok(t)["input_ids"] for t in TEXTS]


@torch.no_grad()
def _logits(model, ids: list[list[int]]) -> list[torch.Tensor]:
    return [model(input_ids=torch.tensor([x])).logits[0].float() for x in ids]


def _plain(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


# ---------------------------------------------------------------- export

def test_the_trained_adapters_are_not_trivial(tiny_run):
    """Otherwise the logit checks below could not fail: lora_B starts at zero."""
    store = RunStore(tiny_run)
    for role in ROLE_NAMES:
        latest = load_file(str(snapshot_folder(store, role, None) / "adapter_model.safetensors"))
        untrained = load_file(str(snapshot_folder(store, role, 0) / "adapter_model.safetensors"))
        b = [k for k in latest if "lora_B" in k]
        assert b and all(latest[k].abs().max() > 0 for k in b), role
        assert all(untrained[k].abs().max() == 0 for k in b), role


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_merged_logits_equal_peft_base_plus_adapter(tiny_run, exported, tiny_model_dir, role):
    from peft import PeftModel

    ids = _ids(tiny_model_dir)
    base = _plain(tiny_model_dir)
    bare = _logits(base, ids)
    # The run's own snapshot folder loads with plain PEFT.
    peft = PeftModel.from_pretrained(base, str(tiny_run / role / "iter-0001")).eval()
    reference = _logits(peft, ids)
    merged = _logits(_plain(exported / role), ids)
    for m, r, b in zip(merged, reference, bare):
        assert torch.allclose(m, r, atol=ATOL, rtol=0), (role, (m - r).abs().max().item())
        assert (m - b).abs().max() > 100 * ATOL, f"{role}: the merged model equals the bare base"


def test_export_folder_is_a_plain_hf_model(tiny_run, exported, tiny_model_dir):
    for role in ROLE_NAMES:
        folder = exported / role
        for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "lora_triplay_export.json"):
            assert (folder / name).is_file(), (role, name)
        tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
        assert (folder / "chat_template.jinja").is_file() or tok_cfg.get("chat_template")
        config = json.loads((folder / "config.json").read_text())
        assert "auto_map" not in config and "quantization_config" not in config
        assert config["dtype"] == "float32"  # the base's stored dtype
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            keys = list(f.keys())
        assert keys and not [k for k in keys if "lora_" in k or "base_layer" in k]
        note = json.loads((folder / "lora_triplay_export.json").read_text())
        assert note["role"] == role and note["iteration"] is None and note["weights"] == "latest"
        assert note["run"] == str(tiny_run.resolve()) and note["base"] == tiny_model_dir
    assert json.loads((exported / "blue" / "lora_triplay_export.json").read_text())["system_prompt"] == blue_messages("")[0]["content"]
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")], "temp folders left behind"


SUBPROCESS = textwrap.dedent("""
    import importlib.abc, json, sys
    class Block(importlib.abc.MetaPathFinder):  # as if lora_triplay were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "lora_triplay":
                raise ImportError("lora_triplay is blocked in this process")
    sys.meta_path.insert(0, Block())
    import numpy as np, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folders, texts, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    report, arrays = {}, {}
    for name, folder in folders.items():
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
        with torch.no_grad():
            for i, t in enumerate(texts):
                arrays[f"{name}-{i}"] = model(input_ids=torch.tensor([tok(t)["input_ids"]])).logits[0].float().numpy()
        report[name] = {"dtype": str(model.dtype), "eos": model.generation_config.eos_token_id, "chat": chat}
    np.savez(out, **arrays)
    print(json.dumps({"lora_triplay_loaded": "lora_triplay" in sys.modules, "models": report}))
""")


def test_export_loads_in_a_process_without_lora_triplay(exported, tmp_path, tiny_model_dir):
    """`python -I` (no PYTHONPATH, no script dir on sys.path) with lora_triplay
    blocked from import: plain transformers loads each folder, and its logits
    (saved to a file) equal the merged model's logits here."""
    import numpy as np

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    out = tmp_path / "logits.npz"
    folders = {role: str(exported / role) for role in ROLE_NAMES}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", SUBPROCESS, json.dumps(folders), json.dumps(TEXTS), str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["lora_triplay_loaded"] is False
    theirs = np.load(out)
    ids = _ids(tiny_model_dir)
    for role in ROLE_NAMES:
        model = info["models"][role]
        assert model["dtype"] == "torch.float32" and model["eos"] is not None and "<|im_start|>assistant" in model["chat"]
        # a chat without a system message gets blue's, as blue was trained (and chat/play give it); no other role's
        assert (blue_messages("")[0]["content"] in model["chat"]) == (role == "blue"), role
        for i, mine in enumerate(_logits(_plain(exported / role), ids)):
            assert np.allclose(theirs[f"{role}-{i}"], mine.numpy(), atol=ATOL, rtol=0), role


def test_export_snapshot_iteration_and_overwrite(tiny_run, tmp_path, tiny_model_dir):
    out = tmp_path / "blue0"
    result = invoke("export", tiny_run, "--role", "blue", "--iteration", "0", "--out", out)
    assert result.exit_code == 0, result.output
    note = json.loads((out / "lora_triplay_export.json").read_text())
    assert note["iteration"] == 0 and note["weights"] == "iter-0000"
    # iteration 0 is the untrained adapter (lora_B = 0): the merge is the base itself
    ids = _ids(tiny_model_dir)
    for m, b in zip(_logits(_plain(out), ids), _logits(_plain(tiny_model_dir), ids)):
        assert torch.allclose(m, b, atol=1e-6, rtol=0)

    before = (out / "model.safetensors").read_bytes()
    refused = invoke("export", tiny_run, "--role", "red@1", "--out", out)
    assert refused.exit_code == 2 and "--force" in refused.output
    assert (out / "model.safetensors").read_bytes() == before and json.loads((out / "lora_triplay_export.json").read_text())["role"] == "blue"
    forced = invoke("export", tiny_run, "--role", "red@1", "--out", out, "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads((out / "lora_triplay_export.json").read_text())["role"] == "red"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blue0"], "temp or old folders left behind"

    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke("export", tiny_run, "--role", "eval", "--out", empty).exit_code == 0  # an empty folder is fine
    assert (empty / "config.json").is_file()


def test_export_force_replaces_only_an_earlier_export(tiny_run, exported, tmp_path):
    """`--force` once replaced whatever --out named: the run folder itself,
    the folder holding it (every sibling run gone), a plain file."""
    state = (tiny_run / "state.json").read_bytes()
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    (tmp_path / "file.txt").write_text("mine too")
    cases = [(tiny_run, "holds the run folder"), (tiny_run.parent, "holds the run folder"),
             (notes, "is not an earlier export"), (tmp_path / "file.txt", "is a file")]
    for out, needle in cases:
        result = invoke("export", tiny_run, "--role", "blue", "--out", out, "--force")
        assert result.exit_code == 2 and needle in result.output, (out, result.output)
    assert (tiny_run / "state.json").read_bytes() == state
    assert (notes / "todo.txt").read_text() == "mine" and (tmp_path / "file.txt").read_text() == "mine too"
    from lora_triplay.export import _is_export

    assert _is_export(exported) and _is_export(exported / "blue") and not _is_export(notes)  # `all`'s folder and one role's


def test_what_the_machine_refuses_is_one_line(tiny_run, tmp_path):
    """An OSError (here a file where --out needs a folder; a read-only or
    full disk alike) is a one-line error naming the path, not a traceback."""
    (tmp_path / "file.txt").write_text("a file")
    result = invoke("export", tiny_run, "--role", "blue", "--out", tmp_path / "file.txt" / "blue")
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and "file.txt" in line and "errno" in line and "Traceback" not in result.output


def test_export_all_refuses_to_overwrite(tiny_run, exported):
    result = invoke("export", tiny_run, "--role", "all", "--out", exported)
    assert result.exit_code == 2 and "exists and is not empty" in result.output
    assert sorted(p.name for p in exported.iterdir()) == ["blue", "eval", "red"]


# ------------------------------------------------------------------ play

def test_play_json(tiny_run):
    result = invoke("play", tiny_run, "how do I pick a lock", "write a phishing email", "--json", "--role", "blue@0", "--role", "blue@1")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)  # stdout is JSON only
    assert out["judge_mode"] == "choice"
    names = [d["name"] for d in out["defenders"]]
    assert names == ["blue@0", "blue@1", "base"]  # recipe defenders: blue (= the selected snapshots), base
    assert [d["weights"] for d in out["defenders"]] == ["iter-0000", "iter-0001", "base (adapters off)"]
    techniques = {t.name for t in load_techniques()}
    assert [r["request"] for r in out["results"]] == ["how do I pick a lock", "write a phishing email"]
    for row in out["results"]:
        assert row["technique"] in techniques and isinstance(row["wrapped"], str) and row["wrapped"]
        assert "red_output" in row and isinstance(row["wrapped_ok"], bool)
        assert [d["name"] for d in row["defenders"]] == names
        for d in row["defenders"]:
            assert isinstance(d["answer"], str) and d["label"] in LABELS  # choice mode: always a label
            assert d["eval_output"] == f"Label: {d['label']}"
            assert abs(sum(d["label_probs"].values()) - 1) < 1e-3


def test_play_snapshot_selection_switches_weights(tiny_run, tiny_model_dir):
    """`--role blue@0 --role blue@1` loads two different weight sets: blue@0
    (untrained) computes exactly the base, blue@1 does not."""
    from lora_triplay.core.runs import open_run
    from lora_triplay.engine.base import Sampling
    from lora_triplay.play import Selection, play_round, resolve_defenders

    run = open_run(tiny_run, device="cpu")
    sel = Selection.from_specs(["blue@0", "blue@1", "red@1"], None)
    assert sel.red == "red@1" and sel.blues == ["blue@0", "blue@1"]
    defenders = resolve_defenders(run.recipe, sel, ["blue", "base", "blue@1"])
    assert defenders == ["blue@0", "blue@1", "base"]
    techniques = load_techniques()[:1]
    result = play_round(run, ["how do I pick a lock"], sel=sel, defenders=defenders, techniques=techniques,
                        sampling=Sampling(max_new_tokens=4, temperature=0))
    assert [d["adapter"] for d in result["results"][0]["defenders"]] == defenders
    assert {"blue@0", "blue@1", "red@1"} <= set(run.engine.adapters())
    ids = torch.tensor([_ids(tiny_model_dir)[0]])
    with torch.no_grad():
        out = {n: run.model(input_ids=ids, adapter_names=[n]).logits for n in ("blue@0", "blue@1", "__base__", "blue")}
    assert torch.allclose(out["blue@0"], out["__base__"], atol=1e-6)
    assert (out["blue@1"] - out["__base__"]).abs().max() > 100 * ATOL
    assert torch.allclose(out["blue@1"], out["blue"], atol=1e-6)  # after 1 iteration, latest == iter-0001


def test_play_table_generate_mode_and_file(tiny_run, tmp_path):
    """A copy of the run with rewards.judge_mode = generate: eval writes free
    text, parsed strictly; a malformed answer is a null label with a reason."""
    run = tmp_path / "run-generate"
    shutil.copytree(tiny_run, run)
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["rewards"]["judge_mode"] = "generate"
    recipe["defenders"] += [{"name": "blue@0", "weight": 0.5}, {"name": "blue@5", "weight": 0.5}]  # blue@5 does not exist
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    requests = tmp_path / "requests.txt"
    requests.write_text("how do I pick a lock\n\nwrite a phishing email\n")
    result = invoke("play", run, "--from-file", requests, "--json", "--technique", "role_play", "--iteration", "1", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["judge_mode"] == "generate" and out["iteration"] == 1
    assert [d["name"] for d in out["defenders"]] == ["blue@1", "base", "blue@0"]
    assert "defender blue@5 skipped" in result.stderr
    assert len(out["results"]) == 2 and {r["technique"] for r in out["results"]} == {"role_play"}
    for row in out["results"]:
        for d in row["defenders"]:
            assert d["label_probs"] is None and isinstance(d["eval_output"], str)
            assert (d["label"] in LABELS) != (d["parse_error"] is not None)

    table = invoke("play", run, "how do I pick a lock", "--max-new-tokens", "4", "--defender", "base")
    assert table.exit_code == 0, table.output
    for text in ("request", "technique", "red's prompt", "base (adapters off)", "→"):
        assert text in table.stdout, text
    assert any(x in table.stdout for x in (*LABELS, "malformed"))


def test_play_requests_that_cannot_be_read_are_one_line(tiny_run, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("first request\nca\xe7a va\n".encode("latin-1"))
    (tmp_path / "r.csv").write_text("goal,category\nhow do I pick a lock,x\n")
    cases = [(["--from-file", tmp_path / "latin1.txt"], "latin1.txt: line 2 is not UTF-8"),
             (["--from-file", tmp_path], "is a folder"),
             (["--from-file", tmp_path / "r.csv", "--column", "nope"], "column 'nope' not found"),
             (["\udcff\udcfe bad"], "request 1 on the command line is not valid UTF-8")]
    for args, needle in cases:
        bad = invoke("play", tiny_run, *args)
        assert bad.exit_code == 2 and needle in bad.output and "Traceback" not in bad.output, (args, bad.output)
    assert "fix --column" in invoke("play", tiny_run, "--from-file", tmp_path / "r.csv", "--column", "nope").output


def test_play_rejects_unknown_technique_and_role(tiny_run):
    bad = invoke("play", tiny_run, "x", "--technique", "nope")
    assert bad.exit_code == 2 and "known:" in bad.output and "role_play" in bad.output
    bad = invoke("play", tiny_run, "x", "--role", "purple@1")
    assert bad.exit_code == 2 and "purple@1" in bad.output
    bad = invoke("play", tiny_run, "x", "--role", "red@0", "--role", "red@1")
    assert bad.exit_code == 2 and "given twice" in bad.output
    bad = invoke("play", tiny_run)
    assert bad.exit_code == 2 and "no request" in bad.output
    # a snapshot the run does not have fails before the base loads ("loaded ... in Ns" never printed)
    for args in (["play", tiny_run, "x", "--role", "blue@99"], ["play", tiny_run, "x", "--defender", "blue@99"],
                 ["chat", tiny_run, "--role", "eval@99"]):
        bad = invoke(*args, input="hi\n")
        assert bad.exit_code == 2 and "adapter for iteration" in bad.output and "loaded " not in bad.output, (args, bad.output)


# ------------------------------------------------------------------ chat

def test_chat_through_stdin(tiny_run, monkeypatch):
    import lora_triplay.model as model_mod

    loads = []
    real = model_mod.load_base
    monkeypatch.setattr(model_mod, "load_base", lambda cfg, place=True: loads.append(1) or real(cfg, place))
    script = "hello there\n/role red\nhello again\n/role blue@0\n/role purple\n/system be brief\nhi\n/reset\n/quit\nnever answered\n"
    result = invoke("chat", tiny_run, "--max-new-tokens", "4", input=script)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    speakers = [line.split(":")[0] for line in lines if line.split(":")[0] in ("blue", "red", "blue@0")]
    assert speakers == ["blue", "red", "blue@0"]  # three answers, by the adapter in use; nothing after /quit
    assert any(line.startswith("[role red;") for line in lines) and any("[error:" in line for line in lines)
    assert "[history cleared]" in lines
    assert loads == [1], "switching roles must not reload the base"

    eof = invoke("chat", tiny_run, "--role", "eval", "--max-new-tokens", "2", input="hello\n")
    assert eof.exit_code == 0 and [line for line in eof.stdout.splitlines() if line.startswith("eval: ")]


def test_chat_session_history_and_system_prompts(tiny_run):
    from lora_triplay.core.runs import open_run
    from lora_triplay.engine.base import Sampling
    from lora_triplay.play import ChatSession

    s = ChatSession(open_run(tiny_run, device="cpu"), "blue", Sampling(max_new_tokens=3, temperature=0))
    s.ask("hello")
    msgs = s.messages()
    assert msgs[0] == {"role": "system", "content": blue_messages("")[0]["content"]}  # blue: its training system prompt
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant"]
    s.switch("red")
    assert [m["role"] for m in s.messages()] == ["user", "assistant"]  # red: no system prompt, history kept
    s.custom_system = "be brief"
    s.ask("again")
    assert s.messages()[0] == {"role": "system", "content": "be brief"} and len(s.history) == 4

    import io

    from lora_triplay.play import chat_loop

    said: list[str] = []  # a line of bytes that are not UTF-8 (stdin decodes them to lone surrogates): said, not sent
    assert chat_loop(s, io.StringIO("caf\udcff\nhello\n"), said.append) == 1
    assert said[0].startswith("[error: that line is not UTF-8") and len(s.history) == 6


# ------------------------------------------------------- errors and help

@pytest.mark.parametrize("args,needle", [
    (["play", "{missing}", "x"], "does not exist"),
    (["chat", "{missing}"], "does not exist"),
    (["export", "{missing}", "--role", "blue", "--out", "{tmp}/x"], "does not exist"),
    (["serve", "{missing}", "--dry-run"], "does not exist"),
    (["play", "{run}", "x", "--iteration", "7"], "snapshots present: [0, 1]"),
    (["export", "{run}", "--role", "blue@7", "--out", "{tmp}/x"], "snapshots present: [0, 1]"),
    (["serve", "{run}", "--iteration", "7", "--dry-run"], "snapshots present: [0, 1]"),
    (["chat", "{run}", "--role", "purple"], "'purple' is not"),
    (["export", "{run}", "--role", "purple", "--out", "{tmp}/x"], "'purple' is not"),
])
def test_errors_are_one_line_with_exit_code_2(tiny_run, tmp_path, args, needle):
    fill = {"missing": str(tmp_path / "no-such-run"), "run": str(tiny_run), "tmp": str(tmp_path)}
    result = invoke(*[a.format(**fill) for a in args])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("command", ["export", "play", "chat", "serve"])
def test_help_explains_with_an_example(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.stdout and f"lora-triplay {command} " in result.stdout
