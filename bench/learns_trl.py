"""The TRL side of `make learns` (bench/learns.py): the same blue-alone run
as `lora-triplay run recipes/learns.yaml`, trained by TRL's GRPOTrainer.

    python bench/learns_trl.py --recipe recipes/learns.yaml --out adapters/learns-work/trl [KEY=VALUE ...]

Same as ours, read from the recipe: base model (the embedded SmolLM2-135M,
float32, CPU), LoRA config, the prompts of every step in the same order
(lora_triplay's RunData draws them: seed requests and the benign stream),
blue's system prompt, group size, prompts per step (one generation batch =
one optimizer step), completion budget, temperature, learning rate, AdamW
betas, KL weight with the base (adapter off) as reference, loss `grpo`,
std scaling per group, clip epsilon, gradient clipping, seed; and the reward
function itself (lora_triplay's rules label + degenerate penalty). The
adapter of every step is saved, with the wall seconds since training began;
`--max-seconds` ends the run at a time budget instead of a step count.

TRL lives in bench/.trl-site (bench_trl.py installs it there): it never
enters the project's environment.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import lora_triplay.triplay.config as tp  # noqa: E402 (TriPlay's per-role settings)

MICRO_ROWS = 8


def step_prompts(recipe) -> list[tuple[str, str]]:
    """(request, kind) for every blue step of the run, in our run's order."""
    from lora_triplay.triplay.rundata import RunData

    data = RunData(recipe, {"cursor": 0, "benign_cursor": 0, "attack_cursor": 0}, panel=None)
    steps = recipe.iterations * recipe.phases.blue.steps
    out = []
    for _ in range(steps):
        items, benign = data.blue_requests(tp.prompts_of(recipe, "blue"))
        out += [(b.prompt, "harmful") for b, _ in items] + [(b.prompt, "benign") for b in benign]
    return out


def reward_function(recipe):
    """What `rewards.blue_judge: rules` gives ours, as a TRL reward function."""
    from lora_triplay.judging.quality import degenerate
    from lora_triplay.judging.refusals import rules_label
    from lora_triplay.triplay.rewards.blue import blue_reward

    rw = recipe.rewards

    def blue_rules_reward(completions, kind, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [blue_reward(rules_label(t, k), rw.blue_values(k), degenerate(t), rw.degenerate_penalty) for t, k in zip(texts, kind)]

    return blue_rules_reward


def trl_config(trl, recipe, out: Path):
    g, P, G = recipe.grpo, tp.prompts_of(recipe, "blue"), tp.group_size_of(recipe, "blue")
    # One optimizer step per generation batch of P x G completions, in
    # micro-batches of whole groups, at most MICRO_ROWS rows: TRL keeps every
    # row's full logits: 64 rows at once took 13 GB here, 16 rows 17 GB at the peak
    # (both killed for memory beside our run), so 8.
    groups_per_micro = max(1, min(P, MICRO_ROWS // G))
    while P % groups_per_micro:
        groups_per_micro -= 1
    micro, accumulation = groups_per_micro * G, P // groups_per_micro
    return trl.GRPOConfig(
        output_dir=str(Path(tempfile.gettempdir()) / "learns-trl"), use_cpu=True, bf16=False, fp16=False, seed=recipe.seed,
        gradient_checkpointing=False, per_device_train_batch_size=micro, num_generations=G, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation, shuffle_dataset=False, max_steps=recipe.iterations * recipe.phases.blue.steps,
        max_completion_length=tp.max_new_tokens_of(recipe, "blue"), temperature=tp.temperature_of(recipe, "blue"), top_p=g.top_p,
        repetition_penalty=g.repetition_penalty, beta=g.beta, loss_type=g.loss_type, epsilon=g.clip_epsilon,
        scale_rewards=g.scale_rewards, mask_truncated_completions=g.mask_truncated, num_iterations=g.updates_per_batch,
        learning_rate=tp.role_lr(recipe, "blue"), weight_decay=g.weight_decay, adam_beta1=0.9, adam_beta2=0.99,
        optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=g.warmup_steps, max_grad_norm=g.max_grad_norm,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "learns.yaml"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop after the first step that ends past this many training seconds (the adapter of every step is kept)")
    ap.add_argument("overrides", nargs="*", help="dotted recipe overrides, as `lora-triplay run` takes them")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_trl import import_trl
    from transformers import TrainerCallback
    from transformers import logging as hf_logging

    from lora_triplay.model import load_base, peft_lora_config
    from lora_triplay.recipe import load_recipe
    from lora_triplay.triplay.roles import blue_messages

    trl = import_trl(False)
    from datasets import Dataset  # bench/.trl-site's, on the path once import_trl ran

    hf_logging.set_verbosity_error()
    recipe = load_recipe(args.recipe, args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok, _ = load_base(recipe.model)
    rows = step_prompts(recipe)
    data = Dataset.from_list([{"prompt": blue_messages(text), "kind": kind} for text, kind in rows])
    log: list[dict] = []
    first_prompts: dict = {}

    class Timed(trl.GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            if not first_prompts:  # the prompt tokens TRL built, to check against ours
                first_prompts["ids"] = batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].tolist()
            return batch

    class Record(TrainerCallback):
        def on_train_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_log(self, _args, state, _control, logs=None, **__):
            if logs and "reward" in logs:
                log.append({"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})

        def on_step_end(self, _args, state, control, model=None, **__):
            wall = time.perf_counter() - self.t0  # before saving: ours times its steps without their checkpoints' cost either
            model.save_pretrained(out / f"step-{state.global_step:04d}")
            with (out / "wall.jsonl").open("a") as f:
                f.write(json.dumps({"step": state.global_step, "wall_seconds": wall}) + "\n")
            if args.max_seconds is not None and wall >= args.max_seconds:
                control.should_training_stop = True

    (out / "wall.jsonl").write_text("")
    trainer = Timed(model=model, reward_funcs=reward_function(recipe), args=trl_config(trl, recipe, out), train_dataset=data,
                    processing_class=tok, peft_config=peft_lora_config(recipe.lora), callbacks=[Record()])
    t0 = time.perf_counter()
    trainer.train()
    ours = tok.apply_chat_template(blue_messages(rows[0][0]), add_generation_prompt=True, tokenize=True)
    ours = list(ours["input_ids"] if hasattr(ours, "keys") else ours)
    summary = {"trl_version": trl.__version__, "train_seconds": time.perf_counter() - t0, "steps": len(log),
               "max_seconds": args.max_seconds, "planned_steps": recipe.iterations * recipe.phases.blue.steps,
               "prompt_ids_match_ours": first_prompts.get("ids") == ours, "log": log}
    (out / "trl.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"TRL {trl.__version__}: {len(log)} steps in {summary['train_seconds']:.0f}s; prompt ids match ours: {summary['prompt_ids_match_ours']}")


if __name__ == "__main__":
    main()
