"""The prepared GPU check (run by bench/gpu_check.sh): does paper scale fit
and run on one GPU, and how fast, with no internet and no vLLM.

A Qwen3-8B-shaped base (the shipped config) with random bf16 weights, three
LoRA adapters (rank 64, all projections), gradient checkpointing on, and
four stages, each timed, each printing one line and adding to one JSON:

  update   one GRPO policy update at realistic lengths (8 completions of
           2,048 tokens after a 1,024-token prompt; KL reference on): peak
           GPU memory against `plan`'s estimate for the same settings; the
           log-prob kernel `auto` picks (liger when carried, checked first);
           and with 2 and 8 rows per micro-batch instead of the recipe's 1
  decode   the HF engine, 64 rows (16 each of base/red/blue/eval), 1,024-
           token prompts, 128 new tokens: tokens/s against the roofline
           from HBM bandwidth (measured here) and weight + KV bytes per step
  loop     the real loop (Session.run), 2 steps per phase, short rollouts
           (random weights never stop, so every rollout runs its full budget)
  plan     `run`'s memory check on CUDA, as `lora-triplay run` calls it

    python bench/gpu_check.py [--out FILE] [--budget-s 330]
    python bench/gpu_check.py --dry-run     # tiny shape on the CPU: does the script itself work?
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS: dict = {"stages": {}}


def say(msg: str) -> None:
    print(msg, flush=True)


def gb(x: float) -> float:
    return round(x / 1e9, 2)


# ------------------------------------------------------------------ model

def model_folder(shape_cfg: dict, work: Path) -> Path:
    """A folder with the base's config.json and our tiny tokenizer (its
    ids are a subset of the vocabulary; unknown ids decode to nothing):
    enough for `plan`, the tokenizer and adapter configs. No weights."""
    from lora_triplay.tiny import build_tiny_tokenizer

    folder = work / "base"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape_cfg))
    build_tiny_tokenizer().save_pretrained(folder)
    return folder


def random_base(shape_cfg: dict, device: str, dtype, checkpointing: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    cfg = AutoConfig.for_model(**shape_cfg)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=0)
    for p in model.parameters():
        p.requires_grad_(False)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model


def patch_session_loader(shape_cfg: dict, folder: Path):
    """Session.open builds the base through model.load_base; here it gets
    the random one (no weights exist on disk)."""
    import lora_triplay.model as model_mod
    from lora_triplay.model import load_tokenizer, pick_device, pick_dtype

    def load(cfg, place: bool = True):
        device = pick_device(cfg)
        model = random_base(shape_cfg, device.type if place else "cpu", pick_dtype(cfg, device), cfg.gradient_checkpointing)
        return model, load_tokenizer(str(folder), cfg), str(folder)

    model_mod.load_base = load


# ----------------------------------------------------------------- stages

def measure_bandwidth(device: str) -> float:
    import torch

    if device != "cuda":
        return 0.0
    a = torch.empty(int(2e9) // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    bw = 10 * 2 * a.numel() * 2 / (time.perf_counter() - t0)  # bytes read + written
    del a, b
    torch.cuda.empty_cache()
    return bw


def stage_update(args, recipe, model, tok, device) -> None:
    import torch

    from lora_triplay.model import activate
    from lora_triplay.plan import make_plan
    from lora_triplay.training.grpo import GrpoLearner, Sample
    from lora_triplay.training.logprobs import LogprobComputer

    params = activate(model, "blue")
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    groups, per = 2, 4
    samples = []
    for grp in range(groups):
        prompt = torch.randint(5, vocab, (args.prompt_tokens,), generator=g).tolist()
        for i in range(per):
            comp = torch.randint(5, vocab, (args.completion_tokens,), generator=g).tolist()
            samples.append(Sample(prompt, comp, grp, 0.0, advantage=1.0 if i % 2 else -1.0))
    out = {}
    # the recipe's micro-batches (grad_accumulation 8: one 3,072-token row
    # each at these lengths), then 2 and 8 rows per micro-batch: the first
    # GPU run reached ~16% of the bf16 peak with one row per micro-batch
    row = args.prompt_tokens + args.completion_tokens
    for name, kernel, rows in (("chunked", "chunked", None), ("auto", "auto", None), ("auto_mb2", "auto", 2), ("auto_mb8", "auto", 8)):
        cfg = recipe.grpo if rows is None else recipe.grpo.model_copy(
            update={"max_tokens_per_microbatch": rows * row, "grad_accumulation": len(samples) // rows})
        learner = GrpoLearner(model, params, cfg, lr=1e-5, pad_id=0,
                              computer=LogprobComputer(kernel, recipe.grpo.logprob_chunk_tokens))
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        stats = learner.step(samples)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
        tokens = len(samples) * (args.prompt_tokens + args.completion_tokens)
        out[name] = {"seconds": round(seconds, 2), "peak_allocated_gb": gb(peak), "kernel": learner.computer.active,
                     "microbatches": stats.extra.get("microbatches"), "layout": learner.layout,
                     "tokens_per_s": round(tokens / seconds, 1), "skipped": stats.skipped}
        say(f"update [{name} -> {learner.computer.active}]: {seconds:.1f}s, peak {gb(peak)} GB, "
            f"{out[name]['microbatches']:.0f} micro-batches, layout {learner.layout}, {tokens / seconds:,.0f} tokens/s")
        del learner
        if device == "cuda":
            torch.cuda.empty_cache()
    plan = make_plan(recipe, gpu_memory_gb=args.gpu_gb, prompt_tokens=args.prompt_tokens)
    est = plan.peak("update") - next(i.gb for i in plan.items if i.name.startswith("CUDA"))
    est -= sum(i.gb for i in plan.items if i.moment == "update" and i.name.startswith("vLLM"))
    out["plan_update_estimate_gb"] = round(est, 2)
    out["plan_items"] = [{"name": i.name, "gb": round(i.gb, 2), "moment": i.moment} for i in plan.items]
    say(f"update: plan's estimate {est:.1f} GB (without CUDA context) vs measured peak {out['chunked']['peak_allocated_gb']} GB allocated")
    RESULTS["stages"]["update"] = out


def stage_decode(args, model, tok, device, bandwidth: float) -> None:
    import torch

    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.hf import HFEngine

    engine = HFEngine(model, tok, max_batch_size=64)
    words = ("safety research question about general risks " * 400).split()
    text = " ".join(words)
    ids = tok(text)["input_ids"][: args.prompt_tokens - 16]
    prompt_text = tok.decode(ids)
    reqs = [Request(a, [{"role": "user", "content": f"{i} {prompt_text}"}])
            for a in ("base", "red", "blue", "evaluator") for i in range(args.decode_rows // 4)]
    sampling = Sampling(max_new_tokens=args.decode_tokens, temperature=1.0, seed=0)
    engine.generate(reqs[:4], Sampling(max_new_tokens=4, temperature=0.0))  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    comps = engine.generate(reqs, sampling)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    new = sum(len(c[0].token_ids) for c in comps)
    prompt_len = len(engine.encode(reqs[0].messages))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    kv_tok = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    rows = len(reqs)
    avg_ctx = prompt_len + args.decode_tokens / 2
    step_bytes = weights + rows * avg_ctx * kv_tok  # every decode step reads the weights once and each row's KV cache
    roofline = rows * bandwidth / step_bytes if bandwidth else 0.0
    out = {"rows": rows, "prompt_tokens": prompt_len, "new_tokens": new, "seconds": round(seconds, 2),
           "tokens_per_s": round(new / seconds, 1), "hbm_bandwidth_gb_s": round(bandwidth / 1e9, 1),
           "roofline_tokens_per_s": round(roofline, 1), "share_of_roofline": round(new / seconds / roofline, 3) if roofline else None,
           "note": "prefill included in seconds"}
    say(f"decode: {rows} rows x {args.decode_tokens} tokens after {prompt_len}-token prompts: {new / seconds:,.0f} tokens/s; "
        f"roofline {roofline:,.0f} tokens/s ({bandwidth / 1e12:.2f} TB/s measured) -> {out['share_of_roofline']}")
    RESULTS["stages"]["decode"] = out


def stage_loop(args, overrides: list[str], folder: Path, device: str) -> None:
    import torch

    from lora_triplay.core.session import Session
    from lora_triplay.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "8b.yaml", overrides + [
        "engine.backend=hf", "engine.max_batch_size=64", "iterations=1",
        "phases.red.steps=2", "phases.blue.steps=2", "phases.eval.steps=2", "phases.eval_warmup.steps=0",  # the phases' own steps
        "grpo.prompts_per_step=2", "grpo.group_size=4", f"phases.red.max_new_tokens={args.loop_tokens}",
        f"grpo.max_new_tokens={args.loop_tokens}", "rewards.judge_mode=choice", "rewards.embedding_model=hashing",
        "experts.safety_experts=2", "experts.utility_experts=2", "defenders=[{name: blue, weight: 1.0}, {name: base, weight: 0.5}]",
    ])
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    session = Session.open(recipe, Path(tempfile.mkdtemp()) / "run")
    opened = time.perf_counter() - t0
    rows = []
    session.hooks.step_done = lambda row: (rows.append(row), say(
        f"loop: {row['phase']:<4} step {row['step']}: {row['step_seconds']:.1f}s (train {row['train_seconds']:.1f}s)"))
    session.run()
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    RESULTS["stages"]["loop"] = {
        "open_seconds": round(opened, 1), "total_seconds": round(time.perf_counter() - t0, 1), "peak_allocated_gb": gb(peak),
        "steps": [{k: r.get(k) for k in ("phase", "step", "step_seconds", "train_seconds", "rollout_seconds", "tokens")} for r in rows],
    }
    say(f"loop: 6 steps in {time.perf_counter() - t0:.0f}s, peak {gb(peak)} GB allocated")


def stage_plan_check(overrides: list[str]) -> None:
    from lora_triplay.core.session import check_fits_gpu
    from lora_triplay.recipe import RecipeError, load_recipe

    out = {}
    for label, extra in (("8b.yaml as shipped", []), ("8b.yaml without checkpointing", ["model.gradient_checkpointing=false"])):
        try:
            check_fits_gpu(load_recipe(ROOT / "recipes" / "8b.yaml", overrides + extra))
            out[label] = "accepted"
        except RecipeError as exc:
            out[label] = f"refused: {exc}"
        say(f"plan check: {label}: {out[label]}")
    RESULTS["stages"]["plan_check"] = out


# -------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", str(ROOT / "bench" / "results")), "gpu_check.json"))
    ap.add_argument("--budget-s", type=float, default=330.0, help="skip stages that would start after this")
    ap.add_argument("--dry-run", action="store_true", help="tiny shape on the CPU, to check the script itself")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--completion-tokens", type=int, default=2048)
    ap.add_argument("--decode-rows", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--loop-tokens", type=int, default=96)
    args = ap.parse_args()
    t_start = time.perf_counter()

    import torch

    from lora_triplay.model import attach_role_adapters
    from lora_triplay.recipe import load_recipe
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    shape_cfg = json.loads((ROOT / "lora_triplay" / "configs" / "qwen3-8b.json").read_text())
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if args.dry_run:  # the 8B config scaled down; same code paths
        shape_cfg.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32)
        args.prompt_tokens, args.completion_tokens = 32, 32
        args.decode_rows, args.decode_tokens, args.loop_tokens = 8, 8, 6
    args.gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9 if device == "cuda" else 0.0
    RESULTS.update(device=torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
                   gpu_memory_gb=round(args.gpu_gb, 1), torch=torch.__version__, dry_run=args.dry_run,
                   date=time.strftime("%Y-%m-%d %H:%M"), shape={k: shape_cfg[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")})
    say(f"gpu_check on {RESULTS['device']} ({RESULTS['gpu_memory_gb']} GB), torch {torch.__version__}")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    folder = model_folder(shape_cfg, work)
    overrides = [f"model.base={folder}", f"model.device={device}", f"model.dtype={'bfloat16' if device == 'cuda' else 'float32'}",
                 f"grpo.max_new_tokens={args.completion_tokens}", "phases.red.max_new_tokens=null"]
    recipe = load_recipe(ROOT / "recipes" / "8b.yaml", overrides + ["grpo.prompts_per_step=2", "grpo.group_size=4", "engine.backend=hf"])
    from lora_triplay.model import load_tokenizer

    tok = load_tokenizer(str(folder), recipe.model)
    bandwidth = measure_bandwidth(device)

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    t0 = time.perf_counter()
    model = attach_role_adapters(random_base(shape_cfg, device, dtype, True), recipe.lora, seed=0, names=list(ROLE_ADAPTERS.values()))
    say(f"base + 3 adapters built in {time.perf_counter() - t0:.1f}s")
    for name in ("update", "decode"):
        if left() < 30:
            say(f"{name}: skipped (time budget)")
        elif name == "update":
            stage_update(args, recipe, model, tok, device)
        else:
            stage_decode(args, model, tok, device, bandwidth)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    patch_session_loader(shape_cfg, folder)
    if left() > 90:
        stage_loop(args, overrides, folder, device)
    else:
        say("loop: skipped (time budget)")
    if device == "cuda":
        stage_plan_check(overrides)
    RESULTS["seconds"] = round(time.perf_counter() - t_start, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(RESULTS, indent=2) + "\n")
    say(f"done in {RESULTS['seconds']}s; saved {args.out}")


if __name__ == "__main__":
    main()
