"""Test-only: a deliberately wrong sharding, to prove the equivalence tests
can fail (tests/test_distributed.py puts this folder on PYTHONPATH, so every
process of a run, accelerate's children included, imports it at start-up).

LORA_TRIPLAY_WRONG_SHARD=dropped: rank 1's shard of layer 0's MLP down
projection is zeroed (a shard lost); =doubled: it is counted twice (x2).
"""
import os

MODE = os.environ.get("LORA_TRIPLAY_WRONG_SHARD")

if MODE in ("dropped", "doubled"):
    import torch

    import lora_triplay.training.sharding as sharding

    right = sharding.shard_base

    def wrong(model, mesh, device):
        counts = right(model, mesh, device)
        if mesh.get_local_rank() == 1:
            down = sharding._decoder(model).layers[0].mlp.down_proj
            weight = getattr(down, "base_layer", down).weight
            with torch.no_grad():
                weight.to_local().mul_(0.0 if MODE == "dropped" else 2.0)
        return counts

    sharding.shard_base = wrong
