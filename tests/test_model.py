"""Base loading and adapter files: clear errors, safetensors only."""
from __future__ import annotations

import json

import pytest
import torch

from lora_triplay.bases import ModelError, resolve_base
from lora_triplay.core.store import atomic_write
from lora_triplay.model import load_adapter_weights, read_adapter_state, save_adapter


@pytest.mark.parametrize("spec,needle", [
    ("embedded:llama-7b", "not a known built-in"),
    ("./no/such/folder", "no such folder"),
    ("not a hub id at all", "not a hub id"),
])
def test_bad_base_specs_are_clear(spec, needle):
    with pytest.raises(ModelError, match=needle):
        resolve_base(spec)


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ModelError, match="config.json"):
        resolve_base(str(tmp_path))


def test_pickle_adapters_are_refused(tmp_path):
    (tmp_path / "adapter_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(ModelError, match="pickle"):
        read_adapter_state(tmp_path)


def test_a_target_module_that_names_nothing_is_refused(tiny_model_dir):
    """PEFT fails only when no target matches; one typo among good names
    would leave that projection without LoRA. Checked on the base's skeleton
    (meta device) before a new run loads any weight."""
    from lora_triplay.model import check_lora_targets
    from lora_triplay.recipe import LoraConfig, ModelConfig

    cfg = ModelConfig(base=tiny_model_dir, device="cpu", dtype="float32")
    with pytest.raises(ModelError, match="nope_proj matches no module of this base; its linear layers are .*q_proj"):
        check_lora_targets(cfg, LoraConfig(rank=4, target_modules=["q_proj", "nope_proj"]))
    check_lora_targets(cfg, LoraConfig(rank=4, target_modules=["q_proj", "v_proj"]))
    check_lora_targets(cfg, LoraConfig(rank=4))  # the defaults: every projection of a Qwen3


def test_wrong_rank_is_refused(role_model, tmp_path):
    model, _ = role_model
    save_adapter(model, "red", tmp_path, "tiny", atomic_write)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == "tiny"
    with pytest.raises(ModelError, match="rank 4 differs from lora.rank = 8"):
        read_adapter_state(tmp_path, expect_rank=8)


def test_save_then_load_into_another_slot(role_model, tmp_path):
    model, _ = role_model
    save_adapter(model, "red", tmp_path, "tiny", atomic_write)
    load_adapter_weights(model, "blue", tmp_path)
    red = {n.replace(".red.", "."): p for n, p in model.named_parameters() if ".red." in n}
    blue = {n.replace(".blue.", "."): p for n, p in model.named_parameters() if ".blue." in n}
    assert red.keys() == blue.keys() and all(torch.equal(red[k], blue[k]) for k in red)


def test_an_adapter_missing_tensors_is_refused(role_model, tmp_path):
    """A file without some of the slot's tensors (another lora.layers) would
    leave those at their initial values: refused, naming one."""
    from safetensors.torch import load_file, save_file

    model, _ = role_model
    save_adapter(model, "red", tmp_path, "tiny", atomic_write)
    state = load_file(str(tmp_path / "adapter_model.safetensors"))
    save_file({k: v for k, v in state.items() if ".layers.0." not in k}, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(ModelError, match=r"lacks \d+ of the 'blue' slot's tensors \(e.g. .*layers\.0\."):
        load_adapter_weights(model, "blue", tmp_path)


def test_loading_a_snapshot_draws_nothing_from_torch_generator(role_model, tmp_path):
    """PEFT initialises a new slot from the global generator: a resumed run
    loads its snapshots again, so the load must leave the generator as it
    was, or the resumed run samples other rollouts than the one it resumes."""
    from lora_triplay.model import add_frozen_adapter
    from lora_triplay.recipe import LoraConfig

    model, _ = role_model
    save_adapter(model, "blue", tmp_path, "tiny", atomic_write)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    add_frozen_adapter(model, "blue@1", tmp_path, LoraConfig(rank=4, alpha=8))
    assert torch.equal(torch.get_rng_state(), before)
    snap = {n.replace(".blue@1.", "."): p for n, p in model.named_parameters() if ".blue@1." in n}
    blue = {n.replace(".blue.", "."): p for n, p in model.named_parameters() if ".blue." in n}
    assert snap.keys() == blue.keys() and all(torch.equal(snap[k], blue[k]) and not snap[k].requires_grad for k in snap)


def test_adapter_from_another_base_is_refused(role_model, tmp_path):
    from safetensors.torch import load_file, save_file

    model, _ = role_model
    save_adapter(model, "red", tmp_path, "tiny", atomic_write)
    state = load_file(str(tmp_path / "adapter_model.safetensors"))
    # Same rank, other hidden size: what another base model's adapter looks like.
    save_file({k: torch.zeros(v.shape[0], v.shape[1] * 2) if "lora_A" in k else v for k, v in state.items()},
              str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(ModelError, match="another base"):
        load_adapter_weights(model, "blue", tmp_path)


@pytest.mark.parametrize("adapter", ["red", "blue", "evaluator"])
def test_saved_adapter_state_equals_peft_own(role_model, tmp_path, adapter):
    """The direct read of a plain LoRA's A/B matrices writes exactly what
    PEFT's get_peft_model_state_dict would: same keys, same tensors."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file

    from lora_triplay.model import save_adapter

    model, _ = role_model
    save_adapter(model, adapter, tmp_path, "base")
    saved = load_file(tmp_path / "adapter_model.safetensors")
    peft_state = get_peft_model_state_dict(model, adapter_name=adapter)
    assert sorted(saved) == sorted(peft_state)
    for key, value in peft_state.items():
        assert torch.equal(saved[key], value.detach().cpu()), key


def test_lora_layers_put_adapters_on_those_layers_only(tiny_model_dir, tmp_path):
    """`lora.layers`: every role's adapter sits on the chosen decoder layers
    only; a snapshot of it loads back into the same layout, and an index the
    base does not have is a clear error."""
    from lora_triplay.model import attach_role_adapters, load_base
    from lora_triplay.recipe import LoraConfig, ModelConfig

    base, _, _ = load_base(ModelConfig(base=tiny_model_dir, device="cpu", dtype="float32"))
    depth = base.config.num_hidden_layers
    assert depth >= 2
    model = attach_role_adapters(base, LoraConfig(rank=4, alpha=8, layers=f"{depth - 1}-{depth - 1}"), seed=0,
                                 names=["red", "blue"])
    carrying = {int(n.split(".layers.")[1].split(".")[0]) for n, _ in model.named_parameters() if "lora_" in n}
    assert carrying == {depth - 1}
    save_adapter(model, "red", tmp_path, "tiny", atomic_write)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["layers_to_transform"] == [depth - 1]
    with torch.no_grad():  # blue's B is zero at init: give red's something to carry over
        for n, prm in model.named_parameters():
            if ".red." in n and "lora_B" in n:
                prm.normal_()
    save_adapter(model, "red", tmp_path, "tiny", atomic_write)
    load_adapter_weights(model, "blue", tmp_path)  # same layout: fits, and blue now holds red's weights
    red = {n.replace(".red.", "."): p for n, p in model.named_parameters() if ".red." in n}
    blue = {n.replace(".blue.", "."): p for n, p in model.named_parameters() if ".blue." in n}
    assert red.keys() == blue.keys() and all(torch.equal(red[k], blue[k]) for k in red)

    base, _, _ = load_base(ModelConfig(base=tiny_model_dir, device="cpu", dtype="float32"))
    with pytest.raises(ModelError, match=f"this base has {depth} decoder layers"):
        attach_role_adapters(base, LoraConfig(rank=4, alpha=8, layers=[depth]), seed=0, names=["red"])


def test_an_every_layer_adapter_does_not_load_into_a_some_layers_slot(role_model, tiny_model_dir, tmp_path):
    from lora_triplay.model import attach_role_adapters, load_base
    from lora_triplay.recipe import LoraConfig, ModelConfig

    model, _ = role_model  # every layer
    save_adapter(model, "red", tmp_path, "tiny", atomic_write)
    base, _, _ = load_base(ModelConfig(base=tiny_model_dir, device="cpu", dtype="float32"))
    some = attach_role_adapters(base, LoraConfig(rank=4, alpha=8, layers=[0]), seed=0, names=["red"])
    with pytest.raises(ModelError, match="lora.layers"):
        load_adapter_weights(some, "red", tmp_path)
