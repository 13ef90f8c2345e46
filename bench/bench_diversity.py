"""Diversity penalty against the attack success pool (ASP): 256 candidates
scored against pools of 1k, 10k and 50k prompts, indexes vs naive Self-BLEU.

    python bench/bench_diversity.py            # pools 1k, 10k, 50k (~3 min, 1 thread)
    python bench/bench_diversity.py --quick    # pools 1k, 5k

Texts: synthetic wrapped prompts, deterministic (--seed): sentences of the
builtin techniques' demo prompts around a builtin basic request (sometimes a
benign one too), then ~10% of the words swapped for random words of the same
corpus, so that no two texts are alike but the n-gram overlap stays high.

Per pool size, on ONE growing rewards.diversity.AttackSuccessPool:
  add_s               AttackSuccessPool.add of the whole pool (SelfBleuIndex.add
                      + EmbeddingPool running sum), embeddings precomputed:
                      pool vectors are random unit vectors of the encoder's
                      size (what add and score cost depends on the size only)
  embed_pool_s_est    what embedding the pool costs at add time: per-text
                      encoder time x pool size (EXTRAPOLATED)
  bleu_score_s        SelfBleuIndex.score of the 256 candidates (median of 3)
  cos_score_s         EmbeddingPool.score_embeddings of the 256 candidates'
                      unit embeddings (pool lookup only; median of 5)
  embed_candidates_s  EmbeddingPool.embed of the 256 candidates (the encoder,
                      MiniLM if it loads; does not depend on the pool)
  asp_score_s         AttackSuccessPool.score(256): what the loop calls
                      (embed + cosine + Self-BLEU)
  naive_bleu_s_est    Texygen/NLTK Self-BLEU, nltk sentence_bleu(pool as
                      references, candidate) per order n in (3,4,5): timed on
                      a subsample (--naive-refs references x --naive-cands
                      candidates) and scaled linearly to 256 x pool size
                      (EXTRAPOLATED; nltk walks every reference per call)
embed_one_at_a_time_s (once): the 256 candidates through the encoder one
text per forward (what it did before it batched texts of equal token
length; `encoder_batching`: the groups, the CPU time both ways and whether
the embeddings are bit-identical, which resume exactness needs).
agree_max_abs_diff: SelfBleuIndex.score vs that NLTK computation on the
subsample plus edge cases (empty, 1-word, a verbatim pool text).
growth_exponent_* = log(t2/t1) / log(n2/n1), first to last size (per step too).
Prints a table and writes bench/results/diversity.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from results_io import median_time, save_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lora_triplay.triplay.rewards.diversity import (  # noqa: E402 (needs the sys.path set-up above)
    DEFAULT_ORDERS,
    AttackSuccessPool,
    HashingEncoder,
    SelfBleuIndex,
    SentenceEncoder,
    load_sentence_encoder,
    tokenize,
)
from lora_triplay.triplay.roles import load_basic_prompts, load_techniques  # noqa: E402 (needs the sys.path set-up above)

CANDIDATES = 256



# ------------------------------------------------------------------ texts
def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


class TextMaker:
    """Deterministic synthetic red prompts (technique frame + basic request)."""

    def __init__(self, seed: int, swap: float = 0.1):
        self.rng = random.Random(seed)
        self.swap = swap
        self.frames = [_sentences(t.demo_wrapped) for t in load_techniques(None)]
        self.basics = [b.prompt for b in load_basic_prompts(None, None, None)]
        rows = (ROOT / "lora_triplay" / "triplay" / "prompts" / "benign_prompts.jsonl").read_text().splitlines()
        self.benign = [json.loads(r)["prompt"] for r in rows if r.strip()]
        words = " ".join([s for f in self.frames for s in f] + self.basics + self.benign).split()
        self.vocab = sorted(set(words))

    def one(self) -> str:
        r = self.rng
        frame = r.choice(self.frames)
        cut = r.randint(1, max(1, len(frame) - 1))
        basic = r.choice(self.basics)
        ask = r.choice([basic, f'"{basic}"', f"Now: {basic[0].lower()}{basic[1:]}", f"The question is this. {basic}"])
        parts = frame[:cut] + [ask] + frame[cut:][: r.randint(0, 1)]
        if r.random() < 0.2:
            parts.insert(r.randint(0, len(parts)), r.choice(self.benign))
        words = " ".join(parts).split()
        return " ".join(r.choice(self.vocab) if r.random() < self.swap else w for w in words)

    def many(self, n: int) -> list[str]:
        return [self.one() for _ in range(n)]


# ---------------------------------------------------------------- helpers
def exponent(t1: float, t2: float, n1: int, n2: int) -> float:
    return math.log(t2 / t1) / math.log(n2 / n1)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def encoder_or_hashing(spec: str):
    try:
        return load_sentence_encoder(spec), spec
    except Exception as exc:  # noqa: BLE001 - any load failure: the model-free encoder
        print(f"encoder {spec!r} did not load ({exc}); using HashingEncoder", file=sys.stderr)
        return HashingEncoder(), "hashing"


# ------------------------------------------------------------------ naive
def nltk_self_bleu(refs: list[list[str]], hyp: list[str], orders=DEFAULT_ORDERS) -> float:
    """Texygen's Self-BLEU of one candidate: mean over orders of NLTK
    sentence_bleu(all references, hypothesis, uniform weights, method1)."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    smooth = SmoothingFunction().method1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sum(sentence_bleu(refs, hyp, weights=(1 / n,) * n, smoothing_function=smooth) for n in orders) / len(orders)


def naive_and_agreement(pool: list[str], cands: list[str], n_refs: int, n_cands: int) -> dict:
    """Time NLTK on n_refs references x n_cands candidates; compare with the
    index built on the same references (plus edge-case candidates)."""
    refs = pool[:n_refs]
    ref_tokens = [tokenize(t) for t in refs]
    hyps = cands[:n_cands]
    t0 = time.perf_counter()
    naive = [nltk_self_bleu(ref_tokens, tokenize(h)) for h in hyps]
    per_pair = (time.perf_counter() - t0) / (n_refs * n_cands)
    index = SelfBleuIndex()
    for t in refs:
        index.add(t)
    edge = ["", "How?", refs[0], refs[1].split(".")[0]]
    naive += [nltk_self_bleu(ref_tokens, tokenize(h)) for h in edge]
    ours = [index.score(h) for h in hyps + edge]
    return {"naive_refs": n_refs, "naive_cands": n_cands, "naive_s_per_pair": per_pair,
            "agree_cases": len(ours), "agree_max_abs_diff": max(abs(a - b) for a, b in zip(ours, naive))}


# -------------------------------------------------------------- measuring
def grow_and_score(asp: AttackSuccessPool, texts: list[str], vecs: np.ndarray, cands: list[str]) -> dict:
    """Add `texts` (embeddings given), then time the 256-candidate paths."""
    asp._cache = dict(zip(texts, vecs))  # add() takes cached embeddings, as after score()
    t0 = time.perf_counter()
    asp.add(texts)
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    unit = asp.embeddings.embed(cands)
    embed_s = time.perf_counter() - t0
    bleu_s = median_time(lambda: [asp.bleu.score(c) for c in cands], 3)
    cos_s = median_time(lambda: asp.embeddings.score_embeddings(unit), 5)
    t0 = time.perf_counter()
    asp.score(cands)
    asp_s = time.perf_counter() - t0
    return {"add_s": add_s, "bleu_score_s": bleu_s, "cos_score_s": cos_s,
            "embed_candidates_s": embed_s, "asp_score_s": asp_s}


def run(sizes: list[int], seed: int, spec: str, n_refs: int, n_cands: int) -> dict:
    t0 = time.perf_counter()
    maker = TextMaker(seed)
    pool, cands = maker.many(max(sizes)), TextMaker(seed + 1).many(CANDIDATES)
    gen_s = time.perf_counter() - t0
    encoder, used = encoder_or_hashing(spec)
    dim = encoder(["warm-up"]).shape[1]
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((len(pool), dim))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    naive = naive_and_agreement(pool, cands, n_refs, n_cands)
    asp, rows, done, add_total = AttackSuccessPool(encoder), [], 0, 0.0
    for size in sizes:
        r = grow_and_score(asp, pool[done:size], vecs[done:size], cands)
        add_total += r["add_s"]
        done = size
        r.update(pool=size, add_s=add_total, peak_rss_mb=rss_mb(),
                 embed_pool_s_est=r["embed_candidates_s"] / CANDIDATES * size,
                 naive_bleu_s_est=naive["naive_s_per_pair"] * CANDIDATES * size,
                 bleu_index_grams=sum(len(t) for t in asp.bleu._max))
        rows.append(r)
    res = {"encoder": used, "embedding_dim": int(dim), "candidates": CANDIDATES, "seed": seed,
           "encoder_batching": encoder_batching(encoder, cands),
           "orders": list(DEFAULT_ORDERS), "text_gen_s": gen_s,
           "mean_tokens_per_text": statistics.mean(len(tokenize(t)) for t in pool[:2000]),
           "sizes": rows, **naive}
    for key, field in (("bleu", "bleu_score_s"), ("cos", "cos_score_s"), ("asp", "asp_score_s")):
        a, b = rows[0], rows[-1]
        res[f"growth_exponent_{key}"] = exponent(a[field], b[field], a["pool"], b["pool"])
        res[f"growth_exponents_{key}_steps"] = [
            exponent(x[field], y[field], x["pool"], y["pool"]) for x, y in itertools.pairwise(rows)]
    return res


def encoder_batching(encoder, cands: list[str]) -> dict | None:
    """Length-grouped batches vs one text per forward on the same
    candidates (a SentenceEncoder only): time, CPU time, bit-identity."""
    if not isinstance(encoder, SentenceEncoder):
        return None
    out: dict = {"groups": len(set(encoder.lengths(cands)))}
    embeddings = {}
    encoders = {"one_at_a_time": SentenceEncoder(encoder.model, batch_size=1),
                "length_batched": SentenceEncoder(encoder.model, batch_size=64)}
    for name, enc in encoders.items():
        t0, c0 = time.perf_counter(), time.process_time()
        embeddings[name] = enc(cands)
        out[f"{name}_s"], out[f"{name}_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    out["bit_identical"] = bool(np.array_equal(embeddings["one_at_a_time"], embeddings["length_batched"]))
    return out


def show(res: dict) -> None:
    print(f"\n{res['candidates']} candidates, encoder {res['encoder']} (dim {res['embedding_dim']}), "
          f"~{res['mean_tokens_per_text']:.0f} tokens/text; est = extrapolated")
    head = ("pool", "add_s", "bleu_s", "cos_s", "embed256_s", "asp_score_s", "embed_pool_est", "naive_bleu_est", "peak_RSS_MB")
    print(" ".join(f"{h:>14}" for h in head))
    for r in res["sizes"]:
        vals = (r["pool"], r["add_s"], r["bleu_score_s"], r["cos_score_s"], r["embed_candidates_s"],
                r["asp_score_s"], r["embed_pool_s_est"], r["naive_bleu_s_est"], r["peak_rss_mb"])
        print(f"{vals[0]:>14d} " + " ".join(f"{v:>14.4g}" for v in vals[1:]))
    print("growth exponents (first->last; steps): " + "; ".join(
        f"{k} {res[f'growth_exponent_{k}']:.2f} {[round(x, 2) for x in res[f'growth_exponents_{k}_steps']]}"
        for k in ("bleu", "cos", "asp")))
    b = res.get("encoder_batching")
    if b:
        print(f"encoder on the {res['candidates']} candidates: one at a time {b['one_at_a_time_s']:.2f} s "
              f"({b['one_at_a_time_cpu_s']:.2f} CPU), batched by token length ({b['groups']} groups) "
              f"{b['length_batched_s']:.2f} s ({b['length_batched_cpu_s']:.2f} CPU), bit-identical: {b['bit_identical']}")
    print(f"naive NLTK: {res['naive_s_per_pair'] * 1e6:.1f} us per (candidate, reference) pair, timed on "
          f"{res['naive_cands']} x {res['naive_refs']}; index vs NLTK on {res['agree_cases']} candidates: "
          f"max |diff| = {res['agree_max_abs_diff']:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="pool sizes (default 1000 10000 50000)")
    ap.add_argument("--quick", action="store_true", help="pools 1000 and 5000, smaller naive subsample")
    ap.add_argument("--encoder", default="embedded:all-minilm-l6-v2")
    ap.add_argument("--naive-refs", type=int, default=None, help="references in the naive subsample (default 1000)")
    ap.add_argument("--naive-cands", type=int, default=None, help="candidates in the naive subsample (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "diversity.json"))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    sizes = sorted(args.sizes or ([1000, 5000] if args.quick else [1000, 10000, 50000]))
    n_refs = args.naive_refs or (300 if args.quick else 1000)
    n_cands = args.naive_cands or (4 if args.quick else 8)
    t0 = time.perf_counter()
    res = run(sizes, args.seed, args.encoder, min(n_refs, sizes[0]), n_cands)
    res["total_s"] = time.perf_counter() - t0
    show(res)
    save_results(args.out, res, f" (total {res['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
