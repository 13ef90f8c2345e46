"""One rule for the precision of scores (logits, attention scores, log-probs):
at least float32. bf16/fp16 models are widened; a float64 model (the
equivalence tests, where a different summation order must not show) keeps
float64 all the way, so nothing in between rounds it back to float32."""
from __future__ import annotations

import torch


def widened(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()
