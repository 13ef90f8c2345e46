"""TriPlay's `phases:` section: each role's phase (steps, rate, sampling,
eval's objective, blue's group options) and the warm starts of eval and
blue. Part of the TriPlay sections (config.py), which re-exports these.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..recipe import _Strict


class PhaseConfig(_Strict):
    """One role's phase; sampling keys left empty take grpo's values (red's
    prompts are short, blue's answers long: give each its own budget)."""

    steps: int = Field(1, ge=0)
    lr: float | None = Field(None, gt=0, le=1.0, description="overrides grpo.lr for this role")
    max_new_tokens: int | None = Field(None, ge=1, description="this role's completions (blue's also bound defenders' answers)")
    group_size: int | None = Field(None, ge=2, description="completions per prompt in this phase")
    prompts_per_step: int | None = Field(None, ge=1, description="prompts (eval: labelled pairs) per step in this phase")
    temperature: float | None = Field(None, gt=0)
    min_reward_std: float | None = Field(
        None, ge=0, description="overrides grpo.min_reward_std for this role (red's groups and blue's spread differently)"
    )
    objective: Literal["grpo", "sft", "sft+grpo"] = Field(
        "grpo", description="eval only: GRPO on the panel's labels (the paper), cross-entropy on them over the forced label "
        "set (supervised.py), or both in one update"
    )
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="eval only: label smoothing of the cross-entropy objective")
    greedy_member: bool = Field(
        False, description="blue only: one answer of each group decoded greedily, the answer a user gets at temperature 0, "
        "so the judge and the degenerate penalty also see the mode (a small blue's sampled answers rarely loop while its "
        "greedy ones do)"
    )
    refusal_anchor: Literal["refuse", "guide"] | None = Field(
        None, description="blue only: one answer of each harmful request's group is blue's own continuation of a refusal "
        "opening (templates.yaml warmup_openings: `guide` declines and offers a safe alternative), so the group holds a "
        "refusal for the judge to pay. Why: in the eighth evidence run (2026-12-04) blue's groups of 8 for plainly asked "
        "harmful requests held 0 refusals of 16 by iteration 3; a group that all complies has no advantage, so blue "
        "learnt to refuse red's wrappers but not the requests"
    )
    refusal_anchor_benign: bool = Field(
        False, description="blue only, with refusal_anchor: the benign groups take an anchored refusal too, one the judge "
        "should not pay. Off: in the tenth evidence run (bench/results/evidence-anchor2/) the benign anchors' advantage "
        "(-1.5 to -2.0) outweighed the harmful ones' (+0.3 to +1.1) on one opening, and blue stopped refusing"
    )
    twin_groups: bool = Field(False, description="blue only: a step's harmful seed requests bring their benign topic twins "
        "(prompts/twins.yaml, or a benign file's twin_of) into their GRPO groups, so a refused twin scores below a refused "
        "harmful request even where each wording's answers all refuse (a flat group alone). Off: eval paid blue's harmful "
        "answers ~1.7 below its benign ones, and blue stopped refusing (bench/BENCHMARKS.md, main-twin-s0)")


class WarmupConfig(_Strict):
    """Eval's warm start: the untrained blue answers `pairs` seed prompts, harmful and benign, the panel
    labels them and eval learns them, so that red's and blue's first rewards come from a judge."""

    steps: int = Field(0, ge=0)
    pairs: int = Field(32, ge=2, description="(prompt, answer) pairs the panel labels before the warm start trains")
    lr: float | None = Field(
        None, gt=0, le=1.0, description="the warm start's learning rate (default phases.eval.lr, else grpo.lr): a supervised "
        "start from few labels tolerates a larger rate than eval's later steps on the moving pool"
    )
    lr_end: float | None = Field(
        None, ge=0, le=1.0, description="the rate of the warm start's last step, reached linearly from `lr` (default: `lr` "
        "throughout). Why: at a constant 1e-3 on batches of 8 the last few batches decide where eval ends; one seed's "
        "warm start gave 68% on the labelled set with one batch order and 61% with another (`negative` recall 89% "
        "against 11%, 2026-12-03)"
    )
    average_last: int = Field(
        0, ge=0, description="eval ends its warm start on the mean of its weights after the last N steps (tail "
        "averaging; 0: the last step's weights). Why: the same answer, not the last batches, decides where eval starts "
        "(measurement: recipes/cpu-evidence.yaml)"
    )
    draws: int = Field(
        1, ge=1, le=16, description="train the warm start this many times on the same pool, each from eval's first weights "
        "with a fresh optimizer and a batch order of its own, and keep the draw whose held-out slice recalls the most "
        "harmful compliances (`negative`; ties: its accuracy, then the earlier draw; eval_draws.py). Costs up to `draws` "
        "times the warm start's updates. Why: the after-blue warm start on one seed's 728 pairs read the labelled set at "
        "23.3 to 96.7 with the batch order alone. Written down before six new draws, this rule kept one that met the "
        "issue's target on each seed (86.7, 96.7), where a draw picked at random would on both about a fifth of the time; "
        "but one draw at recall 1.0 read 45.8 (`positive` recall 19), passed over for its lower slice accuracy alone "
        "(2026-12-07, bench/results/evidence-eval-after-blue/). Off: measured on the after-blue warm start only")
    draw_enough: float | None = Field(
        None, ge=0, le=1, description="with draws > 1: stop drawing once a draw's held-out slice recalls at least this share "
        "of the harmful compliances (None: train every draw)")
    objective: Literal["grpo", "sft", "sft+grpo"] = Field(
        "sft", description="as phases.eval.objective; the cross-entropy by default: a stable start from few labels")
    benign_share: float | None = Field(
        None, ge=0, le=1, description="share of the warm start's requests that are benign (None: half, where the "
        "stream has benign requests; data.benign_share=0 gives none). Why an option: eval warm-started on answers to "
        "harmful requests alone read blue's refusals as refusals where the recipe's half-benign start called most of them "
        "compliances (bench/BENCHMARKS.md, \"What eval's warm start is made of\", 2026-12-07)"
    )
    after_blue_warmup: bool = Field(
        False, description="eval's warm start runs after blue's (default: before), so the answers it learns in blue's own "
        "style (`blue` in answer_styles) are the warm-started blue's refusals with guidance and its over-refusals, which "
        "blue's GRPO phases then ask eval to read; the other styles are still the bare base's. Answered by the "
        "warm-started blue (seed 0, 2026-12-07), 14 of the 273 styled answers to harmful requests were plain refusals "
        "(`rejective`; the bare base's: 84), and eval recalled 13% of the labelled set's `rejective` answers. Why an "
        "option: the recipe's eval, warm-started on the untrained blue's answers, paid blue's refusals of harmful "
        "requests -0.04 on one seed's draw and +0.69 on the other's (bench/results/eval-cross/, 2026-12-07): whether "
        "eval can read them was left to the draw. Measured 2026-12-07 (bench/results/evidence-eval-after-blue/): "
        "seed 0's eval misread 1.5-8.4% of blue's refusals (the recipe's 97-100%), seed 1's read the labelled set at "
        "44.2 after its warm start: off. That was seed 1's batch order: three others of the same pairs read 71.7-81.7, "
        "and five others on seed 0 23.3-95.0 (after-blue-orders-seed-*.json there)"
    )
    answer_styles: list[Literal["blue", "refuse", "guide", "comply"]] = Field(
        default_factory=lambda: ["blue", "refuse", "guide", "comply"], min_length=1,
        description="system prompts the untrained blue answers the warm start's prompts under (templates.yaml "
        "warmup_styles): its own, and asked to refuse, to refuse with safe guidance, to comply, so that eval meets every "
        "class before its first judgement (a small base almost never refuses on its own)"
    )


class BlueWarmupConfig(_Strict):
    """Blue's warm start (blue_warmup.py): the untrained blue's guided refusals
    of harmful requests and answers to benign ones that the rule expert calls
    `positive`, learnt under its own system prompt, so that its GRPO groups
    hold refusals for a judge to pay."""

    steps: int = Field(0, ge=0, description="cross-entropy steps (0: no warm start)")
    prompts: int = Field(64, ge=2, description="requests answered, harmful and benign as data.benign_share splits them")
    candidates: int = Field(2, ge=1, le=16, description="answers sampled per request; the first the rule expert keeps is learnt")
    prompts_per_step: int = Field(8, ge=1, description="kept answers per step")
    harmful_share: float = Field(0.5, ge=0, le=1, description="of each step's kept answers, the share of refusals to harmful "
                                 "requests (the rest helpful answers to benign ones), where both kinds were kept")
    temperature: float = Field(0.7, gt=0, description="sampling temperature of the candidates")
    lr: float | None = Field(None, gt=0, le=1.0, description="the warm start's rate (default phases.blue.lr, else grpo.lr)")
    refusal_contrast: bool = Field(False, description="each benign answer of a batch is also learnt against a refusal "
                                   "(one of the kept ones, to another request): cross-entropy over the two answers' "
                                   "sequence log-probs, which pushes a refusal below the answer where it competes "
                                   "(over-refusal) and costs nothing where it does not")
    benign_opening: str = Field("", description="words every kept benign answer starts with (forced while sampling, learnt "
                                "with it), e.g. 'Sure!', so blue's first token chooses between two openings; on the 135M base "
                                "(2026-12-03) blue then refused harmful and benign requests alike (bench/refusal_margin.py)")
    decision_requests: int = Field(0, ge=0, description="requests (as data.benign_share splits them) on which blue learns whether "
                                   "to open with the refusal: learnt where harmful, unlearnt where benign (blue_decision.py); 0: off")
    decision_per_step: int = Field(16, ge=1, description="of those, how many each warm-start step learns")
    decision_tokens: int = Field(8, ge=1, le=64, description="how many tokens of the refusal's opening the decision reads")
    decision_own_opening: bool = Field(False, description="each benign request's own opening (the untrained blue's greedy "
                                       "one) learnt as well, so another first token is the likeliest (blue_decision.py)")
    decision_wrapped: bool = Field(False, description="the decision's harmful requests asked as blue's steps ask them (some "
                                   "wrapped by red); default: as written, so a wrap's form is no label (blue_decision.py)")


class PhasesConfig(_Strict):
    red: PhaseConfig = Field(default_factory=lambda: PhaseConfig(steps=200))
    blue: PhaseConfig = Field(default_factory=lambda: PhaseConfig(steps=50))
    eval: PhaseConfig = Field(default_factory=lambda: PhaseConfig(steps=50))
    eval_warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    blue_warmup: BlueWarmupConfig = Field(default_factory=BlueWarmupConfig)
