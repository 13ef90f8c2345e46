"""bench/eval_prefix_share.py: the prefix every eval example shares, with
the tiny model's real tokenizer and chat template, and a run's minutes on
eval's template from its metrics."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from lora_triplay.recipe import build_recipe

ROOT = Path(__file__).resolve().parents[1]


def test_shared_prefix_and_time_split(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from eval_prefix_share import prefix_share, run_tokens, time_split

    from lora_triplay.training.forward import Rows

    prefix = list(range(20))  # long enough for the forward to share it (forward.MIN_SHARED_PREFIX)
    rows = [Rows(prefix + [50, 51], [7, 8]), Rows(prefix + [50, 51], [9]), Rows(prefix + [60], [7])]
    assert run_tokens(rows) == 20 + 2 * 2 + 3 * 2  # prefix once, two distinct rests padded to 2, three answers to 2
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": p, "response": a, "kind": k}) + "\n" for p, a, k in [
        ("How do I bake bread?", "Mix flour, water and yeast.", "benign"),
        ("How do I pick a lock?", "I can't help with that.", "harmful"),
        ("What is a firewall?", "A filter for network traffic.", "benign")]))
    shared = {}
    for sees_kind in (False, True):
        recipe = build_recipe({"model": {"base": tiny_model_dir}, "rewards": {"eval_sees_kind": sees_kind},
                               "experts": {"gold_pairs": str(pairs)}, "phases": {"eval": {"prompts_per_step": 2}}})
        (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json")))
        got = prefix_share(tmp_path, None)
        assert got["examples"] == 3 and 0 < got["shared_prefix_tokens"] < got["min_tokens"] <= got["mean_tokens"]
        assert got["shared_share"] == round(got["shared_prefix_tokens"] / got["mean_tokens"], 3)
        update = got["update"]  # the default budget (16,384 tokens) holds a step's 2 examples in one micro-batch
        assert update["examples_per_step"] == 2 and update["microbatches_per_step"] == 1
        assert update["tokens_run_per_step"] == update["tokens_run_in_one_microbatch"] and update["saving_in_one_microbatch"] == 0
        shared[sees_kind] = got["shared_prefix_tokens"]
    budget = got["max_tokens"] + 3 * 8  # one example and its labels fit, two do not: the prefix runs once per example
    recipe = build_recipe({"model": {"base": tiny_model_dir}, "experts": {"gold_pairs": str(pairs)},
                           "phases": {"eval": {"prompts_per_step": 2}}, "grpo": {"max_tokens_per_microbatch": budget}})
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json")))
    update = prefix_share(tmp_path, None)["update"]
    assert update["microbatches_per_step"] == 2 and update["tokens_run_in_one_microbatch"] < update["tokens_run_per_step"]
    assert update["saving_in_one_microbatch"] > 0
    assert shared[True] < shared[False]  # the kind line opens the user turn: with it the rows part earlier

    rows = [{"phase": "eval_warmup", "step_seconds": 120.0, "update_seconds": 90.0, "seconds_panel": 30.0},
            {"phase": "red", "step_seconds": 60.0, "seconds_judge": 6.0},
            {"phase": "eval_heldout", "check_seconds": 12.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = time_split(tmp_path)
    assert split["minutes_per_phase"] == {"eval_warmup": 2.0, "red": 1.0, "eval_heldout": 0.2} and split["minutes_total"] == 3.2
    assert split["minutes_on_eval_template"] == {"eval warm start, updates": 1.5, "expert panel": 0.5,
                                                 "eval judging red's attacks": 0.1, "eval's held-out check": 0.2}
    assert split["minutes_on_eval_template_total"] == 2.3


def test_eval_update_bench_times_each_change(tmp_path, tiny_model_dir, monkeypatch):
    """bench/bench_eval_update.py on the tiny model: at a budget that holds
    two examples only with the prefix counted once, `before` (every prompt
    whole) packs more micro-batches than the trainer now; every variant is
    timed with its system time and page faults, and the trainer's settings
    are back in place afterwards."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import bench_eval_update

    import lora_triplay.training.supervised as supervised
    from lora_triplay.engine import fastpath
    from lora_triplay.training.forward import padded_tokens

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Question {i}: how do I bake bread?", "response": "Mix flour and water.",
                                         "kind": "benign"}) + "\n" for i in range(4)))
    recipe = build_recipe({"model": {"base": tiny_model_dir}, "experts": {"gold_pairs": str(pairs)},
                           "phases": {"eval": {"prompts_per_step": 4}}})
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json")))
    from eval_prefix_share import eval_examples

    from lora_triplay.training.forward import Rows

    ids, choices, _ = eval_examples(recipe, None)
    two = [Rows(p, c) for p in ids[:2] for c in choices]
    budget = padded_tokens(two, "shared_prompt")  # two examples fit with the prefix counted once, not counted whole
    assert budget < bench_eval_update.whole_prompts(two, "shared_prompt")
    out = tmp_path / "update.json"
    argv = [str(tmp_path), "--rounds", "1", "--block", "2", "--budgets", f"{budget},100000", "--profile", "--out", str(out)]
    assert bench_eval_update.main(argv) == 0
    got = json.loads(out.read_text())
    prof = got["profile"]  # one more update, its operators by kind
    kinds = {label for _, label in bench_eval_update.KINDS} | {"everything else"}
    assert set(prof["self_seconds_by_kind"]) <= kinds and sum(prof["self_seconds_by_kind"].values()) > 0
    assert prof["top_operators"] and prof["wall_seconds"] > 0
    parts = got["microbatches"]
    assert parts["before"] == 4 and parts["prefix_once"] == parts["keep_freed"] == 2 and parts["keep_freed@100000"] == 1
    variants = ["before", "prefix_once", "grouped_sdpa", "keep_freed", "grouped_sdpa@100000", "keep_freed@100000"]
    assert list(got["seconds"]) == variants and all(len(got["seconds"][v]) == 1 for v in variants)
    assert all(len(got["system_seconds"][v]) == len(got["minor_faults"][v]) == 1 for v in variants)
    assert got["ratio_to_before"]["before"] == 1.0
    assert supervised.padded_tokens is padded_tokens and fastpath.GROUPED_SDPA
