"""The one typed recipe: schema, YAML loading, dotted overrides, errors.

Every key a run reads lives here, with its bounds. Unknown keys are errors
(a typo must never be silently ignored), and every error is one line that
names the key, the value and the fix.
"""
from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .control import ControlConfig
from .errors import UserError
from .league import LeagueConfig

ROLE_NAMES = ("red", "blue", "eval")
# eval's three classes (method.md): every module takes them from here
LABELS = CLASSES = ("negative", "rejective", "positive")


class RecipeError(UserError):
    """A recipe problem, worded for the user: key, value, fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Strict):
    base: str = Field("embedded:smollm2-135m", description="hub id, local folder, `embedded:smollm2-135m` or `builtin:tiny-qwen3`")
    dtype: Literal["auto", "float32", "bfloat16", "float16", "float64"] = Field(
        "auto", description="float64: CPU only, for equivalence checks where summation order must not matter")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    trust_remote_code: bool = False
    attn_implementation: str = Field(
        "auto", description="`auto` (flash_attention_2 when installed on CUDA, else sdpa), or any transformers value: sdpa, eager, flash_attention_2"
    )
    quantization: Literal["none", "4bit"] = Field("none", description="4bit: QLoRA (bitsandbytes NF4 base, CUDA only)")
    enable_thinking: bool = False  # Qwen3 chat templates: thinking doubles tokens for no reward
    gradient_checkpointing: bool = False
    fsdp: bool = Field(
        False, description="several processes: shard the base's decoder layers across them (torch FSDP2), for a base that "
        "does not fit one GPU; adapters, embeddings and lm_head stay whole on every rank"
    )
    revision: str | None = None

    @model_validator(mode="after")
    def _quantization_needs_cuda(self) -> "ModelConfig":
        if self.quantization == "4bit" and self.device == "cpu":
            raise ValueError("quantization: 4bit (QLoRA through bitsandbytes) runs on CUDA only; set model.quantization=none on the CPU")
        if self.quantization == "4bit" and self.fsdp:
            raise ValueError("model.fsdp with model.quantization: 4bit: NF4 weights cannot be sharded here; choose one "
                             "(fsdp for a base too big for one GPU, 4bit to fit it on one)")
        return self


class LoraConfig(_Strict):
    rank: int = Field(16, ge=1, le=1024)
    alpha: float = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
    )


class EngineConfig(_Strict):
    backend: Literal["hf", "vllm"] = "hf"
    max_batch_size: int = Field(64, ge=1, description="rows per generate() forward on the hf backend")
    # vLLM only (see engine/vllm.py)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=64)
    enable_sleep_mode: bool = False
    max_loras: int | None = Field(None, ge=1, description="adapters in one vLLM batch; default 4 (base, red, blue, eval) + blue@N defenders")
    max_cpu_loras: int | None = Field(None, ge=1, description="adapters vLLM keeps loaded; default max_loras + 2")


class PhaseConfig(_Strict):
    """One role's phase; sampling keys left empty take grpo's values (red's
    prompts are short, blue's answers long: give each its own budget)."""

    steps: int = Field(1, ge=0)
    lr: float | None = Field(None, gt=0, description="overrides grpo.lr for this role")
    max_new_tokens: int | None = Field(None, ge=1, description="this role's completions (blue's also bound defenders' answers)")
    group_size: int | None = Field(None, ge=2, description="completions per prompt in this phase")
    prompts_per_step: int | None = Field(None, ge=1, description="prompts (eval: labelled pairs) per step in this phase")
    temperature: float | None = Field(None, gt=0)
    objective: Literal["grpo", "sft", "sft+grpo"] = Field(
        "grpo", description="eval only: GRPO on the panel's labels (the paper), cross-entropy on them over the forced label "
        "set (supervised.py), or both in one update"
    )
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="eval only: label smoothing of the cross-entropy objective")


class WarmupConfig(_Strict):
    """Eval's warm start: before iteration 1's P_red, the bare base (red and
    blue are still untrained) answers `pairs` seed prompts, harmful and
    benign, the expert panel labels them, and eval takes `steps` GRPO steps
    on those labels, so red's and blue's first rewards do not come from an
    evaluator that has learnt nothing."""

    steps: int = Field(0, ge=0)
    pairs: int = Field(32, ge=2, description="(prompt, answer) pairs the panel labels before the warm start trains")
    objective: Literal["grpo", "sft", "sft+grpo"] = Field(
        "sft", description="as phases.eval.objective; the cross-entropy by default: a stable start from few labels"
    )
    answer_styles: list[Literal["blue", "refuse", "guide", "comply"]] = Field(
        default_factory=lambda: ["blue", "refuse", "guide", "comply"], min_length=1,
        description="system prompts the untrained blue answers the warm start's prompts under (templates.yaml "
        "warmup_styles): its own, and asked to refuse, to refuse with safe guidance, to comply, so that eval meets every "
        "class before its first judgement (a small base almost never refuses on its own)"
    )


class PhasesConfig(_Strict):
    red: PhaseConfig = Field(default_factory=lambda: PhaseConfig(steps=200))
    blue: PhaseConfig = Field(default_factory=lambda: PhaseConfig(steps=50))
    eval: PhaseConfig = Field(default_factory=lambda: PhaseConfig(steps=50))
    eval_warmup: WarmupConfig = Field(default_factory=WarmupConfig)


class GrpoConfig(_Strict):
    group_size: int = Field(4, ge=2, description="completions per prompt (GRPO needs >= 2)")
    prompts_per_step: int = Field(4, ge=1)
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    clip_epsilon: float = Field(0.2, gt=0)
    clip_epsilon_high: float | None = Field(None, gt=0, description="DAPO clip-higher; defaults to clip_epsilon")
    beta: float = Field(0.01, ge=0)
    loss_type: Literal["grpo", "dr_grpo", "token_mean"] = Field(
        "grpo", description="grpo: mean per sequence, then over sequences; dr_grpo: Dr. GRPO (sum / (sequences x max_new_tokens), "
        "advantages not divided by the group's std); token_mean: DAPO's token-level loss (pair with clip_epsilon_high)"
    )
    scale_rewards: Literal["group", "batch", "none"] | None = Field(
        None, description="what advantages are divided by: the group's reward std (group), the whole batch's (batch, "
        "PPO-Lite), or nothing (none, Dr. GRPO); default group, none for dr_grpo; true/false mean group/none"
    )
    min_reward_std: float = Field(
        0.0, ge=0, description="a group whose rewards spread less than this (std) counts as all-equal: advantage 0 "
        "(soft labels differing by 1e-3 would otherwise get advantages of +-1 after scaling)"
    )
    drop_flat_groups: bool = Field(
        False, description="all-equal groups leave the loss and its normaliser (DAPO's dynamic-sampling filter): they "
        "neither dilute the step nor pull towards the base through KL alone"
    )
    mask_truncated: bool = Field(
        False, description="completions cut at max_new_tokens (no end of sequence) take no part in the loss, as TRL's "
        "mask_truncated_completions"
    )
    kl_clamp: float | None = Field(
        10.0, gt=0, description="per-token k3 KL estimate clamped to at most this (verl); null: unclamped"
    )
    warmup_steps: int = Field(0, ge=0, description="each role's learning rate rises linearly over its first N optimizer steps")
    grad_accumulation: int = Field(1, ge=1, description="at least this many micro-batches per step")
    max_tokens_per_microbatch: int | None = Field(
        16384, ge=1, description="padded tokens per forward/backward: micro-batches are cut to fit, so activation memory is "
        "bounded whatever the lengths (a longer single row goes alone); null: grad_accumulation alone decides"
    )
    forward: Literal["auto", "shared_prompt", "full_sequence"] = Field(
        "auto", description="auto: each prompt once per group (KV cache) unless gradient checkpointing forbids it"
    )
    logprob_kernel: Literal["auto", "chunked", "liger"] = Field(
        "auto", description="auto: liger-kernel's fused linear cross-entropy when installed on CUDA (checked on first use), else chunked"
    )
    logprob_chunk_tokens: int = Field(512, ge=1, description="tokens per chunk of vocabulary logits (memory ~ 4 x chunk x vocab x 4 bytes)")
    updates_per_batch: int = Field(1, ge=1, le=16, description="policy updates per rollout batch (TRL's num_iterations)")
    max_grad_norm: float = Field(1.0, gt=0)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(256, ge=1)
    max_nonfinite_steps: int = Field(3, ge=1, description="stop after this many NaN/inf steps in a row")


    @field_validator("loss_type", mode="before")
    @classmethod
    def _named_for_what_it_is(cls, v):
        if v == "dapo":
            raise ValueError("`dapo` is DAPO's token-level loss plus clip-higher, dynamic sampling and overlong shaping; "
                             "lora-triplay implements the first two: loss_type=token_mean with grpo.clip_epsilon_high")
        return v

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _booleans_as_before(cls, v):
        return {True: "group", False: "none"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _dr_grpo_does_not_scale(self) -> "GrpoConfig":
        if self.scale_rewards is None:
            object.__setattr__(self, "scale_rewards", "none" if self.loss_type == "dr_grpo" else "group")
        elif self.scale_rewards != "none" and self.loss_type == "dr_grpo":
            raise ValueError(f"grpo.scale_rewards = {self.scale_rewards} with loss_type dr_grpo: Dr. GRPO removes the std "
                             "scaling; drop scale_rewards or use loss_type grpo")
        return self


class RewardsConfig(_Strict):
    red_class_values: dict[str, float] = Field(default_factory=lambda: {"negative": 1.0, "rejective": 0.0, "positive": 0.0})
    blue_class_values: dict[str, float] = Field(default_factory=lambda: {"negative": -1.0, "rejective": 0.0, "positive": 1.0})
    blue_benign_class_values: dict[str, float] | None = Field(
        None, description="blue's class values on benign requests (the benign stream); default blue_class_values. "
        "A lower `rejective` here makes an over-refusal cost what it costs a user"
    )
    success_class: Literal["negative", "rejective", "positive"] = "negative"
    semantic: bool = True
    semantic_value: float = 1.0
    w_bleu: float = Field(2.0, ge=0)
    w_cos: float = Field(4.0, ge=0)
    k: float = Field(math.log(11 / 6), gt=0)
    ngram_orders: list[int] = Field(default_factory=lambda: [3, 4, 5], min_length=1)
    embedding_model: str = "embedded:all-minilm-l6-v2"
    judge_mode: Literal["generate", "choice"] = Field(
        "generate",
        description="generate: eval writes free text ending in `Label: ...` (the paper); "
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
    blue_judge: str = Field(
        "eval", description="who labels blue's answers for its reward: `eval` (the eval adapter, the paper), `rules` "
        "(the refusal rules, which know whether a request was harmful or benign), `panel` (the expert panel of "
        "`experts:`), or `openai:MODEL@URL` (an OpenAI-compatible endpoint, e.g. a guard model); a fixed judge is the "
        "baseline self-play must beat"
    )
    degenerate_penalty: float = Field(
        0.0, ge=0, description="subtracted from blue's reward for a degenerate answer (judging/quality.py: looping or "
        "near-empty text, which satisfies a refusal rule without being an answer)"
    )

    @field_validator("blue_judge")
    @classmethod
    def _judge(cls, v: str) -> str:
        from .judging.fixed import JudgeError, is_endpoint, parse_endpoint

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
        from .judging.fixed import JudgeError, is_endpoint, parse_endpoint

        if v is not None and is_endpoint(v):
            try:
                parse_endpoint(v)
            except JudgeError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str, info) -> str:
        from .snapshots import SpecError, parse_spec

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
    pool_cap: int = Field(4096, ge=16, description="pairs kept in memory per reservoir (current iteration, older ones)")
    balance_classes: bool = Field(
        False, description="eval's training batches draw each panel label equally often (a small eval otherwise learns the prior)"
    )
    heldout_share: float = Field(
        0.1, ge=0, le=0.5, description="share of the panel-labelled pairs kept out of eval's training: after each eval phase "
        "eval labels them (accuracy, per-class recall, predicted labels, calibration error in metrics.jsonl)"
    )
    gold_pairs: str | None = Field(
        None, description="a JSONL file of labelled answers (prompt, response, label; kind optional) eval is checked "
        "against after its warm start and every P_eval, never trained on (`phase: eval_gold` rows)"
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


class RunConfig(_Strict):
    root: str = "adapters"
    name: str | None = None
    log_every: int = Field(1, ge=1)
    report_to: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"], description="metrics.jsonl always; also TensorBoard and/or Weights & Biases"
    )
    checkpoint_every: int = Field(
        1, ge=1, description="commit (adapter + optimizer + state.json) every N steps; the end of a phase always commits"
    )
    transcripts: int = Field(2, ge=0, description="sampled transcripts kept per step")


class Recipe(_Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    iterations: int = Field(1, ge=1)
    phases: PhasesConfig = Field(default_factory=PhasesConfig)
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    defenders: list[DefenderConfig] = Field(default_factory=lambda: [DefenderConfig(name="blue", weight=1.0), DefenderConfig(name="base", weight=0.5)])
    experts: ExpertsConfig = Field(default_factory=ExpertsConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    control: ControlConfig = Field(default_factory=ControlConfig)  # beyond the paper: control.py
    league: LeagueConfig = Field(default_factory=LeagueConfig)  # beyond the paper: league.py
    seed: int = 0
    # the self-play game (lora_triplay/games/): triplay's settings are the
    # sections above; another game reads `game_config`, checked by its Config
    game: str = Field("triplay", description="the game played: a module of lora_triplay/games/")
    game_config: dict[str, Any] = Field(default_factory=dict, description="the game's own settings (its Config)")

    @model_validator(mode="after")
    def _check_game(self) -> "Recipe":
        from pydantic import ValidationError

        from .games import game_class

        cls = game_class(self.game)
        try:
            cls.Config.model_validate(self.game_config)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ValueError(f"game_config.{where}: {err['msg']} (game {self.game})") from None
        return self

    @model_validator(mode="after")
    def _check(self) -> "Recipe":
        names = [d.name for d in self.defenders]
        if not names:
            raise ValueError("defenders: at least one defender is needed (e.g. `- {name: blue, weight: 1.0}`)")
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"defenders: names must be unique, got {names}; remove the repeated {dup}")
        for role in ("red", "blue"):
            phase = getattr(self.phases, role)
            if phase.objective != "grpo" or phase.label_smoothing:
                raise ValueError(f"phases.{role}: objective and label_smoothing are eval's (a supervised judge); {role} trains with GRPO")
        if self.phases.eval.max_new_tokens is not None:
            raise ValueError("phases.eval.max_new_tokens: eval's answers are judgements; their length is rewards.judge_max_new_tokens (one budget for judging and for eval's training)")
        if self.experts.safety_experts + int(self.experts.rule_based) == 0:
            raise ValueError("experts: the panel is empty; enable rule_based or set safety_experts >= 1")
        voters = self.experts.safety_experts * len(self.experts.models) + int(self.experts.rule_based)
        if self.experts.min_votes > voters:
            raise ValueError(f"experts.min_votes = {self.experts.min_votes} but the panel has {voters} safety voters; "
                             f"lower experts.min_votes or add experts")
        return self

    def phases_of(self, iteration: int) -> list[str]:
        """The phases of one iteration, in order: eval's warm start opens the run."""
        first = ["eval_warmup"] if iteration == 1 and self.phases.eval_warmup.steps else []
        return first + list(ROLE_NAMES)

    def phase_steps(self, phase: str) -> int:
        return self.phases.eval_warmup.steps if phase == "eval_warmup" else getattr(self.phases, phase).steps

    def role_lr(self, role: str) -> float:
        return getattr(self.phases, role).lr or self.grpo.lr

    def max_new_tokens_of(self, role: str) -> int:
        """Completion budget of a role's rollouts (eval: the judge budget)."""
        if role == "eval":
            return self.judge_budget()
        return getattr(self.phases, role).max_new_tokens or self.grpo.max_new_tokens

    def prompts_of(self, role: str) -> int:
        return getattr(self.phases, role).prompts_per_step or self.grpo.prompts_per_step

    def group_size_of(self, role: str) -> int:
        return getattr(self.phases, role).group_size or self.grpo.group_size

    def temperature_of(self, role: str) -> float:
        return getattr(self.phases, role).temperature or self.grpo.temperature

    def phase_group_sizes(self) -> list[int]:
        return [self.group_size_of(role) for role in ROLE_NAMES]

    def longest_completion(self) -> int:
        return max(self.max_new_tokens_of(role) for role in ROLE_NAMES)

    def judge_budget(self) -> int:
        """New tokens for a judge's answer (eval judging, the semantic judge,
        eval's own rollouts): the recipe's value, or room for the template's
        brief reasoning before its `Label:` line."""
        if self.rewards.judge_max_new_tokens is not None:
            return self.rewards.judge_max_new_tokens
        if self.rewards.judge_mode == "choice":
            return 16  # unused: the answer is one of the label strings
        return 1024 if self.model.enable_thinking else 256

    def dump(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------- loading

def _parse_scalar(text: str) -> Any:
    """`key=value` values are YAML scalars/flow collections: 2, 1e-5, true, [a, b]."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_override(data: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise RecipeError(f"override {override!r} is not `key=value`; write e.g. `phases.red.steps=2`")
    key, _, raw = override.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise RecipeError(f"override {override!r} has an empty key; write e.g. `iterations=2`")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise RecipeError(f"override {override!r}: `{part}` is a value, not a section")
        node = child
    node[parts[-1]] = _parse_scalar(raw.strip())


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """Valid keys at the location of an `extra_forbidden` error, for suggestions."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        current = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _format_error(err: dict[str, Any], source: str) -> str:
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc if p not in ("function-after",)) or "(recipe)"
    if err["type"] == "extra_forbidden":
        valid = _field_names(Recipe, loc)
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"did you mean `{'.'.join(map(str, loc[:-1] + (close[0],)))}`?" if close else f"valid keys here: {', '.join(valid)}"
        return f"{source}: unknown key `{key}`; {hint}"
    value = err.get("input")
    shown = repr(value) if not isinstance(value, dict) else "{...}"
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:  # a whole-recipe check: its message names the keys itself
        return f"{source}: {msg}"
    if err["type"] == "model_type":
        msg = "must be a section of `key: value` lines, not a single value"
    return f"{source}: `{key}` = {shown} is invalid: {msg}"


def build_recipe(data: dict[str, Any], source: str = "recipe") -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        lines = [_format_error(e, source) for e in exc.errors()]
        raise RecipeError(lines[0] if len(lines) == 1 else "\n".join(lines)) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        hint = " (recipes live in recipes/, e.g. recipes/smoke.yaml)" if not path.suffix else ""
        raise RecipeError(f"recipe file {str(path)!r} does not exist{hint}; check the path")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise RecipeError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text; save the recipe as UTF-8") from None
    if data is None or data == {}:
        raise RecipeError(f"{path}: the recipe is empty (it would run on defaults alone); copy recipes/smoke.yaml and edit it")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: the top level must be a mapping of keys (model:, lora:, ...), got {type(data).__name__}")
    return data


def merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """`child` over `base`, section by section (a list or a value replaces)."""
    out = dict(base)
    for key, value in child.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_recipe_data(path: str | Path, overrides: list[str] | tuple[str, ...] = (), _seen: tuple = ()) -> dict[str, Any]:
    """The recipe's keys: its `extends:` chain merged (a path relative to the
    file; the file's own keys win), then the dotted overrides."""
    path = Path(path)
    if path.resolve() in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path.resolve()))
        raise RecipeError(f"{path}: `extends` goes round in a circle ({chain}); remove one of them")
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise RecipeError(f"{path}: `extends` must be one recipe path (relative to this file), got {parent!r}")
        data = merge(load_recipe_data(path.parent / parent, (), (*_seen, path.resolve())), data)
    for override in overrides:
        apply_override(data, override)
    return data


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    data = load_recipe_data(path, overrides)
    return build_recipe(data, source=str(path))


def diff_recipes(old: Recipe, new: Recipe) -> list[str]:
    """Dotted keys whose values differ, as `key: old -> new` (for resume checks)."""
    out: list[str] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else key)
        elif a != b:
            out.append(f"{prefix}: {a!r} -> {b!r}")

    walk(old.model_dump(mode="json"), new.model_dump(mode="json"), "")
    return out
