"""FSDP for a base that does not fit one GPU (`model.fsdp: true`).

torch's FSDP2 (`fully_shard`) shards each decoder layer's frozen weights
across the processes: a rank holds 1/N of them and all-gathers one layer
just before it runs (forward, and again in backward for the input
gradients). Everything else stays whole on every rank, on purpose:

- the LoRA adapters (`ignored_params`): a few MB per role, so the trainer's
  data-parallel path (gradients all-reduced in `GrpoLearner._reduce`,
  every rank's optimizer stepping alike, rank 0 saving) is unchanged, and
  so are checkpoints, snapshots and exact resume;
- embeddings, final norm and lm_head: `logprobs.LogprobComputer` reads the
  lm_head weight directly, outside any module's forward (Qwen3-14B's two
  vocabulary matrices are 3.1 GB of its 29.5 GB).

Loading: each rank reads the whole base on the CPU, cuts its chunk and
frees the rest; a node's ranks take turns (`in_turns`) so that host memory
holds the copies.

The price of sharding: every rank must run the same number of model
forwards (each one all-gathers every layer, a collective), whatever its own
share of the work. Two places make sure of it:

- the HF engine (`Lockstep`): before each forward a rank says so in a
  one-number all-reduce; a rank done with its requests keeps answering with
  a 1-token dummy forward until no rank has any left (transformers'
  `synced_gpus` does the same for `generate`);
- GRPO (`GrpoLearner`): one full-sequence forward per micro-batch, and the
  micro-batch count padded to the largest rank's with weight-0 dummies.
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import torch

from ..core.distributed import Collective
from ..errors import UserError

log = logging.getLogger(__name__)


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def _decoder(model):
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.get_decoder()


def check_supported() -> None:
    """Before minutes of loading: FSDP2 with `ignored_params` is torch 2.7+."""
    import inspect

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        fully_shard = None
    if fully_shard is None or "ignored_params" not in inspect.signature(fully_shard).parameters:
        raise UserError(f"model.fsdp needs torch >= 2.7 (FSDP2's fully_shard with ignored_params); this is torch {torch.__version__}: "
                        "upgrade torch or drop model.fsdp")


def device_mesh(world: int, device: torch.device):
    """The 1-D mesh of every process (a collective: all ranks at once)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def copies_at_once(copy_bytes: float | None, local_world: int) -> int:
    """How many processes of this node may hold a whole base on the CPU at
    once while loading: what MemAvailable allows (80% of it), at least one.
    LORA_TRIPLAY_LOAD_AT_ONCE overrides (a host whose memory is shared
    with other jobs)."""
    if os.environ.get("LORA_TRIPLAY_LOAD_AT_ONCE"):
        return max(1, int(os.environ["LORA_TRIPLAY_LOAD_AT_ONCE"]))
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        available = int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return local_world
    if not copy_bytes:
        return local_world
    return max(1, min(local_world, int(0.8 * available // copy_bytes)))


def in_turns(build, copy_bytes: float | None):
    """Run `build` (load the whole base on the CPU, then shard it) on each
    process of a node in turns, as many at a time as host memory holds:
    eight ranks loading Qwen3-32B at once would need 8 x 66 GB. Sharding
    frees a rank's whole copy before the next turn starts. The turn count
    is agreed across nodes, so every rank meets the same barriers."""
    collective = Collective()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(collective.world)))
    at_once = copies_at_once(copy_bytes, local_world)
    turns = collective.max_int(-(-local_world // at_once))
    if local == 0:
        size = f"~{copy_bytes / 1e9:.1f} GB per copy" if copy_bytes else "copy size unknown"
        log.info("model.fsdp: loading the base %d process(es) at a time on this node (%s)", at_once, size)
    built = None
    for turn in range(turns):
        if local // at_once == turn:
            built = build()
        collective.barrier()
    return built


def shard_base(model, mesh, device: torch.device) -> dict[str, int]:
    """Shard the decoder layers of `model` (a PeftModel or a plain causal
    LM, on the CPU) over `mesh` (no collective: every rank cuts its own
    chunk of the same weights), and put everything on `device`. Returns
    parameter counts for the log."""
    from torch.distributed.fsdp import fully_shard

    decoder = _decoder(model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"model.fsdp: {type(decoder).__name__} has no `layers` to shard (dense decoder models only)")
    world = mesh.size()

    def kept_whole(module) -> set[torch.nn.Parameter]:
        return {p for name, p in module.named_parameters() if "lora_" in name}

    for layer in layers:
        fully_shard(layer, mesh=mesh, ignored_params=kept_whole(layer))
    # The decoder as FSDP root: one lazy init for every layer, prefetching
    # in order; embeddings and the final norm are kept whole.
    whole = {p for name, p in decoder.named_parameters() if not name.startswith("layers.")} | kept_whole(decoder)
    fully_shard(decoder, mesh=mesh, ignored_params=whole)
    for module in model.modules():  # what FSDP left where it was loaded
        for _, p in module.named_parameters(recurse=False):
            if not _is_dtensor(p) and p.device != device:
                p.data = p.data.to(device)
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.device != device:
                module._buffers[name] = b.to(device)
    counts = {"held": 0, "full": 0}
    for p in model.parameters():
        counts["full"] += p.numel()
        counts["held"] += p.to_local().numel() if _is_dtensor(p) else p.numel()
    log.info("model.fsdp: this rank holds %.1f%% of the model's %.2fB parameters (decoder layers sharded %d ways; "
             "LoRA, embeddings and lm_head whole)", 100 * counts["held"] / counts["full"], counts["full"] / 1e9, world)
    return counts


def is_sharded(model) -> bool:
    """Whether any weight of `model` is an FSDP shard."""
    return any(_is_dtensor(p) for p in model.parameters())


class Lockstep:
    """Keep the ranks' model forwards in step (see the module docstring).

    `call()` wraps one public engine call; `turn()` precedes each forward
    inside it. Nested calls (generate asking score_choices for a forced
    choice) drain once, at the outermost exit."""

    def __init__(self, dummy_forward):
        self.dummy_forward = dummy_forward
        self.collective = Collective()
        self.depth = 0
        self.dummies = 0  # forwards run only to keep step, for reports and tests

    def _others_busy(self, busy: bool) -> bool:
        return self.collective.sum_floats([float(busy)])[0] > 0

    def turn(self) -> None:
        self._others_busy(True)

    @contextlib.contextmanager
    def call(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        # not in `finally`: after an error the other ranks cannot be met anyway
        if self.depth == 0:
            while self._others_busy(False):
                self.dummy_forward()
                self.dummies += 1
