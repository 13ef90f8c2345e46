"""The one typed recipe: schema, YAML loading, dotted overrides, errors.

Every key a run reads is declared with its bounds: the core's sections here
(model, lora, engine, grpo, run), each game's in its own package (TriPlay's
phases, rewards, defenders, experts, data, control and league in
triplay/config.py), joined into one strict schema per game. Unknown keys are
errors (a typo must never be silently ignored), and every error is one line
that names the key, the value and the fix.
"""
from __future__ import annotations

import difflib
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

from .errors import UserError


class RecipeError(UserError):
    """A recipe problem, worded for the user: key, value, fix."""


# the bases that ship or are built here (bases.py resolves them)
BUILT_IN_BASES = ("embedded:smollm2-135m", "builtin:tiny-qwen3")


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

    @field_validator("base")
    @classmethod
    def _named(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("is empty: name a hub id (Qwen/Qwen3-4B), a local folder or embedded:smollm2-135m")
        if v.split(":", 1)[0] in ("embedded", "builtin") and v not in BUILT_IN_BASES:
            raise ValueError(f"{v!r} is not a built-in base; known: {', '.join(BUILT_IN_BASES)}")
        return v

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
    layers: list[int] | None = Field(
        None, description="the decoder layers (0-based) that carry LoRA, as a list or a range `A-B` (both included); "
        "default: every layer. Why one might: a linear probe on the frozen 135M base (bench/harm_probe.py) tells "
        "harmful from benign requests at AUC 0.84-0.88 from the hidden states after layers 18, 24 and 30 of 30, at "
        "0.69-0.77 after layers 6 and 12; measured on blue's warm start (2026-12-04, bench/BENCHMARKS.md), the upper "
        "half or third did not sharpen when blue refuses (AUC 0.71 against 0.73)")

    @field_validator("layers", mode="before")
    @classmethod
    def _layer_range(cls, v):
        if isinstance(v, str):
            first, sep, last = v.partition("-")
            if not (sep and first.strip().isdigit() and last.strip().isdigit()) or int(first) > int(last):
                raise ValueError(f"lora.layers = {v!r}: write a range `A-B` with A <= B (e.g. 15-29) or a list [15, 16, ...]")
            return list(range(int(first), int(last) + 1))
        return v

    @field_validator("layers")
    @classmethod
    def _layers_valid(cls, v):
        if v is None:
            return v
        if not v or min(v) < 0 or len(set(v)) != len(v):
            raise ValueError(f"lora.layers = {v}: give distinct layer indices >= 0 (or leave it unset for every layer)")
        return sorted(v)

    def layers_beyond(self, depth: int) -> str | None:
        """What is wrong with `layers` on a base of `depth` decoder layers, or None (run and plan both ask)."""
        if self.layers is not None and max(self.layers) >= depth:
            return f"lora.layers = {self.layers}: this base has {depth} decoder layers (0-{depth - 1}); pick indices below {depth}"
        return None


class EngineConfig(_Strict):
    backend: Literal["hf", "vllm"] = "hf"
    max_batch_size: int = Field(64, ge=1, description="rows per generate() forward on the hf backend")
    # vLLM only (see engine/vllm.py)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=64)
    enable_sleep_mode: bool = False
    share_base: Literal["auto", True, False] = Field(
        "auto", description="vllm: the trainer's base is vLLM's own weights (one copy); auto: where supported "
        "(engine/shared_base.py), with a log line saying why not otherwise")
    max_loras: int | None = Field(None, ge=1, description="adapters in one vLLM batch; default 4 (base, red, blue, eval) + blue@N defenders")
    max_cpu_loras: int | None = Field(None, ge=1, description="adapters vLLM keeps loaded; default max_loras + 2")


class GrpoConfig(_Strict):
    group_size: int = Field(4, ge=2, description="completions per prompt (GRPO needs >= 2)")
    prompts_per_step: int = Field(4, ge=1)
    lr: float = Field(1e-5, gt=0, le=1.0)  # Adam moves each weight by ~lr a step: above 1, every step overshoots
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
    snapshot_optimizer: bool = Field(
        False, description="each role's iteration snapshot also keeps its optimizer state (Adam's moments: ~2x the adapter), "
        "so one phase can be replayed as the run ran it (bench/eval_phase_replay.py)"
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v  # `run.report_to=wandb` means [wandb]


class Recipe(_Strict):
    """The sections every run has; a game adds its own (its `Sections`,
    e.g. TriPlay's phases, rewards, defenders...) and the class that checks
    a recipe is the two together (`recipe_class`)."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    iterations: int = Field(1, ge=1)
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    seed: int = 0
    # the self-play game (lora_triplay/games/): TriPlay's settings are its own
    # top-level sections; another game reads `game_config`, checked by its Config
    game: str = Field("triplay", description="the game played: triplay, or a module of lora_triplay/games/")
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

    def dump(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


_CLASSES: dict[str, type[Recipe]] = {}


def recipe_class(game: str) -> type[Recipe]:
    """The schema of a recipe playing `game`: the core sections and the
    game's (games/base.py `Sections`), one strict model."""
    if game not in _CLASSES:
        from .games import game_class

        sections = game_class(game).Sections
        _CLASSES[game] = type("Recipe", (Recipe, sections), {"__module__": __name__})
    return _CLASSES[game]


# ---------------------------------------------------------------- loading

def _parse_scalar(text: str) -> Any:
    """`key=value` values are YAML scalars/flow collections: 2, 1e-5, true, [a, b]."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def override_key(override: str) -> list[str]:
    """The dotted key of a `key=value` override, as its parts."""
    return [p for p in override.partition("=")[0].strip().split(".") if p]


def apply_override(data: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise RecipeError(f"override {override!r} is not `key=value`; write e.g. `phases.red.steps=2`")
    parts, raw = override_key(override), override.partition("=")[2]
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


def _format_error(err: dict[str, Any], source: str, schema: type[BaseModel], overrides: dict[str, str] | None = None) -> str:
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc if p not in ("function-after",)) or "(recipe)"
    # a key an override set (or a section it replaced) is the override's fault, not the file's
    given = next((text for k, text in (overrides or {}).items() if loc and (key == k or key.startswith(k + "."))), None)
    if given is not None:
        source = f"override {given!r} (on {source})"
    if err["type"] == "extra_forbidden":
        valid = _field_names(schema, loc)
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


def build_recipe(data: dict[str, Any], source: str = "recipe", overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    from .games import DEFAULT

    game = data.get("game", DEFAULT) if isinstance(data, dict) else DEFAULT
    try:
        cls = recipe_class(game) if isinstance(game, str) else Recipe
    except UserError as exc:
        raise RecipeError(f"{source}: `game` = {game!r} is invalid: {exc}") from None
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        keys = {".".join(override_key(o)): o for o in overrides}
        lines = [_format_error(e, source, cls, keys) for e in exc.errors()]
        raise RecipeError(lines[0] if len(lines) == 1 else "\n".join(lines)) from None


class _UniqueKeys(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps
    the last one, so the first `iterations:` is silently ignored)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden here, as YAML means
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue  # an unhashable key: the schema refuses it, in its own words
            if key in seen:
                raise RecipeError(f"{self.name}: key `{key}` is given twice (lines {seen[key]} and {key_node.start_mark.line + 1}); "
                                  "keep one")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


EMPTY = "the recipe is empty (it would run on defaults alone); copy recipes/smoke.yaml and edit it"


def read_yaml(path: Path) -> dict[str, Any]:
    """A recipe file's keys (no `extends:` resolved), or one line saying what is wrong with the file."""
    if path.is_dir():
        raise RecipeError(f"{path} is a folder; pass a recipe file, e.g. {path / 'smoke.yaml'}")
    if not path.exists():
        hint = " (recipes live in recipes/, e.g. recipes/smoke.yaml)" if not path.suffix else ""
        raise RecipeError(f"recipe file {str(path)!r} does not exist{hint}; check the path")
    if not path.is_file():
        raise RecipeError(f"{path} is not a regular file (a device or a pipe); pass a recipe file, e.g. recipes/smoke.yaml")
    try:
        loader = _UniqueKeys(path.read_text(encoding="utf-8"))
        loader.name = str(path)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise RecipeError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text; save the recipe as UTF-8") from None
    if data is None or data == {}:
        raise RecipeError(f"{path}: {EMPTY}")
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
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if not data and parent is None:  # `extends: null` alone: as empty as an empty file
        raise RecipeError(f"{path}: {EMPTY}")
    if parent is not None:
        if not isinstance(parent, str):
            raise RecipeError(f"{path}: `extends` must be one recipe path (relative to this file), got {parent!r}")
        if not (path.parent / parent).is_file():
            raise RecipeError(f"{path}: `extends: {parent}` names no recipe file ({path.parent / parent}); the path is "
                              "relative to this recipe")
        data = merge(load_recipe_data(path.parent / parent, (), (*_seen, path.resolve())), data)
    for override in overrides:
        apply_override(data, override)
    return data


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    data = load_recipe_data(path, overrides)
    return build_recipe(data, source=str(path), overrides=overrides)


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
