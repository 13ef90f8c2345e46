"""Recipes: every shipped file validates, paper recipes carry the paper's
numbers, overrides parse, and every error is one line naming key and fix.

Fast: no model is loaded and torch is never imported in this process.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lora_triplay.recipe import (
    Recipe,
    RecipeError,
    build_recipe,
    diff_recipes,
    load_recipe,
    load_recipe_data,
)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
PAPER = {"4b": ("Qwen/Qwen3-4B", 10), "8b": ("Qwen/Qwen3-8B", 10), "14b": ("Qwen/Qwen3-14B", 16)}
# Recipes that must also carry an `# Override:` example on their second line.
WITH_OVERRIDE_EXAMPLE = ("smoke", *PAPER)


def _recipe(name: str) -> Path:
    return ROOT / "recipes" / f"{name}.yaml"


# ----------------------------------------------------------- shipped files

def test_expected_recipes_exist():
    names = {p.stem for p in RECIPES}
    assert {"tiny", "smoke", "4b", "8b", "14b"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates_and_header_names_itself(path: Path):
    recipe = load_recipe(path)
    assert isinstance(recipe, Recipe)
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == f"# Run: lora-triplay run recipes/{path.name}", first


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_dump_round_trips(path: Path):
    recipe = load_recipe(path)
    assert build_recipe(yaml.safe_load(recipe.dump())) == recipe


@pytest.mark.parametrize("name", WITH_OVERRIDE_EXAMPLE)
def test_override_example_in_header_works(name: str):
    """Line 2 is `# Override: lora-triplay run recipes/<name>.yaml k=v ...`
    and those overrides really apply to that recipe."""
    second = _recipe(name).read_text(encoding="utf-8").splitlines()[1]
    prefix = f"# Override: lora-triplay run recipes/{name}.yaml "
    assert second.startswith(prefix), second
    overrides = shlex.split(second[len(prefix):])
    assert overrides and all("=" in o for o in overrides)
    base, changed = load_recipe(_recipe(name)), load_recipe(_recipe(name), overrides)
    changed_keys = {line.split(":")[0] for line in diff_recipes(base, changed)}
    assert changed_keys == {o.split("=")[0] for o in overrides}


def test_paper_recipes_share_one_file_and_differ_only_where_they_say():
    """4b/8b/14b extend shared/paper.yaml: resolved, they differ only in the
    base, the iteration count and vLLM's share (sized per base); each file's
    own keys win over the shared ones."""
    shared = load_recipe_data(ROOT / "recipes" / "shared" / "paper.yaml")
    resolved = {n: load_recipe(_recipe(n)) for n in PAPER}
    for name, (base, iterations) in PAPER.items():
        assert (resolved[name].model.base, resolved[name].iterations) == (base, iterations)
        assert yaml.safe_load(_recipe(name).read_text())["extends"] == "shared/paper.yaml"
    for a, b in (("4b", "8b"), ("8b", "14b")):
        keys = {d.split(":")[0] for d in diff_recipes(resolved[a], resolved[b])}
        assert keys <= {"model.base", "iterations", "engine.gpu_memory_utilization"}, keys
    assert resolved["8b"].grpo.prompts_per_step == shared["grpo"]["prompts_per_step"]


def test_extends_merges_sections_and_the_child_wins(tmp_path: Path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "parent.yaml").write_text("iterations: 3\ngrpo: {lr: 0.001, group_size: 4}\nlora: {target_modules: [q_proj, v_proj]}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base/parent.yaml\ngrpo: {lr: 0.002}\nlora: {target_modules: [o_proj]}\n")
    r = load_recipe(child, ["grpo.group_size=6"])
    assert (r.iterations, r.grpo.lr, r.grpo.group_size) == (3, 0.002, 6)  # merged per section; overrides last
    assert r.lora.target_modules == ["o_proj"]  # a list replaces, never appends
    assert "extends" not in r.dump()


@pytest.mark.parametrize("files,needle", [
    ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: a.yaml\n"}, "circle"),
    ({"a.yaml": "extends: missing.yaml\niterations: 2\n"}, "a.yaml: `extends: missing.yaml` names no recipe file"),
    ({"a.yaml": "extends: [b.yaml]\n"}, "one recipe path"),
    ({"a.yaml": ""}, "empty"),
    ({"a.yaml": "# only a comment\n"}, "copy recipes/smoke.yaml"),
    ({"a.yaml": "extends: null\n"}, "the recipe is empty"),
])
def test_bad_extends_and_empty_recipes_are_one_line(tmp_path: Path, files, needle):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "a.yaml")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_dr_grpo_removes_the_std_scaling_and_dapo_is_named_for_what_it_is():
    assert build_recipe({"grpo": {"loss_type": "dr_grpo"}}).grpo.scale_rewards == "none"
    assert build_recipe({}).grpo.scale_rewards == "group"
    with pytest.raises(RecipeError, match="Dr. GRPO removes the std scaling"):
        build_recipe({"grpo": {"loss_type": "dr_grpo", "scale_rewards": True}})
    with pytest.raises(RecipeError, match="Dr. GRPO removes the std scaling"):
        build_recipe({"grpo": {"loss_type": "dr_grpo", "scale_rewards": "batch"}})
    # the old boolean spelling still reads: true = group, false = none
    assert build_recipe({"grpo": {"scale_rewards": False}}).grpo.scale_rewards == "none"
    assert build_recipe({"grpo": {"scale_rewards": "batch"}}).grpo.scale_rewards == "batch"
    with pytest.raises(RecipeError, match="scale_rewards"):
        build_recipe({"grpo": {"scale_rewards": "token"}})
    with pytest.raises(RecipeError, match="token_mean"):
        build_recipe({"grpo": {"loss_type": "dapo"}})


def test_smoke_recipe_is_the_cpu_demo():
    r = load_recipe(_recipe("smoke"))
    assert r.model.base == "embedded:smollm2-135m"
    assert (r.model.device, r.model.dtype) == ("cpu", "float32")
    assert r.engine.backend == "hf"
    assert r.iterations == 1
    assert r.rewards.judge_mode == "choice"  # SmolLM2 cannot follow `Label:`
    assert r.rewards.embedding_model == "embedded:all-minilm-l6-v2"
    assert [(d.name, d.weight) for d in r.defenders] == [("blue", 1.0), ("base", 0.5)]
    assert (r.experts.safety_experts, r.experts.utility_experts, r.experts.rule_based) == (2, 2, True)
    rollouts = sum(getattr(r.phases, role).steps for role in ("red", "blue", "eval")) * r.grpo.prompts_per_step * r.grpo.group_size
    assert rollouts <= 100, "smoke must stay small enough for minutes on a 2-core CPU"


# --------------------------------------------------------------- overrides

def test_dotted_overrides_parse_to_the_field_types():
    r = load_recipe(
        _recipe("smoke"),
        ["phases.red.steps=3", "grpo.lr=1e-4", "lora.target_modules=[q_proj,v_proj]", "model.base=some/other"],
    )
    assert r.phases.red.steps == 3
    assert r.phases.blue.steps == load_recipe(_recipe("smoke")).phases.blue.steps  # siblings untouched
    assert isinstance(r.grpo.lr, float) and r.grpo.lr == 1e-4
    assert r.lora.target_modules == ["q_proj", "v_proj"]
    assert r.model.base == "some/other"


def test_yaml_merge_keys_still_override_and_an_unhashable_key_is_one_line(tmp_path: Path):
    """The duplicate-key check must not take YAML's `<<: *anchor` (whose keys
    this mapping may override) for a key given twice."""
    (tmp_path / "r.yaml").write_text("small: &small {rank: 4, alpha: 8}\nlora: {<<: *small, rank: 8}\niterations: 1\n")
    from lora_triplay.recipe import load_recipe_data

    assert load_recipe_data(tmp_path / "r.yaml")["lora"] == {"rank": 8, "alpha": 8}
    msg = _error(tmp_path, "? [1, 2]\n: 3\niterations: 1\n", ())
    assert "not valid YAML at line 1" in msg


def test_one_tracker_may_be_given_without_a_list():
    from lora_triplay.recipe import load_recipe as load

    assert load(ROOT / "recipes" / "tiny.yaml", ["run.report_to=tensorboard"]).run.report_to == ["tensorboard"]
    assert load(ROOT / "recipes" / "tiny.yaml", ["run.report_to=[jsonl,tensorboard]"]).run.report_to == ["jsonl", "tensorboard"]


def test_lora_layers_as_a_range_or_a_list():
    assert load_recipe(_recipe("smoke"), ["lora.layers=15-17"]).lora.layers == [15, 16, 17]
    assert load_recipe(_recipe("smoke"), ["lora.layers=[3,1]"]).lora.layers == [1, 3]
    assert load_recipe(_recipe("smoke")).lora.layers is None  # every layer


@pytest.mark.parametrize("value, needle", [("9-3", "A <= B"), ("[1,1]", "distinct"), ("[-1]", "distinct"), ("top", "A-B")])
def test_bad_lora_layers_are_clear(tmp_path, value, needle):
    msg = _error(tmp_path, f"lora: {{layers: {value}}}\n")
    assert "lora.layers" in msg and needle in msg


def test_override_creates_a_missing_section_and_wins_over_the_file():
    r = load_recipe(_recipe("tiny"), ["run.name=demo", "iterations=3", "model.enable_thinking=true"])
    assert (r.run.name, r.iterations, r.model.enable_thinking) == ("demo", 3, True)


# ------------------------------------------------------------------ errors

def _error(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg, f"error is not one line: {msg!r}"
    # a problem in the file starts with the file; a malformed override with itself
    origins = (str(path), *(f"override {o!r}" for o in overrides))
    assert msg.startswith(origins), f"error does not say where it comes from: {msg!r}"
    return msg


ERRORS = [
    # id, recipe text, overrides, substrings the one-line message must hold
    ("unknown-top-level", "iteratons: 2\n", (), ["`iteratons`", "did you mean `iterations`"]),
    ("unknown-nested", "grpo:\n  group_sise: 4\n", (), ["`grpo.group_sise`", "did you mean `grpo.group_size`"]),
    ("unknown-in-list-item", "defenders:\n  - {name: blue, wieght: 1}\n", (), ["defenders.0.wieght", "defenders.0.weight"]),
    ("unknown-no-close-match", "grpo:\n  zzzzzz: 1\n", (), ["`grpo.zzzzzz`", "valid keys here", "group_size"]),
    ("wrong-type", "iterations: two\n", (), ["`iterations`", "'two'", "integer"]),
    ("wrong-literal", "model:\n  dtype: fp16\n", (), ["`model.dtype`", "'fp16'", "'bfloat16'"]),
    ("section-as-value", "grpo: 3\n", (), ["`grpo`", "must be a section"]),
    ("group-size-range", "grpo:\n  group_size: 1\n", (), ["`grpo.group_size`", "= 1", "greater than or equal to 2"]),
    ("dropout-range", "lora:\n  dropout: 1.5\n", (), ["`lora.dropout`", "1.5", "less than 1"]),
    ("defender-bad-name", "defenders:\n  - {name: blue@x}\n", (), ["defenders.0.name", "'blue@x'", "ROLE@N", "ROLE@-N"]),
    ("defender-duplicate", "defenders:\n  - {name: blue}\n  - {name: blue}\n", (), ["defenders", "unique", "remove the repeated ['blue']"]),
    ("defenders-empty", "defenders: []\n", (), ["defenders", "at least one"]),
    ("class-values-missing", "rewards:\n  red_class_values: {negative: 1, rejective: 0}\n", (),
     ["`rewards.red_class_values`", "missing ['positive']"]),
    ("class-values-unknown", "rewards:\n  blue_class_values: {negative: -1, rejective: 0, positive: 1, neutral: 0}\n", (),
     ["`rewards.blue_class_values`", "unknown ['neutral']"]),
    ("ngram-orders", "rewards:\n  ngram_orders: [0, 3]\n", (), ["`rewards.ngram_orders`", "between 1 and 8"]),
    ("empty-panel", "experts:\n  rule_based: false\n  safety_experts: 0\n", (), ["experts", "rule_based", "safety_experts >= 1"]),
    ("bad-yaml", "grpo: [1, 2\n", (), ["not valid YAML", "line"]),
    ("top-level-list", "- iterations\n- 2\n", (), ["top level must be a mapping", "list"]),
    ("top-level-scalar", "just text\n", (), ["top level must be a mapping", "str"]),
    ("key-given-twice", "iterations: 2\nseed: 1\niterations: 3\n", (), ["key `iterations` is given twice", "lines 1 and 3"]),
    ("key-twice-in-a-section", "grpo:\n  lr: 0.1\n  lr: 0.2\n", (), ["key `lr` is given twice", "lines 2 and 3"]),
    ("empty-base", "model:\n  base: ''\n", (), ["`model.base`", "is empty"]),
    ("unknown-built-in-base", "model:\n  base: embedded:llama\n", (), ["`model.base`", "not a built-in base", "embedded:smollm2-135m"]),
    ("unknown-embedded-encoder", "rewards:\n  embedding_model: embedded:nope\n", (),
     ["`rewards.embedding_model`", "not a known embedded model", "embedded:all-minilm-l6-v2"]),
    ("override-without-equals", "iterations: 1\n", ("phases.red.steps",), ["'phases.red.steps'", "`key=value`"]),
    ("override-empty-key", "iterations: 1\n", ("=3",), ["empty key"]),
    ("override-into-a-value", "iterations: 2\n", ("iterations.red=3",), ["`iterations` is a value, not a section"]),
    ("override-unknown-key", "iterations: 1\n", ("grpo.group_sise=4",),
     ["override 'grpo.group_sise=4'", "`grpo.group_sise`", "did you mean `grpo.group_size`"]),
    ("override-bad-value", "iterations: 1\n", ("grpo.lr=fast",), ["override 'grpo.lr=fast'", "`grpo.lr`", "'fast'"]),
    ("override-bad-section", "iterations: 1\n", ("grpo=3",), ["override 'grpo=3'", "must be a section"]),
]


@pytest.mark.parametrize("text,overrides,needles", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_are_one_line_naming_key_and_fix(tmp_path: Path, text: str, overrides: tuple[str, ...], needles: list[str]):
    msg = _error(tmp_path, text, overrides)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    assert "(recipe)" not in msg and "Value error" not in msg and "instance of" not in msg


def test_each_error_names_its_origin_the_file_or_the_override(tmp_path: Path):
    """A recipe problem is the file's and an override's problem the
    override's, each on its own line (an override's was put on the file)."""
    path = tmp_path / "r.yaml"
    path.write_text("iteratons: 2\ngrpo:\n  lr: 0.1\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["grpo.lr=fast", "seed=1"])
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert sum(line.startswith(f"{path}: unknown key `iteratons`") for line in lines) == 1
    assert sum(line.startswith(f"override 'grpo.lr=fast' (on {path}): `grpo.lr` = 'fast'") for line in lines) == 1


def test_missing_recipe_file_names_the_path(tmp_path: Path):
    missing = tmp_path / "nope" / "recipe.yaml"
    with pytest.raises(RecipeError) as info:
        load_recipe(missing)
    msg = str(info.value)
    assert str(missing) in msg and "does not exist" in msg and "\n" not in msg
    with pytest.raises(RecipeError, match="is a folder; pass a recipe file"):
        load_recipe(tmp_path)


def test_several_errors_give_one_line_each(tmp_path: Path):
    path = tmp_path / "two.yaml"
    path.write_text("iteratons: 2\ngrpo:\n  group_size: 1\n", encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert any("iteratons" in line for line in lines) and any("grpo.group_size" in line for line in lines)


@pytest.mark.parametrize("name", ["blue", "base", "blue@0", "blue@12"])
def test_valid_defender_names(name: str):
    r = build_recipe({"defenders": [{"name": name, "weight": 1.0}]})
    assert r.defenders[0].name == name


# ------------------------------------------------------ diff and dump

def test_diff_recipes_lists_exactly_the_changed_keys():
    old = build_recipe({})
    new = build_recipe({"phases": {"red": {"steps": 7}}, "grpo": {"lr": 3e-5}, "defenders": [{"name": "blue"}]})
    lines = diff_recipes(old, new)
    assert {line.split(":")[0] for line in lines} == {"phases.red.steps", "grpo.lr", "defenders"}
    assert "phases.red.steps: 200 -> 7" in lines
    assert diff_recipes(old, build_recipe({})) == []


def test_default_recipe_dump_round_trips():
    default = build_recipe({})
    data = yaml.safe_load(default.dump())
    assert isinstance(data, dict) and "grpo" in data and "phases" in data  # the core's sections and TriPlay's
    assert build_recipe(data) == default


def _game(data):
    from lora_triplay.games import make_game

    return make_game(build_recipe(data))


def test_role_lr_prefers_the_phase_rate():
    game = _game({"grpo": {"lr": 1e-5}, "phases": {"eval": {"lr": 5e-5}}})
    assert (game.lr_of("red"), game.lr_of("eval")) == (1e-5, 5e-5)


# --------------------------------------------------------------------- CLI

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lora_triplay.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def test_recipe_module_does_not_import_torch():
    code = "import sys, lora_triplay.recipe, lora_triplay.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cli_validate_all_recipes():
    proc = _cli("validate", *(str(p.relative_to(ROOT)) for p in RECIPES))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ok ") == len(RECIPES)


def test_cli_validate_reports_a_bad_recipe(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("iteratons: 2\n", encoding="utf-8")
    proc = _cli("validate", "recipes/smoke.yaml", str(bad))
    assert proc.returncode == 2
    assert "ok    recipes/smoke.yaml" in proc.stdout
    assert "iteratons" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_validate_takes_overrides_as_run_does():
    proc = _cli("validate", "recipes/smoke.yaml", "iterations=0")
    assert proc.returncode == 2 and "`iterations` = 0 is invalid" in proc.stderr, proc.stderr
    assert _cli("validate", "recipes/smoke.yaml", "iterations=2", "model.base=Qwen/Qwen3-4B").returncode == 0  # "/" in a value
    proc = _cli("validate", "recipes/smoke.yaml", "grpo.lr=1e100")  # Adam overflowed at the first step
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "less than or equal to 1" in proc.stderr
    assert "not a regular file" in _cli("validate", "/dev/null").stderr  # it said "does not exist"
    assert "override 'iterations' is not `key=value`" in _cli("validate", "recipes/smoke.yaml", "iterations").stderr
    two = _cli("validate", "recipes/smoke.yaml", "iterations=x", "grpo.lr=5")  # two problems: a line each, each said as an error
    assert two.returncode == 2 and [line[:7] for line in two.stderr.splitlines()] == ["error: ", "error: "], two.stderr


@pytest.mark.parametrize(
    "text,needle",
    [("grpo:\n  group_sise: 4\n", "did you mean `grpo.group_size`"), ("iterations: two\n", "`iterations`")],
    ids=["unknown-key", "wrong-type"],
)
def test_cli_run_bad_recipe_exits_2_with_one_error_line(tmp_path: Path, text: str, needle: str):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text, encoding="utf-8")
    proc = _cli("run", str(bad), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert len(out) == 1 and out[0].startswith("error: "), out
    assert needle in out[0]
    assert not (tmp_path / "run").exists()  # failed before creating the run folder


def test_cli_run_bad_override_exits_2(tmp_path: Path):
    proc = _cli("run", "recipes/smoke.yaml", "phases.red.steps", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "key=value" in lines[0]


def test_remote_code_is_off_unless_the_recipe_asks():

    assert build_recipe({}).model.trust_remote_code is False
    for path in sorted(Path(__file__).resolve().parents[1].joinpath("recipes").glob("*.yaml")):
        assert load_recipe(path).model.trust_remote_code is False, path


# ------------------------------------------------- memory and budget keys

def test_quantization_on_cpu_is_refused_in_one_line(tmp_path: Path):
    msg = _error(tmp_path, "model: {device: cpu, quantization: 4bit}\n")
    assert "CUDA only" in msg and "model.quantization=none" in msg


def test_quantization_without_cuda_fails_at_load_in_one_line():
    from lora_triplay.bases import ModelError
    from lora_triplay.model import quantization_config
    from lora_triplay.recipe import ModelConfig

    with pytest.raises(ModelError, match="CUDA only"):
        quantization_config(ModelConfig(quantization="4bit"), torch.device("cpu"), torch.float32)


def test_attention_auto_is_sdpa_on_cpu_and_flash_needs_cuda():
    from lora_triplay.bases import ModelError
    from lora_triplay.model import pick_attention
    from lora_triplay.recipe import ModelConfig

    assert pick_attention(ModelConfig(), torch.device("cpu")) == "sdpa"
    assert pick_attention(ModelConfig(attn_implementation="eager"), torch.device("cpu")) == "eager"
    with pytest.raises(ModelError, match="flash-attn"):
        pick_attention(ModelConfig(attn_implementation="flash_attention_2"), torch.device("cpu"))


def test_one_judge_budget_with_defaults_that_fit_the_template():
    from lora_triplay.games import make_game

    r = load_recipe(_recipe("14b"))
    game = make_game(r)
    assert game.judge_budget() == r.rewards.judge_max_new_tokens == 512
    assert game.max_new_tokens_of("eval") == 512  # eval's own rollouts answer the judge template
    assert _game({"rewards": {"judge_mode": "generate"}}).judge_budget() == 256  # the template's brief reasoning before `Label:`
    assert _game({"rewards": {"judge_mode": "generate"}, "model": {"enable_thinking": True}}).judge_budget() == 1024
    with pytest.raises(RecipeError, match="rewards.judge_max_new_tokens"):
        build_recipe({"phases": {"eval": {"max_new_tokens": 64}}})


def test_per_phase_sampling_falls_back_to_grpo():
    r = _game({"grpo": {"max_new_tokens": 100, "group_size": 4, "temperature": 0.9},
               "phases": {"red": {"max_new_tokens": 30, "group_size": 8}, "blue": {"temperature": 0.7}},
               "rewards": {"judge_max_new_tokens": 16}})
    assert (r.max_new_tokens_of("red"), r.max_new_tokens_of("blue")) == (30, 100)
    assert (r.group_size_of("red"), r.group_size_of("blue")) == (8, 4)
    assert (r.temperature_of("red"), r.temperature_of("blue")) == (0.9, 0.7)
    assert r.longest_completion() == 100
