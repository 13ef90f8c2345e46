"""Eval's pool of (prompt, response) pairs, bounded in memory and fresh.

Every defender answer of P_red and every blue answer of P_blue is a pair
eval may learn from (`eval_pairs.jsonl` keeps them all on disk). At paper
scale that is 768 pairs per red step; walking them first-in-first-out, as
v1 did, meant eval never saw a pair from after the first ~67 red steps of
iteration 1. Here the pool keeps two capped reservoirs, each a uniform
sample of its stream:

    current   the pairs of the current iteration
    older     the pairs of every earlier iteration

and P_eval labels `fresh_share` of its pairs from `current`, the rest from
`older`, never one twice. Reservoir choices depend only on (seed, pair
index), so a resume that replays `eval_pairs.jsonl` rebuilds the same pool.
"""
from __future__ import annotations

import random
from typing import Iterable


def _slot(seed: int, index: int, stream: str) -> int:
    """Where pair `index` would go in a reservoir that has seen index+1
    pairs: uniform on [0, index], reproducible."""
    return random.Random(f"{seed}:{stream}:{index}").randrange(index + 1)


class Reservoir:
    def __init__(self, cap: int, seed: int, stream: str):
        self.cap, self.seed, self.stream = cap, seed, stream
        self.items: list[dict] = []
        self.seen = 0

    def add(self, row: dict) -> None:
        if len(self.items) < self.cap:
            self.items.append(row)
        else:
            j = _slot(self.seed, self.seen, self.stream)
            if j < self.cap:
                self.items[j] = row
        self.seen += 1


class PairPool:
    def __init__(self, cap: int = 4096, seed: int = 0):
        self.cap, self.seed = cap, seed
        self.iteration = 0
        self.current = Reservoir(cap, seed, "current-0")
        self.older = Reservoir(cap, seed, "older")
        self.count = 0  # pairs ever added (= rows of eval_pairs.jsonl)
        self.labelled: set[int] = set()  # pair indices the panel has seen

    def add(self, rows: Iterable[dict]) -> None:
        """Rows in the order they are written; each gets its index `pair`."""
        for row in rows:
            it = int(row.get("iteration", 0))
            if it > self.iteration:
                for old in self.current.items:  # the iteration closed: its sample joins the older stream
                    self.older.add(old)
                self.iteration = it
                self.current = Reservoir(self.cap, self.seed, f"current-{it}")
            row.setdefault("pair", self.count)
            self.current.add(row)
            self.count += 1

    def mark_labelled(self, indices: Iterable[int]) -> None:
        self.labelled.update(indices)

    def pick(self, k: int, fresh_share: float, rng: random.Random, by_source: bool = False) -> list[dict]:
        """Up to k unlabelled pairs: round(k * fresh_share) from the current
        iteration, the rest from older ones (either side fills in for the
        other when it runs short). Uniformly, or with `by_source` one source
        after another (`spread`)."""
        fresh = [r for r in self.current.items if r["pair"] not in self.labelled]
        old = [r for r in self.older.items if r["pair"] not in self.labelled]
        want_fresh = min(len(fresh), round(k * fresh_share))
        want_old = min(len(old), k - want_fresh)
        want_fresh = min(len(fresh), k - want_old)
        draw = spread if by_source else (lambda rows, n, g: g.sample(rows, n))
        picks = draw(fresh, want_fresh, rng) + draw(old, want_old, rng)
        return sorted(picks, key=lambda r: r["pair"])

    def __len__(self) -> int:
        return len(self.current.items) + len(self.older.items)


def source(row: dict) -> tuple[str, str, str]:
    """Where a pair comes from: the phase, the defender that answered, and
    the request's kind (P_red's base answering red, P_blue's blue answering
    a benign request, ...)."""
    return str(row.get("phase")), str(row.get("defender")), str(row.get("kind", "harmful"))


def spread(rows: list[dict], k: int, rng: random.Random) -> list[dict]:
    """k of `rows` drawn one source after another (in a shuffled order),
    each source's pairs in a random order. Why: drawn uniformly, the panel's
    picks follow the pool's make-up (P_blue's 384 answers an iteration
    against the base's 64 in P_red), so once blue refuses almost every new
    label is `positive` or `rejective` and eval's `negative` class stops
    getting new examples (2-10 of ~45 labels an iteration in the fifth
    evidence run), while the base, a defender that never learns to refuse,
    keeps supplying them."""
    by: dict[tuple, list[dict]] = {}
    for row in rows:
        by.setdefault(source(row), []).append(row)
    order = sorted(by)
    rng.shuffle(order)
    for key in order:
        rng.shuffle(by[key])
    out: list[dict] = []
    while len(out) < min(k, len(rows)):
        for key in order:
            if by[key] and len(out) < k:
                out.append(by[key].pop())
    return out
