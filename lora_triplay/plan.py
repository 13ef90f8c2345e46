"""`lora-triplay plan`: will this recipe fit, from the model config alone.

No weights are read: parameter counts come from the config (dense decoder
models: Llama, Qwen, Mistral and their kin), memory from the arithmetic
below. The published Qwen3 4B/8B/14B configs ship in `configs/`, so the
paper recipes plan offline. `run` on CUDA runs the same check before it
loads anything, and refuses a recipe that cannot fit with one line naming
the biggest item and the knob to turn.

What one GPU holds, in two moments of a step:
    rollouts   trainer base + adapters + optimizer state
               + the engine: vLLM's share (its own base copy and KV cache),
                 or the HF engine's KV cache and one step's logits
    update     trainer base + adapters + optimizer state + gradients
               + activations of one micro-batch (+ one log-prob chunk)
               + vLLM asleep (level 1: weights offloaded) or awake
Activations are an estimate (per token per layer, the tensors a backward
keeps, bf16), checked against measured peaks by bench/gpu_check.sh.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .errors import UserError

GB = 1e9
CUDA_CONTEXT_GB = 1.0  # CUDA context, cuBLAS workspaces, allocator slack
VLLM_ASLEEP_GB = 1.0  # what a level-1 sleeping vLLM still holds (CUDA graphs, context)
VLLM_OVERHEAD_GB = 2.0  # vLLM's activations and sampler buffers inside its share
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
SHIPPED = {"qwen/qwen3-4b": "qwen3-4b", "qwen/qwen3-8b": "qwen3-8b", "qwen/qwen3-14b": "qwen3-14b",
           "embedded:smollm2-135m": "smollm2-135m"}


class PlanError(UserError):
    """The model config cannot be planned (one line, with the fix)."""


# ---------------------------------------------------------------- config

@dataclass(frozen=True)
class Shape:
    """What the arithmetic needs of a dense decoder config."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool = False  # Qwen3 normalises queries and keys per head
    architecture: str = ""  # e.g. Qwen3ForCausalLM: whether engine.share_base maps it

    @classmethod
    def from_config(cls, cfg: dict, name: str) -> "Shape":
        outer, cfg = cfg, cfg.get("text_config", cfg)
        try:
            heads = cfg["num_attention_heads"]
            return cls(
                name=name,
                hidden=cfg["hidden_size"],
                intermediate=cfg["intermediate_size"],
                layers=cfg["num_hidden_layers"],
                heads=heads,
                kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                vocab=cfg["vocab_size"],
                tied=bool(cfg.get("tie_word_embeddings", False)),
                qk_norm=str(cfg.get("model_type", "")).startswith("qwen3"),
                architecture=(cfg.get("architectures") or outer.get("architectures") or [""])[0],
            )
        except KeyError as exc:
            raise PlanError(f"{name}: config has no {exc.args[0]!r}; plan knows dense decoder configs (Llama, Qwen, Mistral)") from None

    # LoRA-able linear layers of one block: (in, out)
    def linears(self) -> dict[str, tuple[int, int]]:
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def block_params(self) -> int:
        """One decoder layer: its linears and norms."""
        return sum(a * b for a, b in self.linears().values()) + 2 * self.hidden + 2 * self.head_dim * self.qk_norm

    def params(self) -> int:
        embed = self.vocab * self.hidden
        return self.layers * self.block_params() + embed * (1 if self.tied else 2) + self.hidden

    def linear_params(self) -> int:
        return self.layers * sum(a * b for a, b in self.linears().values())

    def lora_params(self, rank: int, targets: list[str], layers: list[int] | None = None) -> int:
        """LoRA parameters of one adapter; `layers`: lora.layers, already checked against the depth (make_plan)."""
        shapes = self.linears()
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise PlanError(f"lora.target_modules {unknown} are not linear layers plan knows ({', '.join(shapes)})")
        carrying = self.layers if layers is None else len(layers)
        return carrying * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def activation_bytes_per_token_layer(self, rank: int, dtype_bytes: int = 2) -> int:
        """Tensors one block keeps for backward, per token (bf16, plus the
        float32 inputs RMSNorm keeps): norm inputs/outputs, q/k/v after
        projection, norm and rotary, attention output, the MLP's gate, up,
        act(gate) and product, LoRA's rank-sized intermediates."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        elements = 4 * self.hidden + 4 * q + 4 * kv + 4 * self.intermediate + 7 * rank
        return dtype_bytes * elements + 2 * 4 * self.hidden


def load_shape(base: str, revision: str | None = None, trust_remote_code: bool = False) -> Shape:
    """The config of `model.base`: shipped JSON for the paper's bases and
    the embedded model, a local folder's config.json, the tiny model, or a
    hub id already in the local cache."""
    key = base.lower()
    if key in SHIPPED:
        text = resources.files("lora_triplay").joinpath("configs", f"{SHIPPED[key]}.json").read_text()
        return Shape.from_config(json.loads(text), base)
    if base == "builtin:tiny-qwen3" or Path(base).expanduser().is_dir():
        from .bases import resolve_base

        folder = Path(resolve_base(base, revision))
        return Shape.from_config(json.loads((folder / "config.json").read_text()), base)
    from .bases import check_hub_id, looks_like_hub_id

    if looks_like_hub_id(base):
        check_hub_id(base, revision)
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(base, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as exc:  # offline, unknown id
        raise PlanError(f"no config for model.base = {base!r} here ({type(exc).__name__}); give a local model folder, "
                        f"or one of the shipped configs: {', '.join(sorted(SHIPPED))}") from None
    return Shape.from_config(cfg.to_dict(), base)


# ------------------------------------------------------------------ plan

@dataclass
class Item:
    name: str
    gb: float
    knob: str
    moment: str  # "both", "rollouts", "update"


@dataclass
class Plan:
    shape: Shape
    gpus: int
    gpu_gb: float
    params: int
    lora_params: int
    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    paper: dict[str, float] = field(default_factory=dict)

    def peak(self, moment: str) -> float:
        return sum(i.gb for i in self.items if i.moment in ("both", moment))

    @property
    def peak_gb(self) -> float:
        return max(self.peak("rollouts"), self.peak("update"))

    @property
    def fits(self) -> bool:
        return self.peak_gb <= self.gpu_gb and not self.problems

    def refusal(self, source: str) -> str:
        """One line: what does not fit, its biggest item and the knob."""
        resident = sum(i.gb for i in self.items if i.moment == "both")
        if self.problems and resident <= self.gpu_gb:
            return f"{source}: {self.problems[0]}"
        moment = "update" if self.peak("update") >= self.peak("rollouts") else "rollouts"
        biggest = max((i for i in self.items if i.moment in ("both", moment)), key=lambda i: i.gb)
        return (f"{source} needs {self.peak_gb:.1f} GB per GPU ({moment}) but the GPU has {self.gpu_gb:.0f} GB; "
                f"biggest item: {biggest.name} {biggest.gb:.1f} GB; turn {biggest.knob}")

    def as_dict(self) -> dict:
        return {
            "model": self.shape.name, "gpus": self.gpus, "gpu_memory_gb": self.gpu_gb, "params": self.params,
            "lora_params_per_role": self.lora_params,
            "items": [{"name": i.name, "gb": round(i.gb, 3), "moment": i.moment, "knob": i.knob} for i in self.items],
            "peak_rollouts_gb": round(self.peak("rollouts"), 3), "peak_update_gb": round(self.peak("update"), 3),
            "fits": self.fits, "problems": self.problems, "notes": self.notes,
            "paper_layout": {k: round(v, 3) for k, v in self.paper.items()},
        }


def microbatch_tokens(recipe, prompt_tokens: int) -> int:
    """Padded tokens in the largest micro-batch: the rows grad_accumulation
    leaves together, cut to grpo.max_tokens_per_microbatch (one row at least)."""
    from .games import make_game

    g, game = recipe.grpo, make_game(recipe)
    seq = prompt_tokens + game.longest_completion()
    rows = math.ceil(game.largest_batch() / g.grad_accumulation)
    tokens = rows * seq
    if g.max_tokens_per_microbatch:
        tokens = max(min(tokens, g.max_tokens_per_microbatch), seq)
    return tokens


def make_plan(recipe, *, gpus: int = 1, gpu_memory_gb: float = 80.0, prompt_tokens: int = 1024, shape: Shape | None = None) -> Plan:
    if not math.isfinite(gpu_memory_gb):  # the CLI asks for >= 1 GB; the CPU's dry runs plan for 0
        raise PlanError(f"--gpu-memory {gpu_memory_gb}: give the GPU's memory in GB, e.g. 80")
    from .games import make_game

    r, game = recipe, make_game(recipe)
    shape = shape or load_shape(r.model.base, r.model.revision, r.model.trust_remote_code)
    dtype_b = DTYPE_BYTES[r.model.dtype]
    params = shape.params()
    if wrong := r.lora.layers_beyond(shape.layers):
        raise PlanError(wrong)
    lora = shape.lora_params(r.lora.rank, list(r.lora.target_modules), r.lora.layers)
    plan = Plan(shape, gpus, gpu_memory_gb, params, lora)
    add = plan.items.append

    # ---- always resident
    if r.model.quantization == "4bit":
        other = params - shape.linear_params()
        base_gb = (shape.linear_params() * 0.5 * 1.06 + other * 2) / GB  # NF4 + double-quantized scales; rest bf16
        add(Item("base weights (NF4, QLoRA)", base_gb, "a GPU with more memory", "both"))
    elif r.model.fsdp and gpus > 1:
        # sharding.py: decoder layers split across the GPUs, the rest whole;
        # FSDP all-gathers one layer as it runs and prefetches the next
        layers = shape.layers * shape.block_params()
        add(Item(f"base weights: decoder layers, sharded {gpus} ways (model.fsdp)", layers * dtype_b / gpus / GB, "more GPUs", "both"))
        add(Item("base weights kept whole (embeddings, lm_head, final norm)", (params - layers) * dtype_b / GB, "a smaller base", "both"))
        add(Item("FSDP all-gathered layers (the running one + the prefetched one)", 2 * shape.block_params() * dtype_b / GB,
                 "nothing to turn", "both"))
    else:
        add(Item(f"base weights ({r.model.dtype if r.model.dtype != 'auto' else 'bfloat16'})", params * dtype_b / GB,
                 "model.fsdp=true with several GPUs, model.quantization=4bit (QLoRA) or a smaller base", "both"))
    snapshots, roles = game.extra_adapters(), len(game.roles)
    add(Item(f"LoRA adapters ({roles} roles + {snapshots} snapshot{'s' * (snapshots != 1)}, fp32)", (roles + snapshots) * lora * 4 / GB,
             "lora.rank", "both"))
    add(Item("optimizer state (AdamW, active role; others offloaded to CPU)", 2 * lora * 4 / GB, "lora.rank", "both"))
    add(Item("CUDA context and allocator slack", CUDA_CONTEXT_GB, "nothing to turn", "both"))

    # ---- the update
    tokens = microbatch_tokens(r, prompt_tokens)
    per_layer = shape.activation_bytes_per_token_layer(r.lora.rank, dtype_b)
    add(Item("gradients (active adapter, fp32)", lora * 4 / GB, "lora.rank", "update"))
    if r.model.gradient_checkpointing:
        act = tokens * (shape.layers * shape.hidden * dtype_b + 2 * per_layer)
        add(Item(f"activations, checkpointed ({tokens:,} tokens per micro-batch)", act / GB, "grpo.max_tokens_per_microbatch", "update"))
    else:
        act = tokens * shape.layers * per_layer
        add(Item(f"activations, no checkpointing ({tokens:,} tokens per micro-batch)", act / GB,
                 "model.gradient_checkpointing=true or grpo.max_tokens_per_microbatch", "update"))
    chunk = r.grpo.logprob_chunk_tokens
    add(Item(f"log-prob chunk ({chunk} tokens x {shape.vocab:,} vocab, fp32)", 4 * chunk * shape.vocab * 4 / GB,
             "grpo.logprob_chunk_tokens", "update"))
    plan.notes.append(
        f"unchunked log-probs would need {tokens * shape.vocab * 4 * 2 / GB:,.1f} GB for this micro-batch (logits + log-softmax, fp32)"
    )
    plan.notes.append("activations ~ {:.0f} KB per token per layer without checkpointing, {:.0f} KB with".format(
        per_layer / 1e3, shape.hidden * dtype_b / 1e3))

    # ---- the engine
    seq = prompt_tokens + game.longest_completion()
    kv_tok = shape.kv_bytes_per_token(dtype_b)
    if r.engine.backend == "vllm":
        tp = r.engine.tensor_parallel_size
        share = r.engine.gpu_memory_utilization * gpu_memory_gb
        vllm_weights = params * dtype_b / tp / GB
        kv_gb = share - vllm_weights - VLLM_OVERHEAD_GB
        sharing = _plan_sharing(r, shape, gpus, plan)
        # Shared: vLLM's share holds the one base copy, already counted as the
        # trainer's base weights above; only the rest of the share is new.
        copy = 0.0 if sharing else vllm_weights
        counted = max(share - (vllm_weights if sharing else 0.0), 0.0)  # a share below the base holds no KV cache (the verdict says so)
        what = ("less the shared base: KV cache + vLLM's overhead" if sharing
                else f"base copy {vllm_weights:.1f} GB + KV cache + vLLM's overhead")
        add(Item(f"vLLM share (gpu_memory_utilization {r.engine.gpu_memory_utilization}, {what})", counted,
                 "engine.gpu_memory_utilization", "rollouts"))
        if r.engine.enable_sleep_mode:
            asleep = "KV cache released; the shared weights stay" if sharing else "level 1: weights offloaded, KV cache freed"
            add(Item(f"vLLM asleep ({asleep})", VLLM_ASLEEP_GB, "nothing to turn", "update"))
        else:
            add(Item("vLLM awake during the update (engine.enable_sleep_mode: false)", counted, "engine.enable_sleep_mode=true", "update"))
        free_at_start = gpu_memory_gb - sum(i.gb for i in plan.items if i.moment == "both")
        most = free_at_start + (vllm_weights if sharing else 0.0)  # the largest share that fits next to the trainer
        if sharing and free_at_start > 0:
            plan.notes.append(f"engine.share_base: one copy of the base for trainer and vLLM ({vllm_weights:.1f} GB less than two); "
                              f"the freed memory can go to vLLM's KV cache: gpu_memory_utilization up to "
                              f"{math.floor(most / gpu_memory_gb * 100) / 100:.2f} gives {max(most - vllm_weights - VLLM_OVERHEAD_GB, 0):.1f} GB "
                              f"(now {max(kv_gb, 0):.1f} GB)")
        elif not sharing and r.engine.share_base is not False and not plan.problems:  # shared but not fitting: the verdict says why
            plan.notes.append(f"a second copy of the base for vLLM: {copy:.1f} GB (engine.share_base would save it where it applies)")
        if free_at_start <= 0:
            pass  # the trainer alone does not fit: the peak check says so
        elif counted > free_at_start:
            plan.problems.append(
                f"vLLM asks for {share:.1f} GB (engine.gpu_memory_utilization {r.engine.gpu_memory_utilization} x {gpu_memory_gb:.0f} GB) "
                f"but only {most:.1f} GB are free next to the trainer; lower engine.gpu_memory_utilization to "
                f"{math.floor(most / gpu_memory_gb * 100) / 100:.2f} or below")
        elif kv_gb * GB < kv_tok * seq:
            plan.problems.append(
                f"vLLM's share of {share:.1f} GB leaves {max(kv_gb, 0):.1f} GB of KV cache after its {vllm_weights:.1f} GB base copy, "
                f"less than one {seq:,}-token sequence ({kv_tok * seq / GB:.2f} GB); raise engine.gpu_memory_utilization")
        else:
            plan.notes.append(f"vLLM KV cache {kv_gb:.1f} GB = {int(kv_gb * GB / kv_tok):,} tokens "
                              f"({int(kv_gb * GB / kv_tok / seq)} sequences of {seq:,} in flight)")
    else:
        rows = r.engine.max_batch_size
        add(Item(f"HF engine KV cache ({rows} rows x {seq:,} tokens)", rows * seq * kv_tok / GB,
                 "engine.max_batch_size or grpo.max_new_tokens", "rollouts"))
        add(Item("HF engine decode logits (one step, fp32)", rows * shape.vocab * 4 * 2 / GB, "engine.max_batch_size", "rollouts"))

    # ---- the paper's layout: three full models, full fine-tuning of one
    full = params * 2 / GB
    plan.paper = {
        "role models (3 x bf16)": 3 * full,
        "reference model (bf16)": full,
        "gradients (bf16)": full,
        "AdamW state + fp32 master weights": params * 12 / GB,
        "total": 3 * full + full + full + params * 12 / GB,
    }
    if gpus > 1 and r.model.fsdp:
        plan.notes.append(f"{gpus} GPUs, data parallel, the base's decoder layers sharded {gpus} ways (model.fsdp); rollouts and "
                          f"micro-batches split {gpus} ways; every forward all-gathers the layers, so ranks move in step")
        plan.notes.append(f"host memory while loading: each process reads the whole base ({params * dtype_b / GB:.1f} GB) on the "
                          f"CPU before keeping its shard, as many processes at a time as host memory holds")
    elif gpus > 1:
        plan.notes.append(f"{gpus} GPUs, data parallel: each holds what is listed (no sharding: model.fsdp=true shards the base); "
                          f"rollouts and micro-batches split {gpus} ways")
    elif r.model.fsdp:
        plan.notes.append("model.fsdp shards the base across several GPUs; on one it changes nothing")
    return plan


def _plan_sharing(r, shape: Shape, gpus: int, plan: Plan) -> bool:
    """Whether `run` would share one base between trainer and vLLM on GPUs
    (engine/shared_base.py); a `true` that cannot hold is a problem."""
    from .engine.share_rules import why_not_share

    if r.engine.share_base is False:
        return False
    reason = why_not_share(r.model, r.engine, [shape.architecture] if shape.architecture else [], gpus)
    if reason and r.engine.share_base is True:
        plan.problems.append(f"engine.share_base=true cannot hold: {reason}; set engine.share_base=auto or false")
    elif reason:
        plan.notes.append(f"engine.share_base=auto: two copies of the base (trainer and vLLM): {reason}")
    return reason is None


# ----------------------------------------------------------------- output

def render(plan: Plan, source: str) -> str:
    """The table `lora-triplay plan` prints."""
    s = plan.shape
    lines = [
        f"{source}: {s.name}  {plan.params / 1e9:.2f}B parameters ({s.layers} layers, hidden {s.hidden}, vocab {s.vocab:,})",
        f"LoRA: {plan.lora_params / 1e6:.1f}M parameters per role ({plan.lora_params / plan.params:.2%} of the base)",
        f"GPU: {plan.gpus} x {plan.gpu_gb:.0f} GB; memory per GPU:",
        "",
        f"  {'item':<78} {'GB':>8}  when",
    ]
    for i in plan.items:
        lines.append(f"  {i.name:<78} {i.gb:8.2f}  {i.moment}")
    lines += [
        f"  {'peak during rollouts':<78} {plan.peak('rollouts'):8.2f}",
        f"  {'peak during the policy update':<78} {plan.peak('update'):8.2f}",
        "",
        "The paper's layout (three full models + a reference, full fine-tuning of one):",
    ]
    for k, v in plan.paper.items():
        lines.append(f"  {k:<78} {v:8.1f}")
    ours = sum(i.gb for i in plan.items if i.moment == "both" and "CUDA" not in i.name) + next(
        i.gb for i in plan.items if i.name.startswith("gradients"))
    lines.append(f"  {'same items here (base, adapters, optimizer state, gradients)':<78} {ours:8.1f}"
                 f"  ({plan.paper['total'] / ours:.1f}x less)")
    lines += [""] + [f"note: {n}" for n in plan.notes]
    verdict = f"verdict: fits ({plan.peak_gb:.1f} of {plan.gpu_gb:.0f} GB)" if plan.fits else f"verdict: does not fit: {plan.refusal(source)}"
    lines.append(verdict)
    return "\n".join(lines)
