"""A league of past adapters (recipe section `league:`, off by default).

Self-play can cycle: red forgets how to beat old defenders, blue forgets old
attacks. Every past iteration of every role is already on disk as a LoRA
snapshot of the same base, so keeping a league costs one adapter slot per
member, not a model:
  - defenders: `blue@-1 .. blue@-size` join red's multi-defender reward,
    `weight` in all, split uniformly or biased to the recent ones;
  - attackers: `attacker_share` of blue's harmful training prompts are
    written by `red@-1 .. red@-size` instead of the current red (sampled
    with the same weights), so blue keeps meeting old attacks.
With `sampling: winrate` a member's weight follows how often it still wins
its games (state["league_record"]: a past blue's answers red failed to
break, a past red's prompts blue failed to resist, as eval labels them),
so members that still teach something are met more often and beaten ones
fade. Members are snapshots, resolved and deduplicated like the recipe's own
defenders (defenders.py); red's metrics gain `asr_league` (its ASR against
the league members that answered) and blue's `league_refusal_rate` and
`league_rate_*` on the prompts old reds wrote.
"""
from __future__ import annotations

import copy
import logging
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .defenders import ZERO, fingerprint

log = logging.getLogger(__name__)


class LeagueConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    size: int = Field(0, ge=0, le=64, description="past iterations kept in the league (0: no league)")
    weight: float = Field(0.5, ge=0.0, description="total weight of the league's defenders in red's reward")
    sampling: Literal["uniform", "recent", "winrate"] = Field(
        "uniform", description="uniform, recent (weights halve per iteration back), or winrate (by how often a member still wins)")
    attacker_share: float = Field(0.0, ge=0.0, le=1.0, description="share of blue's harmful prompts written by past reds")


def win_rate(record: dict | None, adapter: str) -> float:
    """How often snapshot `adapter` (`blue@3`, `red@2`) won its league games
    so far, smoothed (Laplace: an unplayed member counts 1/2)."""
    played, won = (record or {}).get(adapter, (0, 0))
    return (won + 1) / (played + 2)


def member_weights(cfg: LeagueConfig, role: str = "blue", latest: int | None = None, record: dict | None = None) -> list[float]:
    """Weight of member k = 1..size (k iterations back, `role@latest-k`),
    summing to 1. `winrate`: proportional to how often the member still
    wins (a past blue that still resists red, a past red that still gets
    through blue), from `record` (state["league_record"])."""
    if cfg.sampling == "winrate" and latest is not None:
        raw = [win_rate(record, f"{role}@{latest - k}") for k in range(1, cfg.size + 1)]
    else:
        raw = [0.5 ** k if cfg.sampling == "recent" else 1.0 for k in range(cfg.size)]
    return [w / sum(raw) for w in raw]


def league_defenders(cfg: LeagueConfig, defender_type, latest: int | None = None, record: dict | None = None) -> list:
    """`blue@-k` defenders (built with the recipe's DefenderConfig type);
    `latest`: the newest blue snapshot, which `blue@-k` counts back from."""
    if not cfg.size or not cfg.weight:
        return []
    weights = member_weights(cfg, "blue", latest, record)
    return [defender_type(name=f"blue@-{k}", weight=cfg.weight * w) for k, w in enumerate(weights, 1)]


def record_at_phase_start(state: dict) -> dict | None:
    """The league record a phase weighs its members by (`sampling: winrate`):
    as the phase began. Its steps add games to state["league_record"], so the
    phase's first step keeps a copy in the state it commits, and a resume
    inside the phase reads that copy, not the record of its last commit."""
    if state["step"] == 0:
        state["league_record_at_phase_start"] = copy.deepcopy(state.get("league_record"))
    return state.get("league_record_at_phase_start", state.get("league_record"))


def tally(record: dict, adapter: str, played: int, won: int) -> None:
    """Add `played` league games, `won` of them by the member, to `record`."""
    before = record.get(adapter, (0, 0))
    record[adapter] = [before[0] + played, before[1] + won]


def resolve_attackers(cfg: LeagueConfig, store, engine, record: dict | None = None) -> list[tuple[str, float]]:
    """(engine adapter name, weight) of the past reds that write blue's
    league prompts this phase: loaded into the engine, skipping snapshots
    equal to the current red or to each other (untrained ones are `base`
    weights and write nothing a red would)."""
    if not cfg.size or not cfg.attacker_share:
        return []
    snaps = store.snapshots("red")
    latest = max(snaps) if snaps else 0
    seen = {fingerprint(store.snapshot_dir("red", latest)) if snaps else ZERO, ZERO}
    out = []
    for k, w in enumerate(member_weights(cfg, "red", latest, record), 1):
        at = latest - k
        if at < 0 or at not in snaps:
            continue
        folder = store.snapshot_dir("red", at)
        print_ = fingerprint(folder)
        if print_ in seen:
            continue
        seen.add(print_)
        name = f"red@{at}"
        if name not in engine.adapters():
            engine.load_adapter(name, str(folder))
        out.append((name, w))
    used = {n for n, _ in out}
    for name in engine.adapters():  # members that left the league
        if name.startswith("red@") and name not in used:
            engine.remove_adapter(name)
    if out:
        log.info("league attackers this phase: %s", ", ".join(n for n, _ in out))
    return out


def assign_writers(n: int, share: float, attackers: list[tuple[str, float]], seed: str) -> list[str]:
    """Who writes each of n harmful prompts: `red`, or a league member for a
    `share` of them (deterministic in `seed`, so a resumed step redoes it)."""
    if not attackers or not share:
        return ["red"] * n
    rng = random.Random(seed)
    k = round(share * n)
    names, weights = zip(*attackers)
    league = rng.choices(names, weights=weights, k=k)
    return ["red"] * (n - k) + list(league)
