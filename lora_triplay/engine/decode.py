"""The HF engine's sampling loop after prefill, and its sampler.

A sampled token is drawn by inverse CDF: one uniform number per row and
step, the first token whose cumulative probability passes it. That is the
distribution `torch.multinomial(probs, 1)` draws from, but multinomial
draws one exponential per vocabulary entry: 2.5 s of a 14.8 s rollout of 64
rows x 40 tokens at SmolLM2's 49,152 (aten::exponential_, torch.profiler,
2 threads; bench/bench_sampler.py). The cumulative sums run in float64, so
their rounding (~V x 1e-16) moves no token's probability measurably; in
float32 it could move one by up to ~V x 6e-8 = 3e-3.
"""
from __future__ import annotations

import torch

from ..training.precision import widened
from .base import Sampling

# Tokens per block of the two-level search below.
BLOCK = 256


def sample_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` (rows x vocabulary, zeros allowed, each
    row's total > 0, not necessarily 1) from `uniforms` (one number in
    [0, 1) per row): the first token whose cumulative probability exceeds
    u x the row's total.

    In two levels, so no rows x vocabulary float64 cumulative sum is made
    (25 MB a step at 64 rows of 49,152, faulted in afresh each time: 12-16
    ms against ~1 ms): the blocks' sums in float64 find the block the target
    falls in, then the cumulative sum inside that block alone finds the
    token. (`sum(dtype=float64)` still copies the rows into float64 first;
    float32 block sums instead timed the same inside a rollout, x0.999,
    bench/BENCHMARKS.md "Cascade attention".) A token of probability 0 is
    never drawn: its cumulative value equals its predecessor's, so it is
    never the first to exceed the target, and where the two levels' sums
    round apart by the last bit the draw stays on the block's last token of
    probability > 0."""
    rows, vocab = probs.shape
    full = vocab // BLOCK
    sums = probs[:, : full * BLOCK].reshape(rows, full, BLOCK).sum(-1, dtype=torch.float64)
    if vocab > full * BLOCK:
        sums = torch.cat([sums, probs[:, full * BLOCK:].sum(-1, keepdim=True, dtype=torch.float64)], 1)
    block_cdf = sums.cumsum(-1)
    total = block_cdf[:, -1:]
    # u x total can round up to total itself when u is within 2^-53 of 1;
    # kept below it, some block's cumulative value always exceeds the target
    target = torch.minimum(uniforms.to(block_cdf).unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(block_cdf, target, right=True)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target))
    offsets = torch.arange(BLOCK, device=probs.device)
    index = block * BLOCK + offsets
    inside = probs.gather(1, index.clamp(max=vocab - 1)) * (index < vocab)
    token = torch.searchsorted(before + inside.to(torch.float64).cumsum(-1), target, right=True)
    last_positive = torch.where(inside > 0, offsets, -1).amax(-1, keepdim=True)
    return (block * BLOCK + torch.minimum(token, last_positive)).squeeze(-1)


class Decode:
    """The sampling loop after prefill: one token per step for every live
    row, the same processors as transformers (repetition penalty,
    temperature, top-p; greedy = argmax of the raw logits), the raw
    (pre-temperature) log-prob of each sampled token, as vLLM reports it."""

    # Compact the batch (drop finished rows from the cache) once this share
    # of the live rows is done: each compaction copies the cache.
    COMPACT_SHARE = 0.125

    def __init__(self, sampling: Sampling, eos_ids: list[int], rows: int, device, seen_ids=None, seeds=None):
        self.s, self.rows, self.device = sampling, rows, device
        self.eos = torch.tensor(eos_ids, device=device)
        # Each row's uniforms for every step, drawn up front from its own
        # generator (see HFEngine.generate): a row samples the same tokens
        # however the batch around it is made up or compacted. None: each
        # step draws from torch's global RNG.
        self.uniforms = None
        if seeds and not sampling.greedy:
            self.uniforms = torch.stack([
                torch.rand(sampling.max_new_tokens, generator=torch.Generator(device=device).manual_seed(x),
                           dtype=torch.float64, device=device)
                for x in seeds
            ])
        # Repetition penalty (transformers' rule) applies to every token seen
        # so far in the row, prompt included.
        self.seen: list[list[int]] | None = None
        if sampling.repetition_penalty != 1.0 and seen_ids is not None:
            ids, mask = seen_ids
            self.seen = [ids[i][mask[i].bool()].tolist() for i in range(ids.shape[0])]

    def _pick(self, logits: torch.Tensor, live: torch.Tensor, step: int) -> torch.Tensor:
        s = self.s
        if s.greedy and s.repetition_penalty == 1.0:
            return logits.argmax(-1)
        scores = logits
        if s.repetition_penalty != 1.0:
            scores = scores.clone()
            for r, row in enumerate(live.tolist()):
                idx = self.seen[row]
                vals = scores[r, idx]
                scores[r, idx] = torch.where(vals < 0, vals * s.repetition_penalty, vals / s.repetition_penalty)
        if s.greedy:
            return scores.argmax(-1)
        if s.temperature != 1.0:
            scores = scores / s.temperature
        if s.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=False)
            cum = sorted_scores.softmax(-1).cumsum(-1)
            drop = cum <= (1 - s.top_p)
            drop[:, -1] = False  # keep at least the most likely token
            scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        probs = torch.softmax(scores, -1)
        if self.uniforms is None:
            uniforms = torch.rand(len(live), dtype=torch.float64, device=probs.device)
        else:
            uniforms = self.uniforms[live, step]
        return sample_inverse_cdf(probs, uniforms)

    def run(self, forward, cache, mask, next_pos, logits, names, pad_id):
        """`forward(names, **model_kwargs)` runs the model with row i on
        adapter names[i]."""
        T, B, dev = self.s.max_new_tokens, self.rows, self.device
        tokens = torch.full((B, T), pad_id, dtype=torch.long)
        logps = torch.zeros((B, T), dtype=torch.float32)
        lengths = torch.zeros(B, dtype=torch.long)
        finished = torch.zeros(B, dtype=torch.bool)
        live = torch.arange(B, device=dev)  # batch position -> row
        done_in_batch = torch.zeros(B, dtype=torch.bool, device=dev)
        for t in range(T):
            logits = widened(logits)
            tok = self._pick(logits, live, t)
            lp = torch.log_softmax(logits, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
            rows_now = live[~done_in_batch]
            tok_now, lp_now = tok[~done_in_batch], lp[~done_in_batch]
            tokens[rows_now.cpu(), t] = tok_now.cpu()
            logps[rows_now.cpu(), t] = lp_now.cpu().to(logps.dtype)
            lengths[rows_now.cpu()] = t + 1
            ended = torch.isin(tok, self.eos) & ~done_in_batch
            finished[live[ended].cpu()] = True
            done_in_batch |= ended
            if self.seen is not None:
                for r, row in enumerate(live.tolist()):
                    self.seen[row].append(int(tok[r]))
            if bool(done_in_batch.all()) or t == T - 1:
                break
            if int(done_in_batch.sum()) >= max(1, int(self.COMPACT_SHARE * len(live))):
                keep = (~done_in_batch).nonzero(as_tuple=True)[0]
                cache.batch_select_indices(keep)
                live, mask, next_pos, tok = live[keep], mask[keep], next_pos[keep], tok[keep]
                names = [names[i] for i in keep.tolist()]
                done_in_batch = done_in_batch[keep]
            tok = torch.where(done_in_batch, torch.full_like(tok, pad_id), tok)
            mask = torch.cat([mask, (~done_in_batch).long().unsqueeze(-1)], dim=1)
            out = forward(names, input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=next_pos.unsqueeze(-1),
                          past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        return tokens, logps, lengths, finished
