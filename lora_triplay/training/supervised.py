"""Supervised learning of a forced choice: cross-entropy over a label set.

A judge in choice mode answers with the label string whose sequence
log-probability (label tokens + EOS) is highest. Its supervised objective is
that same quantity: the softmax of the sequence log-probs over the label set,
and the cross-entropy with the gold label (with optional label smoothing).
An example with a single choice (a judge that writes its answer, a role's
warm-start answer) is plain teacher forcing: the mean token NLL of its one
line; one batch may hold both kinds. An example whose gold is NONE (-1) is
unlikelihood: -log(1 - P(any of its choices)), for an answer that must *not*
be given (blue's refusal to a benign request, blue_decision.py); its loss
and gradient vanish where the choices are already unlikely.

Why at all, when the paper trains eval with GRPO: on a few hundred labels a
small eval trained by GRPO collapsed onto one label for long stretches
(method.md); the cross-entropy on the same labels is the cheap, stable way to
a judge that judges, after which GRPO can refine it (`sft+grpo`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .forward import padded_tokens


@dataclass
class ChoiceExample:
    """One labelled prompt: the token ids of every choice (EOS included) and
    the index of the right one (NONE: none of them)."""

    prompt_ids: list[int]
    choices: list[list[int]]
    gold: int
    kind: str | None = None


NONE = -1


@dataclass
class _Row:  # what forward.py needs of a row
    prompt_ids: list[int]
    completion_ids: list[int]


def _chunks(examples: list[ChoiceExample], layout: str, max_tokens: int | None) -> list[list[ChoiceExample]]:
    """Examples cut into micro-batches by padded tokens; an example's choices
    stay together (their softmax couples them)."""
    out: list[list[ChoiceExample]] = []
    for ex in examples:
        rows = [_Row(e.prompt_ids, c) for e in (out[-1] if out else []) + [ex] for c in e.choices]
        if out and max_tokens and padded_tokens(rows, layout) > max_tokens:
            out.append([ex])
        elif out:
            out[-1].append(ex)
        else:
            out.append([ex])
    return out


def _by_width(chunk: list[ChoiceExample]) -> list[tuple[int, list[ChoiceExample]]]:
    """Runs of consecutive examples with the same number of choices (a
    warm start may mix plain answers with answers set against a contrast)."""
    runs: list[tuple[int, list[ChoiceExample]]] = []
    for ex in chunk:
        if runs and runs[-1][0] == len(ex.choices):
            runs[-1][1].append(ex)
        else:
            runs.append((len(ex.choices), [ex]))
    return runs


def choice_cross_entropy(seq_logp: torch.Tensor, gold: torch.Tensor, smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example loss and the most likely choice (what the judge answers
    now), for `seq_logp` (examples, choices) of summed log-probs."""
    logq = torch.log_softmax(seq_logp, dim=-1)
    nll = -logq.gather(-1, gold.unsqueeze(-1)).squeeze(-1)
    loss = (1 - smoothing) * nll - smoothing * logq.mean(-1) if smoothing else nll
    return loss, logq.argmax(-1)


def unlikelihood(seq_logp: torch.Tensor) -> torch.Tensor:
    """-log(1 - P(any choice)) per example, for `seq_logp` (examples, choices)."""
    any_logp = torch.logsumexp(seq_logp, dim=-1).clamp(max=-1e-6)  # a choice of probability 1: a large, finite loss
    return -torch.log(-torch.expm1(any_logp))


def accumulate(learner, examples: list[ChoiceExample], layout: str, n_all: float, smoothing: float,
               width: int = 0) -> dict[str, float]:
    """Forward and backward of sum(loss) / n_all over this rank's examples
    (n_all: every rank's count), micro-batch by micro-batch; returns totals
    for the step's statistics: ce_loss, ce_correct, and ce_pick_k (how many
    examples' most likely choice is k, for k < `width`, every rank's widest
    example: the same keys on every rank). The forward scores every choice
    before the update, so these are what the judge answers now, at no
    extra cost."""
    device = next(learner.model.parameters()).device
    totals = {"ce_loss": 0.0, "ce_correct": 0.0, **{f"ce_pick_{k}": 0.0 for k in range(width)}}
    chunks = _chunks(examples, layout, learner.cfg.max_tokens_per_microbatch)
    from .sharding import is_sharded

    if is_sharded(learner.model):  # every rank runs as many forwards as the busiest (see grpo._plan)
        chunks += [[]] * (learner.collective.max_int(len(chunks)) - len(chunks))
    for chunk in chunks:
        if not chunk:  # keeping step with the other ranks: a one-token forward of weight 0
            out = learner._logprobs([learner._dummy], layout)
            (out.logp.sum() * 0.0).backward()
            continue
        rows = [_Row(ex.prompt_ids, c) for ex in chunk for c in ex.choices]
        out = learner._logprobs(rows, layout)
        seq = (out.logp * out.cmask).sum(-1)
        losses, rights, at = [], [], 0
        for width, group in _by_width(chunk):  # consecutive examples with as many choices
            lo, at = at, at + len(group) * width
            part = seq[lo:at]
            none = torch.tensor([ex.gold == NONE for ex in group], device=device)
            if none.any():  # unlikelihood: right where every choice is less likely than not
                rows_none = part.view(len(group), width)[none]
                losses.append(unlikelihood(rows_none))
                rights.append(torch.logsumexp(rows_none, dim=-1) < math.log(0.5))
                keep = (~none).repeat_interleave(width)
                group, part = [ex for ex in group if ex.gold != NONE], part[keep]
                if not group:
                    continue
                lo_mask = out.cmask[lo:at][keep]
            else:
                lo_mask = out.cmask[lo:at]
            if width == 1:  # teacher forcing on the one answer: its mean token NLL
                losses.append(-(part / lo_mask.sum(-1).clamp(min=1)))
                rights.append(torch.ones(len(group), dtype=torch.bool, device=device))
                continue
            gold = torch.tensor([ex.gold for ex in group], device=device)
            loss, picked = choice_cross_entropy(part.view(len(group), width), gold, smoothing)
            losses.append(loss)
            rights.append(picked == gold)
            for k in picked.tolist():
                totals[f"ce_pick_{k}"] = totals.get(f"ce_pick_{k}", 0.0) + 1.0
        loss, right = torch.cat(losses), torch.cat(rights)
        (loss.sum() / n_all).backward()
        totals["ce_loss"] += loss.sum().item()
        totals["ce_correct"] += right.float().sum().item()
    return totals
