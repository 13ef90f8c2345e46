"""Sentence-embedding arithmetic shared by red's diversity index
(triplay/rewards/diversity.py) and the stock-reply check (generic.py)."""
from __future__ import annotations

import numpy as np


def unit_rows(embeddings) -> np.ndarray:
    """Rows scaled to unit norm (float64); an all-zero row stays zero."""
    e = np.asarray(embeddings, dtype=np.float64)
    if e.ndim != 2:
        raise ValueError(f"encoder must return a 2-d array (n, d), got shape {e.shape}")
    norms = np.linalg.norm(e, axis=1, keepdims=True)
    return np.divide(e, norms, out=np.zeros_like(e), where=norms > 0)
