"""Several processes, one run: the few collectives the trainer needs, on
torch.distributed as `accelerate launch` sets it up (gloo on CPU, NCCL on
GPU). No distribution layer of our own: accelerate's PartialState owns the
process group; this module only names what the trainer does with it.

With one process every method is a no-op that returns its input, so the
single-process code path is the same code.

How a step is split (see GrpoLearner): every rank holds the base (or its
shard of the decoder layers, sharding.py) and the three adapters, trains
on its own block of GRPO groups (a group never spans two ranks), weights
each sequence with the *global* normaliser (sample and token counts summed
over ranks), and the active adapter's gradients are
summed across ranks before clipping, so every rank takes the same optimizer
step as one process on the whole batch.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Sequence, TypeVar

import torch

T = TypeVar("T")


def leave_process_group(ok: bool) -> None:
    """Tear the process group down before the interpreter exits. Left to
    interpreter shutdown, gloo's worker threads can be destroyed while
    still joinable ("terminate called without an active exception", a
    SIGABRT after a run that had finished: seen once in CI). After a clean
    run the ranks meet at a barrier first, so none tears down while another
    still talks to it; after an error they do not wait (the launcher stops
    the others)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if launched_world_size() <= 1:
        # one process: the group is vLLM's (it starts one for its model
        # parallel state), and its engine's shutdown at exit tears it down;
        # destroyed here first, that shutdown failed with a traceback after
        # every run on the vLLM engine ("Invalid process group specified")
        return
    vllm_state = sys.modules.get("vllm.distributed.parallel_state")
    if vllm_state is not None and vllm_state.model_parallel_is_initialized():
        vllm_state.destroy_model_parallel()  # its groups before the default one they hang on
    if ok:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def launched_world_size() -> int:
    """The world size `accelerate launch` / torchrun put in the environment."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class Collective:
    def __init__(self, world: int | None = None):
        self.world = launched_world_size() if world is None else world
        self.rank = 0
        self.device = torch.device("cpu")  # where the small collectives' tensors live
        if self.world > 1:
            from accelerate import PartialState

            # cpu=True where there is no GPU: gloo (accelerate would otherwise
            # fall back to one process per rank, each thinking it is alone)
            state = PartialState(cpu=not torch.cuda.is_available())  # init_process_group from the launcher's env
            self.rank, self.world = state.process_index, state.num_processes
            if torch.distributed.get_backend() == "nccl":  # NCCL reduces GPU tensors only
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def main(self) -> bool:
        return self.rank == 0

    def block(self, items: Sequence[T], group: int = 1) -> tuple[int, list[T]]:
        """This rank's contiguous block of `items` and its offset: blocks in
        rank order concatenate back to `items` (sizes differ by at most one).
        `group` > 1: consecutive ranks in groups of that size share one block
        (a vLLM tensor-parallel group serves the same requests)."""
        n, w, r = len(items), self.world // group, self.rank // group
        start = r * (n // w) + min(r, n % w)
        size = n // w + (1 if r < n % w else 0)
        return start, list(items[start : start + size])

    def sum_tensors_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Sum tensors across ranks, in place, in one flat all-reduce."""
        if self.world == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        torch.distributed.all_reduce(flat)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def max_int(self, value: int) -> int:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()
