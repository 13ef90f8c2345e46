"""Eval's pair pool: bounded, fresh, never labelling a pair twice, and
rebuilt exactly from the rows on disk."""
from __future__ import annotations

import random

from lora_triplay.triplay.pairs import PairPool


def _rows(iteration, n, start=0):
    return [{"prompt": f"p{start + i}", "response": "r", "iteration": iteration} for i in range(n)]


def test_reservoirs_are_capped_and_uniform_enough():
    pool = PairPool(cap=50, seed=0)
    pool.add(_rows(1, 1000))
    assert len(pool.current.items) == 50 and pool.count == 1000
    idx = sorted(r["pair"] for r in pool.current.items)
    assert idx[-1] > 500 and idx[0] < 500  # late pairs are not starved (the v1 FIFO's failure)
    pool.add(_rows(2, 10, start=1000))  # a new iteration: the old sample joins `older`
    assert pool.iteration == 2 and len(pool.current.items) == 10 and len(pool.older.items) == 50


def test_pick_takes_the_fresh_share_and_never_twice():
    pool = PairPool(cap=100, seed=0)
    pool.add(_rows(1, 40))
    pool.add(_rows(2, 40, start=40))
    rng = random.Random(0)
    picked = pool.pick(8, 0.75, rng)
    assert sum(r["iteration"] == 2 for r in picked) == 6 and sum(r["iteration"] == 1 for r in picked) == 2
    pool.mark_labelled(r["pair"] for r in picked)
    seen = {r["pair"] for r in picked}
    for _ in range(20):
        more = pool.pick(8, 0.75, rng)
        assert not seen & {r["pair"] for r in more}
        seen |= {r["pair"] for r in more}
        pool.mark_labelled(r["pair"] for r in more)
    assert len(seen) == 80  # every pair once, then nothing left
    assert pool.pick(8, 0.75, rng) == []


def test_a_short_side_is_filled_from_the_other():
    pool = PairPool(cap=100, seed=0)
    pool.add(_rows(1, 30))
    pool.add(_rows(2, 2, start=30))
    picked = pool.pick(8, 0.75, random.Random(1))
    assert len(picked) == 8 and sum(r["iteration"] == 2 for r in picked) == 2


def test_rebuild_from_disk_is_exact():
    a = PairPool(cap=16, seed=3)
    rows = _rows(1, 100) + _rows(2, 77, start=100) + _rows(3, 5, start=177)
    for chunk in range(0, len(rows), 13):  # added step by step during the run...
        a.add([dict(r) for r in rows[chunk : chunk + 13]])
    b = PairPool(cap=16, seed=3)
    b.add(dict(r) for r in rows)  # ...and replayed in one go on resume
    assert [r["pair"] for r in a.current.items] == [r["pair"] for r in b.current.items]
    assert [r["pair"] for r in a.older.items] == [r["pair"] for r in b.older.items]
    c = PairPool(cap=16, seed=4)
    c.add(dict(r) for r in rows)
    assert [r["pair"] for r in c.older.items] != [r["pair"] for r in b.older.items]  # the seed matters


def _sourced(n, phase, defender, kind, start):
    return [{"prompt": f"p{start + i}", "response": "r", "iteration": 2, "phase": phase, "defender": defender, "kind": kind}
            for i in range(n)]


def test_pick_by_source_labels_a_small_stream_as_often_as_a_large_one():
    # P_blue's blue answers 180 requests, P_red's base 12: uniformly the base
    # gets ~0.5 of 9 picks, source by source a third of them
    pool = PairPool(cap=500, seed=0)
    pool.add(_sourced(90, "blue", "blue", "benign", 0) + _sourced(90, "blue", "blue", "harmful", 90)
             + _sourced(12, "red", "base", "harmful", 180))
    rng = random.Random(0)
    uniform = [r["defender"] for _ in range(50) for r in pool.pick(9, 1.0, rng)]
    assert uniform.count("base") / len(uniform) < 0.15
    for _ in range(5):
        picked = pool.pick(9, 1.0, rng, by_source=True)
        assert sorted((r["phase"], r["kind"]) for r in picked).count(("red", "harmful")) == 3
        assert sum(r["kind"] == "benign" for r in picked) == 3
    # a source that runs out leaves the rest to the others, never a pair twice
    pool.mark_labelled(r["pair"] for r in pool.current.items if r["defender"] == "base" and r["pair"] % 2)
    picked = pool.pick(30, 1.0, rng, by_source=True)
    assert len(picked) == 30 and len({r["pair"] for r in picked}) == 30
    assert sum(r["defender"] == "base" for r in picked) == 6
