"""`lora-triplay plan`: parameter counts equal the real models' (built on
the meta device from the shipped configs), the memory arithmetic, and the
verdicts users see."""
from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

from lora_triplay.plan import SHIPPED, PlanError, Shape, load_shape, make_plan
from lora_triplay.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("base", ["Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "embedded:smollm2-135m"])
def test_counts_equal_the_real_model_and_peft(base):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.loads(resources.files("lora_triplay").joinpath("configs", f"{SHIPPED[base.lower()]}.json").read_text())
    with torch.device("meta"):  # shapes only, no memory
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    shape = load_shape(base)
    assert shape.params() == sum(p.numel() for p in model.parameters())
    peft = get_peft_model(model, LoraConfig(r=16, target_modules=TARGETS))
    assert shape.lora_params(16, TARGETS) == sum(p.numel() for n, p in peft.named_parameters() if "lora_" in n)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    upper = list(range(shape.layers // 2, shape.layers))  # lora.layers: the upper half
    peft = get_peft_model(model, LoraConfig(r=16, target_modules=TARGETS, layers_to_transform=upper))
    assert shape.lora_params(16, TARGETS, upper) == sum(p.numel() for n, p in peft.named_parameters() if "lora_" in n)


def test_lora_layers_beyond_the_base_are_refused_by_plan():
    recipe = load_recipe(ROOT / "recipes" / "8b.yaml", ["lora.layers=30-36"])  # Qwen3-8B: layers 0-35
    with pytest.raises(PlanError, match="this base has 36 decoder layers"):
        make_plan(recipe, gpu_memory_gb=80)
    every = make_plan(load_recipe(ROOT / "recipes" / "8b.yaml"), gpu_memory_gb=80).lora_params
    assert make_plan(load_recipe(ROOT / "recipes" / "8b.yaml", ["lora.layers=18-35"]), gpu_memory_gb=80).lora_params * 2 == every


def test_tiny_model_shape_is_read_from_its_folder(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert load_shape(tiny_model_dir).params() == sum(p.numel() for p in model.parameters())


def test_paper_recipes_fit_an_80gb_gpu_and_not_a_24gb_one():
    for size in ("4b", "8b", "14b"):
        recipe = load_recipe(ROOT / "recipes" / f"{size}.yaml")
        plan = make_plan(recipe, gpu_memory_gb=80)
        assert plan.fits, plan.refusal(size)
        assert not make_plan(recipe, gpu_memory_gb=24).fits or size == "4b"


def test_arithmetic_of_the_14b_plan():
    recipe = load_recipe(ROOT / "recipes" / "14b.yaml")
    plan = make_plan(recipe, gpu_memory_gb=80)
    items = {i.name.split(" (")[0]: i.gb for i in plan.items}
    assert items["base weights"] == pytest.approx(14_768_307_200 * 2 / 1e9)
    lora = 256_901_120
    assert items["optimizer state"] == pytest.approx(2 * lora * 4 / 1e9)
    # checkpointing: the layer inputs of 16,384 tokens plus one layer recomputed
    shape = plan.shape
    act = 16384 * (shape.layers * shape.hidden * 2 + 2 * shape.activation_bytes_per_token_layer(64, 2)) / 1e9
    assert items["activations, checkpointed"] == pytest.approx(act)
    no_ckpt = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["model.gradient_checkpointing=false"]), gpu_memory_gb=80)
    assert no_ckpt.peak("update") > plan.peak("update") + 100  # ~170 GB of activations without checkpointing
    assert not no_ckpt.fits and "gradient_checkpointing" in no_ckpt.refusal("r")
    # the paper's layout costs several times ours for the same items
    assert plan.paper["total"] > 8 * (items["base weights"] + 2)


def test_vllm_share_must_fit_beside_the_trainer():
    # The share the 14B recipe had before: 0.35 x 80 GB = 28 GB, less than vLLM's own 29.5 GB base copy.
    plan = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["engine.gpu_memory_utilization=0.35"]), gpu_memory_gb=80)
    assert not plan.fits and "raise engine.gpu_memory_utilization" in plan.refusal("r")
    assert min(item.gb for item in plan.items) >= 0  # the share below its base holds nothing; it never counts negative
    for bad in (float("inf"), float("nan")):
        with pytest.raises(PlanError, match="--gpu-memory .*: give the GPU's memory in GB"):
            make_plan(load_recipe(ROOT / "recipes" / "14b.yaml"), gpu_memory_gb=bad)
    # ...and a share larger than what the trainer leaves free cannot start
    plan = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["engine.gpu_memory_utilization=0.7", "engine.share_base=false"]), gpu_memory_gb=80)
    assert not plan.fits and "lower engine.gpu_memory_utilization to 0.54" in plan.refusal("r")
    # without sleep mode the update carries vLLM's whole share
    two = ["engine.share_base=false"]
    awake = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["engine.enable_sleep_mode=false", *two]), gpu_memory_gb=80)
    assert awake.peak("update") > make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", two), gpu_memory_gb=80).peak("update") + 30


def test_qlora_shrinks_the_base():
    r = load_recipe(ROOT / "recipes" / "14b.yaml", ["model.quantization=4bit"])
    plan = make_plan(r, gpu_memory_gb=80)
    base = next(i for i in plan.items if i.name.startswith("base weights"))
    assert 7 < base.gb < 12


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "lora_triplay.cli", "plan", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_plan_command_prints_the_table_and_a_verdict():
    ok = _cli("recipes/14b.yaml", "--gpus", "1", "--gpu-memory", "80")
    assert ok.returncode == 0, ok.stderr
    for text in ("14.77B parameters", "base weights", "activations, checkpointed", "log-prob chunk", "vLLM share",
                 "paper's layout", "verdict: fits"):
        assert text in ok.stdout
    small = _cli("recipes/14b.yaml", "--gpu-memory", "24")
    assert small.returncode == 2
    err = small.stderr.strip().splitlines()
    assert len(err) == 1 and "biggest item: base weights" in err[0] and "model.quantization=4bit" in err[0]
    assert "Traceback" not in small.stderr
    assert "a second copy of the base" not in small.stdout  # the base is shared there: no copy to speak of
    assert "less the shared base: KV cache + vLLM's overhead" in ok.stdout  # the table's 10.5 GB, beside the note's 8.5 GB of KV
    data = json.loads(_cli("recipes/smoke.yaml", "--json", "--gpu-memory", "32").stdout)
    assert data["fits"] and data["params"] == 134_515_008


def test_unplannable_config_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "weird"}))
    proc = _cli("recipes/tiny.yaml", f"model.base={tmp_path}")
    assert proc.returncode == 2 and "dense decoder" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "no DNS"])
def test_an_uncached_hub_id_without_a_hub_is_one_line_at_once(monkeypatch, offline):
    """Without this check huggingface_hub retried the download five times
    (26 s measured here) before a traceback of retries."""
    import time

    from huggingface_hub import constants

    from lora_triplay.bases import ModelError, resolve_base

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline == "HF_HUB_OFFLINE")  # conftest sets it for every test
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")  # .invalid never resolves (RFC 2606)
    t0 = time.perf_counter()
    for call in (lambda: load_shape("nobody/no-such-model-3b"), lambda: resolve_base("nobody/no-such-model-3b")):
        with pytest.raises(ModelError, match="'nobody/no-such-model-3b' is not in the local Hugging Face cache and the hub "
                                             f"cannot be reached \\({'HF_HUB_OFFLINE is set' if offline == 'HF_HUB_OFFLINE' else 'hub.invalid'}"):
            call()
    assert time.perf_counter() - t0 < 5


def test_shape_from_nested_text_config():
    cfg = {"text_config": {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                           "vocab_size": 10}}
    s = Shape.from_config(cfg, "x")
    assert s.kv_heads == 2 and s.head_dim == 4 and not s.tied


def test_fsdp_shards_the_decoder_layers_in_the_plan():
    """model.fsdp on 8 GPUs: the decoder layers count 1/8 per GPU, the
    embeddings and lm_head whole, plus two all-gathered layers; 14B on 8 x
    40 GB fits only so (the real shards are checked against this
    arithmetic in tests/test_distributed.py)."""
    shape = load_shape("Qwen/Qwen3-14B")
    args = ["engine.tensor_parallel_size=2", "engine.gpu_memory_utilization=0.5"]
    whole = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", args), gpus=8, gpu_memory_gb=40)
    sharded = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", [*args, "model.fsdp=true"]), gpus=8, gpu_memory_gb=40)
    items = {i.name: i.gb for i in sharded.items}
    layers = shape.layers * shape.block_params()
    assert items["base weights: decoder layers, sharded 8 ways (model.fsdp)"] == pytest.approx(layers * 2 / 8 / 1e9)
    assert items["base weights kept whole (embeddings, lm_head, final norm)"] == pytest.approx((shape.params() - layers) * 2 / 1e9)
    assert sharded.fits and not whole.fits
    assert sharded.peak("update") < whole.peak("update") - 20
    one = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["model.fsdp=true"]), gpus=1)
    assert any("on one it changes nothing" in n for n in one.notes)


def test_fsdp_with_4bit_is_one_line(tmp_path: Path):
    (tmp_path / "r.yaml").write_text("model: {fsdp: true, quantization: 4bit}\n")
    with pytest.raises(Exception, match="model.fsdp with model.quantization: 4bit") as err:
        load_recipe(tmp_path / "r.yaml")
    assert "\n" not in str(err.value)


def test_fsdp_on_a_torch_without_ignored_params_is_one_line(monkeypatch):
    """Checked before minutes of loading: FSDP2 with ignored_params is torch 2.7+."""
    import torch.distributed.fsdp as fsdp

    from lora_triplay.errors import UserError
    from lora_triplay.training.sharding import check_supported

    check_supported()  # this torch has it
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, *, mesh=None: module)  # an older signature
    with pytest.raises(UserError, match=r"model.fsdp needs torch >= 2.7 .*upgrade torch or drop model.fsdp"):
        check_supported()


def test_shared_base_counts_one_copy_and_shows_what_it_frees():
    two = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["engine.share_base=false"]), gpu_memory_gb=80)
    one = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml"), gpu_memory_gb=80)  # auto: Qwen3, TP 1, bf16 -> shared
    base = 14_768_307_200 * 2 / 1e9
    assert two.peak("rollouts") - one.peak("rollouts") == pytest.approx(base)
    assert one.peak("update") == pytest.approx(two.peak("update"))  # asleep either way: vLLM's weights are off the trainer's books
    note = next(n for n in one.notes if n.startswith("engine.share_base"))
    assert "29.5 GB less than two" in note and "gpu_memory_utilization up to 0.91" in note
    # what two copies could not start, one copy can: 0.7 x 80 GB beside the trainer
    assert make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["engine.gpu_memory_utilization=0.7"]), gpu_memory_gb=80).fits


def test_share_base_true_where_it_cannot_hold_is_a_plan_problem():
    plan = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["engine.share_base=true", "engine.tensor_parallel_size=2"]),
                     gpus=2, gpu_memory_gb=80)
    assert not plan.fits and "share_base=true cannot hold: engine.tensor_parallel_size is 2" in plan.refusal("r")
    auto = make_plan(load_recipe(ROOT / "recipes" / "14b.yaml", ["engine.tensor_parallel_size=2"]), gpus=2, gpu_memory_gb=80)
    assert any("two copies" in n and "tensor_parallel_size" in n for n in auto.notes)
