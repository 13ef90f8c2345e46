"""One GRPO update on fixed samples, run by tests/test_distributed.py: as
1 process on the whole batch, or under `accelerate launch` with each rank
on its block of groups. Writes the updated adapter of every rank to
OUT.<loss type>.rank<r>, one update per loss type named (comma-separated),
each from the same adapter.

`fsdp`: the base's decoder layers are sharded across the ranks
(sharding.py), and the worker also generates and scores through the
engine; the ranks get unequal work (3 and 2 groups, 3 and 2 one-row
batches), so both lockstep paths must fill in dummy forwards."""
from __future__ import annotations

import sys

import torch

from lora_triplay.core.distributed import Collective
from lora_triplay.engine.base import Request, Sampling
from lora_triplay.engine.hf import HFEngine
from lora_triplay.engine.sharded import ShardedEngine
from lora_triplay.model import (
    activate,
    adapter_parameters,
    load_role_model,
)
from lora_triplay.recipe import GrpoConfig, LoraConfig, ModelConfig
from lora_triplay.tiny import randomize_lora_b
from lora_triplay.training.grpo import GrpoLearner, Sample
from lora_triplay.training.sharding import is_sharded
from lora_triplay.triplay.roles import ROLE_ADAPTERS


def engine_calls(model, tok, collective) -> dict:
    engine = HFEngine(model, tok, max_batch_size=1, lora=LoraConfig(rank=4, alpha=8))
    served = ShardedEngine(engine, collective) if collective.world > 1 else engine
    asks = ["hello there", "tell me a story", "what is rain", "name a colour", "say something"]
    reqs = [Request(["red", "blue", "evaluator", "base", "blue"][i], [{"role": "user", "content": a}]) for i, a in enumerate(asks)]
    comps = served.generate(reqs, Sampling(max_new_tokens=6, temperature=0.0))
    choices = [Request("evaluator", [{"role": "user", "content": a}], choices=("Label: negative", "Label: positive")) for a in asks[:3]]
    return {"generated": [c[0].token_ids for c in comps], "scores": served.score_choices(choices),
            "engine_dummies": engine.lockstep.dummies if engine.lockstep else 0}


def main(base: str, out: str, loss_types: str, mode: str = "ddp") -> None:
    torch.manual_seed(0)
    collective = Collective()
    # float64: a different summation order must not show (tests/test_distributed.py, ATOL)
    model, tok, _ = load_role_model(ModelConfig(base=base, device="cpu", dtype="float64", fsdp=mode == "fsdp"),
                                    LoraConfig(rank=4, alpha=8), 0, list(ROLE_ADAPTERS.values()), collective.world)
    randomize_lora_b(model, seed=1, scale=0.05)
    model.eval()
    result = engine_calls(model, tok, collective) if mode == "fsdp" else {}
    base = [p for n, p in model.named_parameters() if "lora_" not in n]  # what this rank holds of the base
    result["base_sharded"] = sum(p.to_local().numel() for p in base if type(p).__name__ == "DTensor")
    result["base_whole"] = sum(p.numel() for p in base if type(p).__name__ != "DTensor")
    prompts = ["hello there", "tell me a story", "what is rain", "name a colour", "why is the sky blue"]
    answers = ["yes indeed", "no", "maybe later today", "once upon a time there was", "I cannot", "sure", "blue", "red and green"]
    samples = [Sample(tok.encode(prompts[g]), tok.encode(answers[(2 * g + k) % len(answers)]), group=g, reward=0.0,
                      advantage=(1.0 if k == 0 else -1.0) * (g + 1) / 4) for g in range(len(prompts)) for k in range(2)]
    groups = sorted({s.group for s in samples})
    _, mine = collective.block(groups)
    local = [s for s in samples if s.group in mine]
    params = activate(model, "red")
    adapter = adapter_parameters(model, "red")
    start = {k: v.detach().clone() for k, v in adapter.items()}
    for loss_type in loss_types.split(","):  # each loss type's step from the same adapter (one launch for several)
        with torch.no_grad():
            for k, v in adapter.items():
                v.copy_(start[k])
                v.grad = None
        begin = {k: v.detach().clone() for k, v in adapter.items()}  # what this step starts from
        learner = GrpoLearner(model, params, GrpoConfig(loss_type=loss_type, beta=0.04, max_new_tokens=8, max_tokens_per_microbatch=16),
                              lr=1e-2, pad_id=tok.pad_token_id, collective=collective)
        stats = learner.step(local)
        state = {k: v.detach().clone() for k, v in adapter.items()}
        torch.save({"state": state, "start": begin, "loss": stats.loss, "grad_norm": stats.grad_norm, "tokens": stats.tokens,
                    "world": collective.world, "kl": stats.kl, "entropy": stats.entropy, "clip_fraction": stats.clip_fraction,
                    "microbatches": stats.extra["microbatches"], "grpo_dummies": learner.lockstep_dummies,
                    "sharded": is_sharded(model), **result},
                   f"{out}.{loss_type}.rank{collective.rank}")
    collective.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:5])
