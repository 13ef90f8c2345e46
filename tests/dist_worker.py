"""One GRPO update on fixed samples, run by tests/test_distributed.py: as
1 process on the whole batch, or under `accelerate launch` with each rank
on its block of groups. Writes the updated adapter of every rank to OUT."""
from __future__ import annotations

import sys

import torch

from lora_triplay.distributed import Collective
from lora_triplay.grpo import GrpoLearner, Sample
from lora_triplay.model import (
    activate,
    adapter_parameters,
    attach_role_adapters,
    load_base,
)
from lora_triplay.recipe import GrpoConfig, LoraConfig, ModelConfig
from lora_triplay.tiny import randomize_lora_b


def main(base: str, out: str, loss_type: str) -> None:
    torch.manual_seed(0)
    collective = Collective()
    model, tok, _ = load_base(ModelConfig(base=base, device="cpu", dtype="float32"))
    model = attach_role_adapters(model, LoraConfig(rank=4, alpha=8), seed=0)
    randomize_lora_b(model, seed=1, scale=0.05)
    prompts = ["hello there", "tell me a story", "what is rain", "name a colour"]
    answers = ["yes indeed", "no", "maybe later today", "once upon a time there was", "I cannot", "sure", "blue", "red and green"]
    samples = [Sample(tok.encode(prompts[g]), tok.encode(answers[(2 * g + k) % len(answers)]), group=g, reward=0.0,
                      advantage=(1.0 if k == 0 else -1.0) * (g + 1) / 4) for g in range(4) for k in range(2)]
    groups = sorted({s.group for s in samples})
    _, mine = collective.block(groups)
    local = [s for s in samples if s.group in mine]
    params = activate(model, "red")
    learner = GrpoLearner(model, params, GrpoConfig(loss_type=loss_type, beta=0.04, max_new_tokens=8, max_tokens_per_microbatch=16),
                          lr=1e-2, pad_id=tok.pad_token_id, collective=collective)
    stats = learner.step(local)
    state = {k: v.detach().clone() for k, v in adapter_parameters(model, "red").items()}
    torch.save({"state": state, "loss": stats.loss, "grad_norm": stats.grad_norm, "tokens": stats.tokens, "world": collective.world},
               f"{out}.rank{collective.rank}")
    collective.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:4])
