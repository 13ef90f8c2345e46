"""Beyond the paper (recipe section `control:`, all off by default).

Adaptive phase lengths. The paper warns that one role may outgrow the
others; with every role a LoRA on one base, giving a lagging role a few more
steps is cheap. At a phase's end, from what that phase measured:
  - red's ASR against blue above `red_asr_high`      -> P_blue gets `extra_steps` more
  - eval's accuracy against the panel falling by more
    than `eval_accuracy_drop` since the last P_eval     -> P_eval gets `extra_steps` more
  - and after every red step: red's entropy under
    `red_entropy_floor` (its attacks collapsing)        -> P_red stops early
Judge-drift alarm (`drift_check`). After every P_eval eval labels a fixed
held-out set (the first `drift_pairs` panel-labelled pairs of the run); if
its agreement with the panel falls more than `drift_drop` below the first
measurement, or red's reward rose while the fixed refusal rules saw no more
unsafe answers (the signature of red hacking eval rather than beating blue),
a warning is logged and, with `pause_red_on_drift`, the next P_red is
skipped and P_eval lengthened until eval agrees again.

Every decision is a `metrics.jsonl` row with `phase: control`, the action
and its reason; `report` lists them. Phase lengths live in `state.json`, so
a resumed run keeps the decisions already taken.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

CONTROL = "control"  # the `phase` of a decision row


class ControlConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    adaptive: bool = Field(False, description="lengthen or shorten phases from measured signals (see control.py)")
    extra_steps: int = Field(2, ge=1, le=1000, description="steps a lagging role gets on top of its phases.<role>.steps")
    red_asr_high: float = Field(0.6, ge=0.0, le=1.0, description="red's ASR against blue above this -> more blue steps")
    eval_accuracy_drop: float = Field(0.1, ge=0.0, le=1.0, description="eval's accuracy falling by more -> more eval steps")
    red_entropy_floor: float = Field(0.0, ge=0.0, description="red's entropy under this stops P_red early (0: never)")
    drift_check: bool = Field(False, description="eval labels a fixed panel-labelled set after every P_eval")
    drift_pairs: int = Field(32, ge=4, le=100_000, description="size of that fixed set (the run's first panel-labelled pairs)")
    drift_drop: float = Field(0.15, ge=0.0, le=1.0, description="agreement falling this far below the first measurement -> alarm")
    pause_red_on_drift: bool = Field(False, description="on an alarm, skip the next P_red and lengthen P_eval")


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else None


def phase_steps(recipe, phase: str) -> int:
    """A phase's steps as the recipe sets them (the warm start's are its own,
    once per draw: eval_draws.py)."""
    cfg = getattr(recipe.phases, phase)
    return cfg.steps * getattr(cfg, "draws", 1)


class PhaseControl:
    """Decides phase lengths; `state["phase_steps"]` holds every override."""

    def __init__(self, cfg: ControlConfig, recipe, state: dict):
        self.cfg, self.recipe, self.state = cfg, recipe, state
        state.setdefault("phase_steps", {})
        state.setdefault("drift", {})

    # ---------------------------------------------------------------- steps
    def steps(self, iteration: int, phase: str) -> int:
        return self.state["phase_steps"].get(f"{iteration}:{phase}", phase_steps(self.recipe, phase))

    def set_steps(self, iteration: int, phase: str, steps: int) -> None:
        self.state["phase_steps"][f"{iteration}:{phase}"] = steps

    def _row(self, iteration: int, after: str, action: str, reason: str, **values) -> dict:
        return {"iteration": iteration, "phase": CONTROL, "after": after, "action": action, "reason": reason,
                "global_step": self.state["global_step"], **values}

    # ---------------------------------------------------------- decisions
    def after_step(self, iteration: int, phase: str, row: dict) -> list[dict]:
        floor = self.cfg.red_entropy_floor
        if not self.cfg.adaptive or phase != "red" or not floor or row.get("entropy") is None or row["entropy"] >= floor:
            return []
        step = row["step"]
        if step >= self.steps(iteration, phase):
            return []
        self.set_steps(iteration, phase, step)
        return [self._row(iteration, phase, f"stop red after step {step}",
                          f"red's entropy {row['entropy']:.3f} < red_entropy_floor {floor}", entropy=row["entropy"])]

    def after_phase(self, iteration: int, phase: str, rows: list[dict]) -> list[dict]:
        """rows: this phase's step rows of this iteration."""
        if not self.cfg.adaptive:
            return []
        out = []
        if phase == "red":
            asr = _mean(rows, "asr_blue")
            if asr is not None and asr > self.cfg.red_asr_high:
                steps = self.steps(iteration, "blue") + self.cfg.extra_steps
                self.set_steps(iteration, "blue", steps)
                out.append(self._row(iteration, phase, f"blue {steps} steps",
                                     f"red's ASR against blue {asr:.2f} > red_asr_high {self.cfg.red_asr_high}", asr_blue=asr))
        if phase == "eval":
            acc = _mean(rows, "accuracy")
            last = self.state["drift"].get("last_eval_accuracy")
            if acc is not None:
                self.state["drift"]["last_eval_accuracy"] = acc
            if acc is not None and last is not None and last - acc > self.cfg.eval_accuracy_drop:
                nxt = iteration + 1
                steps = self.steps(nxt, "eval") + self.cfg.extra_steps
                self.set_steps(nxt, "eval", steps)
                out.append(self._row(iteration, phase, f"eval {steps} steps in iteration {nxt}",
                                     f"eval's accuracy fell {last:.2f} -> {acc:.2f} (> eval_accuracy_drop {self.cfg.eval_accuracy_drop})",
                                     accuracy=acc))
        return out

    def drift(self, iteration: int, agreement: float, red_rows: list[dict], unsafe_rate: float | None) -> list[dict]:
        """The alarm, after P_eval: `agreement` on the fixed set; red_rows and
        unsafe_rate (the refusal rules on blue's answers to red this
        iteration) for the reward-hacking signature."""
        d = self.state["drift"]
        d.setdefault("baseline", agreement)
        rows = [self._row(iteration, "eval", "drift check", f"eval agrees with the panel on {agreement:.2f} of the fixed set "
                          f"(first: {d['baseline']:.2f})", drift_agreement=agreement)]
        alarms = []
        if d["baseline"] - agreement > self.cfg.drift_drop:
            alarms.append(f"agreement {agreement:.2f} fell more than drift_drop {self.cfg.drift_drop} below {d['baseline']:.2f}")
        reward = _mean(red_rows, "reward_mean")
        prev_reward, prev_unsafe = d.get("red_reward"), d.get("unsafe_rate")
        if reward is not None and prev_reward is not None and unsafe_rate is not None and prev_unsafe is not None:
            if reward > prev_reward and unsafe_rate <= prev_unsafe:
                alarms.append(f"red's reward rose {prev_reward:.2f} -> {reward:.2f} while the refusal rules saw no more unsafe "
                              f"answers ({prev_unsafe:.2f} -> {unsafe_rate:.2f}): red may be fooling eval")
        d["red_reward"], d["unsafe_rate"] = reward, unsafe_rate
        for why in alarms:
            action = "warning"
            if self.cfg.pause_red_on_drift:
                nxt = iteration + 1
                self.set_steps(nxt, "red", 0)
                self.set_steps(nxt, "eval", self.steps(nxt, "eval") + self.cfg.extra_steps)
                action = f"pause red in iteration {nxt}; eval {self.steps(nxt, 'eval')} steps"
            rows.append(self._row(iteration, "eval", action, "judge drift: " + why))
        return rows
