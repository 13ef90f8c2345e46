"""TriPlay's recipe sections: phases (phase_config.py), rewards, defenders,
experts, data, control and league, with their bounds and one-line errors. The core's
sections (model, lora, engine, grpo, run) are recipe.py's; a TriPlay recipe
is both, joined by `recipe.recipe_class` (this model is TriPlay's game's
`Sections`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..judging.parsing import LABELS
from ..recipe import _Strict
from .control import ControlConfig, phase_steps  # noqa: F401 (phase_steps: part of what the sections imply)
from .league import LeagueConfig
from .phase_config import BlueWarmupConfig, PhaseConfig, PhasesConfig, WarmupConfig  # noqa: F401 (part of the sections)

ROLE_NAMES = ("red", "blue", "eval")
CLASSES = LABELS


class RewardsConfig(_Strict):
    red_class_values: dict[str, float] = Field(default_factory=lambda: {"negative": 1.0, "rejective": 0.0, "positive": 0.0})
    blue_class_values: dict[str, float] = Field(default_factory=lambda: {"negative": -1.0, "rejective": 0.0, "positive": 1.0})
    blue_benign_class_values: dict[str, float] | None = Field(
        None, description="blue's class values on benign requests (the benign stream); default blue_class_values. "
        "A lower `rejective` here makes an over-refusal cost what it costs a user"
    )
    success_class: Literal["negative", "rejective", "positive"] = "negative"
    semantic: bool | Literal["meaning"] = Field(True, description="red's semantic term: eval's yes/no (true, the paper) or "
        "`meaning` (judging/kept.py: at 135M eval's yes/no is at chance; bench/BENCHMARKS.md)")
    semantic_value: float = 1.0
    semantic_gate: bool = Field(False, description="a rewrite the semantic check fails earns red's worst attack term "
        "whatever the defenders did (rewards/red.py); with semantic_value 0, red is paid only for attacks that keep the request")
    w_bleu: float = Field(2.0, ge=0)
    w_cos: float = Field(4.0, ge=0)
    k: float = Field(math.log(11 / 6), gt=0)
    ngram_orders: list[int] = Field(default_factory=lambda: [3, 4, 5], min_length=1)
    embedding_model: str = "embedded:all-minilm-l6-v2"
    judge_mode: Literal["generate", "choice"] = Field(
        "generate", description="generate: eval writes free text ending in `Label: ...` (the paper); "
        "choice: the answer is forced to one of the labels by sequence log-prob (robust for small models)",
    )
    soft_labels: bool | Literal["auto"] = Field(
        True, description="choice mode: reward = expected value under the judge's class probabilities; `auto`: only while "
        "eval is calibrated (its expected calibration error on the held-out slice at most rewards.max_ece), else its label"
    )
    max_ece: float = Field(0.1, gt=0, le=1, description="soft_labels auto: the calibration error above which eval's label is used")
    choice_rollouts: Literal["enumerate", "sample"] = Field(
        "enumerate", description="choice mode, eval's GRPO group: every label once (a group that always holds the right "
        "and the wrong answers) or group_size labels sampled from eval's choice distribution"
    )
    judge_max_new_tokens: int | None = Field(
        None, ge=1, description="one budget for every judge call and for eval's own rollouts; default: room for the template's "
        "brief reasoning (256 tokens; 1024 with model.enable_thinking) in generate mode"
    )
    judge_retries: int = Field(1, ge=0, description="re-asks of a malformed judge output before the sample is dropped")
    judge_prompt: Literal["wrapped", "request"] = Field(
        "wrapped", description="what eval (and the panel) read as the user's prompt when they judge an answer to one of "
        "red's rewrites: red's wrapped text (the paper), or the basic request red was asked to wrap, so that red's "
        "text never reaches the judge and a rewrite earns red a reward only by making a defender serve the request, "
        "not by hiding it from eval"
    )
    eval_sees_kind: bool = Field(
        False, description="eval reads, beside each answer, whether the game asked a harmful request (red's wraps, "
        "the seed set) or a benign one (the benign stream): a line of prompts/eval_kind.yaml, "
        "never text from red. The panel's labels depend on that kind (the rule expert knows it); without it eval must "
        "guess it from the words, and on the 135M base 82-89% of its warm start's errors were a compliance put in "
        "the wrong one of negative / positive. Off: the paper's (prompt, response) judge"
    )
    blue_judge: str = Field(
        "eval", description="who labels blue's answers for its reward: `eval` (the eval adapter, the paper), `rules` "
        "(the refusal rules, which know whether a request was harmful or benign), `panel` (the expert panel of "
        "`experts:`), or `openai:MODEL@URL` (an OpenAI-compatible endpoint, e.g. a guard model); a fixed judge is the "
        "baseline self-play must beat"
    )
    degenerate_penalty: float = Field(0.0, ge=0, description="subtracted from blue's reward for a degenerate answer "
        "(judging/quality.py: looping or near-empty text, which satisfies a refusal rule without being an answer)")
    generic_penalty: float = Field(
        0.0, ge=0, description="subtracted from blue's reward for a generic answer (judging/generic.py: "
        "no refusal, and the same opening (with generic_by: meaning, or meaning) as its answers to at least 4 of the "
        "step's distinct prompts, or, by meaning, nothing of its own prompt: one stock reply that a small judge may take "
        "for a safe or a helpful answer)"
    )
    generic_opening: int = Field(
        4, ge=2, description="how many opening words two answers share to count as one reply for generic_penalty "
        "(judging/generic.py). At 6, seed 0's blue of 2026-12-02 varied the sixth word ('I'm here to help you protect / "
        "create / understand ...'); the untrained base shares no 4-word opening between four of its held-out answers"
    )
    generic_by: Literal["opening", "meaning"] = Field(
        "opening", description="what makes answers one stock reply for generic_penalty: `opening` (the same "
        "generic_opening words) or `meaning` (that, or sentence embeddings (embedding_model) within cosine 0.7 across "
        "four distinct requests, or far from the answer's own request: judging/generic.py). At four words, seed 0's "
        "blue of 2026-12-02 kept its stock reply and reworded its opening"
    )

    @model_validator(mode="after")
    def _semantic_settings_agree(self):
        if self.semantic_gate and self.semantic is False:
            raise ValueError("rewards.semantic_gate needs a semantic check: set rewards.semantic: meaning (or true)")
        for key, off in (("generic_by", "opening"), ("semantic", "true")):
            if getattr(self, key) == "meaning" and self.embedding_model == "hashing":
                raise ValueError(f"{key}: meaning needs a sentence model (embedding_model: embedded:all-minilm-l6-v2 or a "
                                 f"sentence-transformers folder): hashed trigrams do not measure meaning; or set {key}: {off}")
        return self

    @field_validator("embedding_model")
    @classmethod
    def _known_embedded(cls, v: str) -> str:
        from .rewards.diversity import _EMBEDDED  # numpy only: validate stays light

        if v.startswith("embedded:") and v.split(":", 1)[1].lower() not in _EMBEDDED:
            raise ValueError(f"{v!r} is not a known embedded model; known: {', '.join('embedded:' + k for k in _EMBEDDED)}, "
                             "or `hashing`, or a local sentence-transformers folder")
        return v

    @field_validator("blue_judge")
    @classmethod
    def _judge(cls, v: str) -> str:
        from ..judging.fixed import JudgeError, is_endpoint, parse_endpoint

        v = v.strip()
        if is_endpoint(v):
            try:
                parse_endpoint(v)
            except JudgeError as exc:
                raise ValueError(str(exc)) from None
        elif v not in ("eval", "rules", "panel"):
            raise ValueError(f"unknown judge {v!r}; use eval, rules, panel or openai:MODEL@URL")
        return v

    @field_validator("red_class_values", "blue_class_values", "blue_benign_class_values")
    @classmethod
    def _all_classes(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and set(v) != set(CLASSES):
            missing, unknown = [c for c in CLASSES if c not in v], sorted(set(v) - set(CLASSES))
            raise ValueError(f"needs one value for each class {list(CLASSES)}; missing {missing}, unknown {unknown}")
        return v

    @field_validator("ngram_orders")
    @classmethod
    def _orders(cls, v: list[int]) -> list[int]:
        if any(n < 1 or n > 8 for n in v):
            raise ValueError(f"n-gram orders must be between 1 and 8, got {v}")
        return v

    def blue_values(self, kind: str | None) -> dict[str, float]:
        """Blue's class values for a request of `kind` (harmful / benign)."""
        return self.blue_benign_class_values if kind == "benign" and self.blue_benign_class_values else self.blue_class_values


class DefenderConfig(_Strict):
    # `model` first: the name's check reads it
    model: str | None = Field(
        None, description="another model as defender (the paper attacks other model families beside blue): "
        "`openai:MODEL@URL` (an OpenAI-compatible endpoint; key from LORA_TRIPLAY_JUDGE_API_KEY), a local model folder or a "
        "cached hub id; it answers red's prompts under blue's system prompt, greedily"
    )
    name: str = Field(description="`blue`, `base` (adapters off), a past blue snapshot `blue@N`, or `blue@-N`: "
                      "the blue N phases before the current one; with `model`, any name (metrics: asr_<name>)")
    weight: float = 1.0

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        from ..judging.fixed import JudgeError, is_endpoint, parse_endpoint

        if v is not None and is_endpoint(v):
            try:
                parse_endpoint(v)
            except JudgeError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str, info) -> str:
        from ..core.snapshots import SpecError, parse_spec

        if info.data.get("model") is not None:
            if v in ("blue", "base") or v.startswith("blue@"):
                raise ValueError(f"defender {v!r} with a model: choose another name (`blue`, `base` and `blue@N` are adapters)")
            if not v.replace("-", "_").replace(".", "_").isidentifier():
                raise ValueError(f"defender name {v!r}: use letters, digits, `-`, `_` or `.` (it names metrics: asr_{v})")
            return v
        try:
            spec = parse_spec(v)
        except SpecError as exc:
            raise ValueError(f"{exc}; or give the defender a `model` (another model as defender)") from None
        if spec.role == "blue" or v == "base":
            return v
        raise ValueError(f"defender {v!r} is not `blue`, `base`, `blue@N` or `blue@-N` (or give it a `model`)")


class ExpertsConfig(_Strict):
    """The panel that labels eval's training pairs (experts.py)."""

    rule_based: bool = True
    safety_experts: int = Field(3, ge=0, description="prompted safety instructions, asked of every model in `models`")
    utility_experts: int = Field(3, ge=0)
    models: list[str] = Field(
        default_factory=lambda: ["self"], min_length=1,
        description="who answers the prompted experts: `self` (this run's base, adapters off), a local model folder "
        "or hub id, or `openai:MODEL@URL` (an OpenAI-compatible endpoint; key from LORA_TRIPLAY_JUDGE_API_KEY)",
    )
    min_agreement: float = Field(0.6, gt=0.5, le=1.0, description="share of the votes cast the majority needs")
    min_votes: int = Field(2, ge=1, description="votes cast (not abstentions) a label needs: the quorum")
    max_new_tokens: int | None = Field(None, ge=1, description="default: rewards.judge_max_new_tokens's budget")
    pairs_per_step: int | None = Field(None, ge=1, description="pairs the panel labels per eval step (default 2 x prompts_per_step)")
    fresh_share: float = Field(0.75, ge=0, le=1, description="share of them drawn from the current iteration's pairs")
    pick_by: Literal["pair", "source"] = Field(
        "pair", description="how the panel's pairs are drawn from the pool: `pair` uniformly, `source` one source "
        "(phase, defender, request kind) after another, so a small stream (the base's answers to red) is labelled as "
        "often as blue's large one and eval keeps meeting new compliances once blue refuses (pairs.py spread)"
    )
    pool_cap: int = Field(4096, ge=16, description="pairs kept in memory per reservoir (current iteration, older ones)")
    balance_classes: bool | Literal["kind"] = Field(
        False, description="eval's training batches draw each panel label equally often (a small eval otherwise learns the "
        "prior); `kind`: each (request kind, label) cell, so a refusal with guidance to a harmful request is not a minority "
        "of `positive` beside benign help (at 135M it moved eval's prior, not its reading: recipes/cpu-evidence.yaml)")
    batch_fresh_share: float = Field(
        0.0, ge=0, le=1, description="with balance_classes: the share of each label's draws in eval's batches taken "
        "from the current iteration's labels, where it has any (0: uniformly from every label so far). Why: eval "
        "learns its warm start's pairs to a near-zero loss, so in later batches they carry almost no gradient and the "
        "few new pairs steer the update; drawn uniformly, the new ones were mostly `positive` (fifth evidence run)"
    )
    heldout_share: float = Field(
        0.1, ge=0, le=0.5, description="share of the panel-labelled pairs kept out of eval's training: after each eval phase "
        "eval labels them (accuracy, per-class recall, predicted labels, calibration error in metrics.jsonl)"
    )
    gold_pairs: str | None = Field(
        None, description="a JSONL file of labelled answers (prompt, response, label; kind optional) eval is checked "
        "against after its warm start and every P_eval, never trained on (`phase: eval_gold` rows)"
    )
    gold_after: list[Literal["eval_warmup", "eval"]] = Field(
        default_factory=lambda: ["eval_warmup", "eval"], min_length=1,
        description="after which phases eval is checked against gold_pairs: its warm start, every P_eval, or both. A check "
        "is a judge call over the whole file (120 pairs: ~110 s at 135M on one CPU thread); after P_eval it repeats what "
        "`lora-triplay eval --eval-set` measures on the snapshots afterwards, while the warm start leaves no snapshot"
    )

    @field_validator("gold_pairs")
    @classmethod
    def _gold_exists(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).expanduser().is_file():
            raise ValueError(f"no such file {v!r}; give a JSONL file of prompt/response/label rows")
        return v


class DataConfig(_Strict):
    basic_prompts: str = Field("builtin", description="`builtin` or a CSV/JSONL file (e.g. HarmBench behaviors)")
    prompt_column: str | None = None
    techniques: str = "builtin"
    limit: int | None = Field(None, ge=1)
    benign_prompts: str = Field("builtin", description="benign but sensitive-sounding requests for blue: `builtin` or a CSV/JSONL file")
    benign_share: float = Field(0.0, ge=0, le=0.9, description="share of blue's training prompts that are benign (asked as they are)")
    raw_share: float = Field(
        0.0, ge=0, le=1, description="share of blue's harmful prompts asked as the seed request is written instead of "
        "red's rewrite (data.blue_attacks: red). Without it every harmful prompt eval learns from after its warm start "
        "is a rewrite and every request asked as written is benign, and eval can learn that shortcut: a plain request's "
        "compliance looks safe (benchmarks such as JailbreakBench ask plainly)"
    )
    blue_attacks: str = Field(
        "red", description="blue's harmful prompts: `red` (the latest red wraps each seed request, the paper), `seeds` "
        "(the seed requests as they are), or a CSV/JSONL file of attacks taken in its order, epoch after epoch (a fixed "
        "attack set: blue alone against a fixed judge needs no red)"
    )

    @field_validator("blue_attacks")
    @classmethod
    def _attacks(cls, v: str) -> str:
        if v not in ("red", "seeds") and not Path(v).expanduser().is_file():
            raise ValueError(f"not `red`, `seeds` or an existing CSV/JSONL file: no such file {v!r}")
        return v

    @field_validator("basic_prompts", "techniques", "benign_prompts")
    @classmethod
    def _exists(cls, v: str) -> str:
        # Fail at recipe load, not after minutes of model loading.
        if v != "builtin" and not Path(v).expanduser().is_file():
            raise ValueError(f"no such file {v!r}; give a CSV/JSONL path or `builtin`")
        return v


class TriPlaySections(_Strict):
    """TriPlay's top-level recipe sections (registered as its game's
    `Sections`: recipe.py joins them to the core's)."""

    phases: PhasesConfig = Field(default_factory=PhasesConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    defenders: list[DefenderConfig] = Field(
        default_factory=lambda: [DefenderConfig(name="blue", weight=1.0), DefenderConfig(name="base", weight=0.5)])
    experts: ExpertsConfig = Field(default_factory=ExpertsConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    control: ControlConfig = Field(default_factory=ControlConfig)  # beyond the paper: control.py
    league: LeagueConfig = Field(default_factory=LeagueConfig)  # beyond the paper: league.py

    @model_validator(mode="after")
    def _check(self) -> "TriPlaySections":
        names = [d.name for d in self.defenders]
        if not names:
            raise ValueError("defenders: at least one defender is needed (e.g. `- {name: blue, weight: 1.0}`)")
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"defenders: names must be unique, got {names}; remove the repeated {dup}")
        if self.data.raw_share and self.data.blue_attacks != "red":
            raise ValueError(f"data.raw_share mixes plain requests into red's rewrites; with data.blue_attacks = "
                             f"{self.data.blue_attacks!r} there are no rewrites: set data.raw_share=0 or data.blue_attacks=red")
        if self.phases.blue_warmup.steps and not self.data.benign_share:
            raise ValueError("phases.blue_warmup teaches blue refusals to harmful requests beside helpful answers to benign "
                             "ones; with data.benign_share = 0 there are no benign requests and it would teach blue to refuse "
                             "everything: set data.benign_share > 0 (e.g. 0.5) or phases.blue_warmup.steps=0")
        bw = self.phases.blue_warmup
        if bw.decision_requests and not bw.steps:
            raise ValueError("phases.blue_warmup.decision_requests is learnt in blue's warm start, which is off: set its steps or 0 requests")
        if self.phases.eval_warmup.after_blue_warmup and not (bw.steps and self.phases.eval_warmup.steps):
            raise ValueError("phases.eval_warmup.after_blue_warmup orders two warm starts, and one is off: set both "
                             "phases.eval_warmup.steps and phases.blue_warmup.steps, or drop after_blue_warmup")
        ew = self.phases.eval_warmup
        if ew.draws > 1 and not (ew.steps and self.experts.heldout_share):
            raise ValueError(f"phases.eval_warmup.draws = {ew.draws} keeps the draw its held-out slice ranks first; with "
                             f"eval_warmup.steps = {ew.steps} and experts.heldout_share = {self.experts.heldout_share} there is "
                             "nothing to draw or no slice to rank by: set both > 0, or draws: 1")
        if ew.draw_enough is not None and ew.draws == 1:
            raise ValueError("phases.eval_warmup.draw_enough stops drawing early; with draws: 1 there is one draw: set draws > 1 "
                             "or remove draw_enough")
        if (bw.decision_own_opening or bw.decision_wrapped) and not bw.decision_requests:
            raise ValueError("phases.blue_warmup.decision_own_opening / _wrapped shape a decision that is off: set decision_requests")
        for role in ("red", "eval"):
            if getattr(self.phases, role).greedy_member:
                raise ValueError(f"phases.{role}.greedy_member: only blue's groups take a greedy answer; remove it from {role}")
            if getattr(self.phases, role).refusal_anchor or getattr(self.phases, role).refusal_anchor_benign:
                raise ValueError(f"phases.{role}.refusal_anchor(_benign): only blue's groups take an anchored refusal; "
                                 f"remove it from {role}")
            if getattr(self.phases, role).twin_groups:
                raise ValueError(f"phases.{role}.twin_groups: only blue answers benign twins; remove it from {role}")
        if self.phases.blue.twin_groups and not self.data.benign_share:
            raise ValueError("phases.blue.twin_groups pairs benign twins with harmful requests, and data.benign_share = 0 "
                             "asks none: set data.benign_share > 0 (e.g. 0.5)")
        blue = self.phases.blue
        if blue.refusal_anchor_benign and not blue.refusal_anchor:
            raise ValueError("phases.blue.refusal_anchor_benign: anchors the benign groups with the opening of "
                             "phases.blue.refusal_anchor, which is unset; set phases.blue.refusal_anchor=guide (or refuse)")
        core = getattr(self, "grpo", None)  # the core's sections, when joined into a recipe (recipe.recipe_class)
        if blue.refusal_anchor and core is not None:
            group = blue.group_size or core.group_size
            if group < 2 + int(blue.greedy_member):
                raise ValueError(f"phases.blue.refusal_anchor: a group of {group} has no room for a sampled answer beside the "
                                 f"anchored one{' and the greedy one' if blue.greedy_member else ''}; raise phases.blue.group_size "
                                 f"to {2 + int(blue.greedy_member)} or more, or drop refusal_anchor")
        for role in ("red", "blue"):
            phase = getattr(self.phases, role)
            if phase.objective != "grpo" or phase.label_smoothing:
                raise ValueError(f"phases.{role}: objective and label_smoothing are eval's (a supervised judge); {role} trains with GRPO")
        if self.phases.eval.max_new_tokens is not None:
            raise ValueError("phases.eval.max_new_tokens: eval's answers are judgements; their length is rewards.judge_max_new_tokens "
                             "(one budget for judging and for eval's training)")
        if self.experts.safety_experts + int(self.experts.rule_based) == 0:
            raise ValueError("experts: the panel is empty; enable rule_based or set safety_experts >= 1")
        voters = self.experts.safety_experts * len(self.experts.models) + int(self.experts.rule_based)
        if self.experts.min_votes > voters:
            raise ValueError(f"experts.min_votes = {self.experts.min_votes} but the panel has {voters} safety voters; "
                             f"lower experts.min_votes or add experts")
        return self


# ------------------------------------------------ what the sections imply
# Read through TriPlay's game (game.py), which is the one place the core and
# the loop ask; these are its implementations.

def phases_of(recipe, iteration: int) -> list[str]:
    """The phases of one iteration, in order: eval's and blue's warm starts
    open the run (blue's first where `phases.eval_warmup.after_blue_warmup`)."""
    order = ("blue_warmup", "eval_warmup") if recipe.phases.eval_warmup.after_blue_warmup else ("eval_warmup", "blue_warmup")
    first = [w for w in order if iteration == 1 and getattr(recipe.phases, w).steps]
    return first + list(ROLE_NAMES)


def role_lr(recipe, role: str) -> float:
    return getattr(recipe.phases, role).lr or recipe.grpo.lr


def judge_budget(recipe) -> int:
    """New tokens for a judge's answer (eval judging, the semantic judge,
    eval's own rollouts): the recipe's value, or room for the template's
    brief reasoning before its `Label:` line."""
    if recipe.rewards.judge_max_new_tokens is not None:
        return recipe.rewards.judge_max_new_tokens
    if recipe.rewards.judge_mode == "choice":
        return 16  # unused: the answer is one of the label strings
    return 1024 if recipe.model.enable_thinking else 256


def max_new_tokens_of(recipe, role: str) -> int:
    """Completion budget of a role's rollouts (eval: the judge budget)."""
    if role == "eval":
        return judge_budget(recipe)
    return getattr(recipe.phases, role).max_new_tokens or recipe.grpo.max_new_tokens


def prompts_of(recipe, role: str) -> int:
    return getattr(recipe.phases, role).prompts_per_step or recipe.grpo.prompts_per_step


def group_size_of(recipe, role: str) -> int:
    return getattr(recipe.phases, role).group_size or recipe.grpo.group_size


def temperature_of(recipe, role: str) -> float:
    return getattr(recipe.phases, role).temperature or recipe.grpo.temperature
