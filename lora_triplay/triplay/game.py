"""TriPlay-RL (the paper, ../shared/docs/method.md): red rewrites harmful
requests, blue answers, eval labels; each trained in turn with GRPO.

This module is the game's side of the core (games/base.py); the phases
themselves are loop.py (with red_steps.py, eval_steps.py and
blue_warmup.py), the data rundata.py, the rewards rewards/, and the
options beyond the paper control.py and league.py. Its settings are the
recipe's own sections (phases, rewards, defenders, experts, data, control,
league), so every TriPlay recipe reads as it always did.
"""
from __future__ import annotations

import logging

from ..games.base import Game, StepResult
from . import config, league
from . import defenders as defender_set
from .config import ROLE_NAMES, DefenderConfig, TriPlaySections
from .control import PhaseControl
from .experts import ExpertPanel, build_sources
from .rewards import AttackSuccessPool, HashingEncoder, load_sentence_encoder
from .roles import ROLE_ADAPTERS
from .rundata import RunData

log = logging.getLogger(__name__)
PHASE_ROLE = {"red": "red", "blue": "blue", "eval": "eval", "eval_warmup": "eval", "blue_warmup": "blue"}  # whose adapter a phase trains


class TriPlay(Game):
    name = "triplay"
    roles = dict(ROLE_ADAPTERS)
    Sections = TriPlaySections
    jsonl = ("asp", "eval_pairs", "panel", "transcripts", "blue_sft", "blue_decisions")
    headline = {
        "red": ("reward_mean", "asr_blue", "asr_base", "semantic_pass_rate", "diversity_penalty", "entropy"),
        "blue": ("reward_mean", "rate_negative", "rate_rejective", "rate_positive", "benign_refusal_rate", "kl"),
        "eval": ("reward_mean", "accuracy", "labelled_pairs", "panel_agreement", "kl"),
        "eval_warmup": ("reward_mean", "accuracy", "labelled_pairs", "panel_agreement"),
        "blue_warmup": ("ce_loss", "kept_answers", "harmful_kept_share", "benign_kept_share"),
    }

    # ---------------------------------------------------------- structure
    def phases_of(self, iteration: int) -> list[str]:
        return config.phases_of(self.recipe, iteration)

    def role_of(self, phase: str) -> str:
        return PHASE_ROLE[phase]

    def steps(self, iteration: int, phase: str) -> int:
        return self.control.steps(iteration, phase)

    def snapshot_after(self, phase: str) -> bool:
        return phase in ROLE_NAMES  # the warm starts are part of iteration 1, not snapshots of their own

    def lr_of(self, role: str) -> float:
        return config.role_lr(self.recipe, role)

    def phase_lr(self, phase: str, step: int = 1, steps: int = 1) -> float:
        """The phase's own rate (a warm start's `lr`), else its role's
        (phases.<role>.lr, else grpo.lr); eval's warm start falls linearly to
        `lr_end` over its steps where that is set."""
        cfg = getattr(self.recipe.phases, phase)
        lr = cfg.lr or self.lr_of(self.role_of(phase))
        end = getattr(cfg, "lr_end", None)
        step, steps = self.segment(phase, step, steps)
        if end is None or steps <= 1:
            return lr
        return lr + (end - lr) * (min(step, steps) - 1) / (steps - 1)

    def segment(self, phase: str, step: int, steps: int) -> tuple[int, int]:
        """Each of eval's warm-start draws is a stretch of its own (eval_draws.py)."""
        cfg = self.recipe.phases.eval_warmup
        if phase != "eval_warmup" or cfg.draws == 1:
            return step, steps
        return (step - 1) % cfg.steps + 1, cfg.steps

    def average_last(self, phase: str) -> int:
        """Eval's warm start may end on the mean of its last weights
        (`phases.eval_warmup.average_last`)."""
        return getattr(getattr(self.recipe.phases, phase), "average_last", 0)

    def max_new_tokens_of(self, role: str) -> int:
        return config.max_new_tokens_of(self.recipe, role)

    def prompts_of(self, role: str) -> int:
        return config.prompts_of(self.recipe, role)

    def group_size_of(self, role: str) -> int:
        return config.group_size_of(self.recipe, role)

    def temperature_of(self, role: str) -> float:
        return config.temperature_of(self.recipe, role)

    def judge_budget(self) -> int:
        return config.judge_budget(self.recipe)

    def extra_adapters(self) -> int:
        """Past blues as defenders (`blue@N`) and the league's members."""
        r = self.recipe
        return sum(1 for d in r.defenders if "@" in d.name) + 2 * r.league.size

    def endpoints(self) -> list[tuple[str, str]]:
        from ..judging.fixed import is_endpoint

        r = self.recipe
        asked = r.experts.safety_experts + r.experts.utility_experts > 0  # else the prompted experts never speak
        named = [("experts.models", m) for m in r.experts.models if asked]
        named += [(f"defenders[{d.name}].model", d.model) for d in r.defenders if d.model]
        named.append(("rewards.blue_judge", r.rewards.blue_judge))
        return [(what, spec) for what, spec in named if is_endpoint(spec)]

    def initial_state(self) -> dict:
        return {"cursor": 0, "benign_cursor": 0}

    # ---------------------------------------------------------- lifetime
    def build(self, session) -> None:
        super().build(session)
        r = self.recipe
        encoder = HashingEncoder() if r.rewards.embedding_model == "hashing" else load_sentence_encoder(r.rewards.embedding_model)
        self.pool = AttackSuccessPool(encoder, r.rewards.ngram_orders)
        device = next(session.model.parameters()).device
        sources = build_sources(r.experts.models, session.engine, device, session.model.dtype, r.model.trust_remote_code)
        # One engine call for both votes where rows are cheap and a call is a
        # decode loop: on a GPU a decode step costs about the same for 1 row
        # as for 64 (engine/hf.py _batches), so the utility questions asked
        # for unsafe pairs cost little and one loop replaces two (not yet
        # measured on a GPU). On the CPU they cost their compute
        # (ExpertPanel.label, measured), so the panel asks in two rounds.
        choice = r.rewards.judge_mode == "choice"
        self.panel = ExpertPanel(session.engine, r.experts, max_new_tokens=self.judge_budget(), choice_mode=choice,
                                 sources=sources, one_call=not choice and device.type != "cpu")
        self.data = RunData(r, session.state, self.panel)
        self.model_defenders = defender_set.model_sources(r.defenders, session.engine, device, session.model.dtype,
                                                          r.model.trust_remote_code)
        self.blue_judge = self._fixed_blue_judge(r.rewards.blue_judge)
        self.control = PhaseControl(r.control, r, session.state)
        from .eval_draws import EvalDraws  # torch, as the phases below

        self.draws = EvalDraws(self)
        self.defenders: list[defender_set.Defender] = []
        self.attackers: list[tuple[str, float]] = []  # league members writing blue's prompts (league.py)
        from .loop import Phases  # here: the phases import torch, and reading a recipe (`validate`) imports this module

        self.phases = Phases(self)

    def _fixed_blue_judge(self, spec: str):
        """`rewards.blue_judge`: None for the eval adapter (the paper), else a
        callable over judging.fixed.Case giving one label (or None) each."""
        if spec == "eval":
            return None
        if spec == "panel":
            return lambda cases: [x.label for x in self.panel.label([(c.prompt, c.response, c.expected) for c in cases])]
        from .judges import make_judge

        return make_judge(spec)

    def restore(self, store) -> None:
        self.pool.add([row["text"] for row in store.iter_jsonl("asp")])
        self.data.restore(store)
        self.phases.blue_warmup.restore(store.iter_jsonl("blue_sft"), store.iter_jsonl("blue_decisions"))

    def phase_start(self, iteration: int, phase: str) -> None:
        r, st = self.recipe, self.state
        record = league.record_at_phase_start(st)
        if phase == "red":
            blues = self.store.snapshots("blue")
            members = league.league_defenders(r.league, DefenderConfig, max(blues) if blues else 0, record)
            self.defenders = defender_set.resolve([*r.defenders, *members], self.store, self.engine, self.model_defenders)
        if phase == "blue":
            self.attackers = league.resolve_attackers(r.league, self.store, self.engine, record)
        if phase == "eval_warmup" and self.draws.active:
            self.draws.phase_start()

    def step(self, phase: str, iteration: int, step: int) -> StepResult:
        self.data.pending = []
        return self.phases.run_step(phase, iteration, step)

    def after_step(self, iteration: int, phase: str, row: dict) -> list[dict]:
        rows = self.control.after_step(iteration, phase, row)
        if phase == "eval_warmup" and self.draws.active:
            rows += self.draws.after_step(iteration, row["step"])
        return rows

    def commit_step(self, result) -> None:
        rows = result.jsonl_rows()
        self.pool.add([x["text"] for x in rows["asp"]])
        self.data.commit(rows["eval_pairs"], rows["panel"])

    def after_phase(self, iteration: int, phase: str) -> list[dict]:
        """Eval's check on its held-out pairs after its warm start and every
        P_eval, control.py's decisions at a phase's end and the drift alarm
        after P_eval, as metrics rows; committed with the next phase's start."""
        cfg = self.recipe.control
        checks = self.phases.evals.checks(iteration, phase) if phase in ("eval", "eval_warmup") else []
        if not (cfg.adaptive or (cfg.drift_check and phase == "eval")):
            return checks
        rows = [r for r in self.store.read_jsonl("metrics") if r.get("iteration") == iteration]
        decisions = self.control.after_phase(iteration, phase, [r for r in rows if r["phase"] == phase])
        if cfg.drift_check and phase == "eval":
            decisions += self._drift_check(iteration, [r for r in rows if r["phase"] == "red"])
        for row in decisions:
            level = logging.WARNING if row["reason"].startswith("judge drift") else logging.INFO
            log.log(level, "control: %s (%s)", row["action"], row["reason"])
        return checks + decisions

    def _drift_check(self, it: int, red_rows: list[dict]) -> list[dict]:
        from ..judging.refusals import refused

        fixed = [r for r in self.store.iter_jsonl("panel") if r.get("panel_label")][: self.recipe.control.drift_pairs]
        if not fixed:
            return []
        labels, _, _ = self.phases.judge([(r["prompt"], r["response"], r.get("kind", "harmful")) for r in fixed])
        agreement = sum(lab == r["panel_label"] for lab, r in zip(labels, fixed)) / len(fixed)
        answers = [r["response"] for r in self.store.iter_jsonl("eval_pairs")
                   if r.get("iteration") == it and r.get("phase") == "red" and r.get("defender") == "blue"]
        unsafe = sum(not refused(a) for a in answers) / len(answers) if answers else None
        return self.control.drift(it, agreement, red_rows, unsafe)


GAME = TriPlay
