"""Where one base copy can serve the trainer and vLLM (`engine.share_base`):
the rules alone, importing nothing, so `plan` can apply them without the
engine (engine/shared_base.py does the sharing)."""
from __future__ import annotations

# HF architectures whose parameters shared_base.py maps onto vLLM's fused layout.
MAPPED = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


def why_not_share(model_cfg, engine_cfg, architectures: list[str], world: int) -> str | None:
    """None if one base copy can serve trainer and vLLM, else why not (one line)."""
    if engine_cfg.tensor_parallel_size != 1:
        return f"engine.tensor_parallel_size is {engine_cfg.tensor_parallel_size} (vLLM's shards are not the trainer's layout)"
    if model_cfg.quantization != "none":
        return f"model.quantization is {model_cfg.quantization} (the trainer's NF4 base is not vLLM's weights)"
    if model_cfg.fsdp and world > 1:
        return "model.fsdp shards the trainer's base across processes"
    if world > 1:
        return "several processes run vLLM through external_launcher, whose model is not shared here"
    unmapped = [a for a in architectures if a not in MAPPED]
    if not architectures or unmapped:
        return f"architecture {unmapped or architectures} is not mapped onto vLLM's layout (mapped: {', '.join(MAPPED)})"
    return None
