"""The prepared GPU check must not rot between the sessions that have a
GPU: its dry run (the 8B config scaled down, on the CPU) goes through every
stage the real run does. Also the suite table and `make learns`' pipeline;
the evidence scripts' arithmetic is tests/test_bench_evidence.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] and set(result["stages"]) >= {"update", "decode", "loop"}
    update = result["stages"]["update"]
    assert update["chunked"]["layout"] == "full_sequence" and not update["chunked"]["skipped"]
    assert [s["phase"] for s in result["stages"]["loop"]["steps"]] == ["red", "red", "blue", "blue", "eval", "eval"]


def test_gpu_fsdp_check_dry_run(tmp_path):
    """The sharded-base GPU check, on gloo: a 1-rank sharded tiny model
    equals the unsharded one (tokens, scores, gradient), all on its device."""
    out = tmp_path / "gpu_fsdp_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                           str(ROOT / "bench" / "gpu_fsdp_check.py"), "--dry-run", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["sharded"] and result["same_tokens"] and not result["off_device_in_sharded"]
    assert result["largest_gradient_difference"] < 1e-5 * max(result["gradient_scale"], 1e-6) * 10


def test_suite_table_reads_each_scripts_json(tmp_path, monkeypatch):
    """bench/suite.py turns each script's JSON into one goal row: measured,
    target, met. Results it cannot find are `not run`, never a guess."""
    sys.path.insert(0, str(ROOT / "bench"))
    import suite

    results = {
        "roofline": {"rollout": {"fraction_of_roofline": 0.31}, "update": {"fraction_of_roofline": 0.45}, "mixed_over_per_role": 2.4},
        "sync": {"ratio": 0.125},
        "diversity": suite.derived("diversity", {"sizes": [{"pool": 1000, "bleu_score_s": 0.05, "cos_score_s": 0.0, "asp_score_s": 8.0,
                                                            "naive_bleu_s_est": 200.0},
                                                           {"pool": 10000, "bleu_score_s": 0.06, "cos_score_s": 0.01, "asp_score_s": 8.0,
                                                            "naive_bleu_s_est": 2000.0}],
                                                 "growth_exponent_bleu": 0.1}),
    }
    rows = {goal: (measured, met) for goal, measured, _, met in suite.table(results)}
    assert rows["1 rollouts vs roofline"] == ("31%", "no")
    assert rows["2 GRPO update vs roofline"] == ("45%", "yes")
    assert rows["3 mixed batch vs role by role"] == ("x2.40", "yes")
    assert rows["5 adapter sync / full-weight push"] == ("0.1250", "no")
    assert rows["6 diversity: 256 vs 10k pool lookup"] == ("0.07 s", "yes")
    assert rows["7 ours / TRL policy update"] == ("not run", "-")


def test_comparison_rows_are_not_marked_met():
    sys.path.insert(0, str(ROOT / "bench"))
    import suite

    rows = {g: met for g, _, _, met in suite.table({"resident": {"ours": {"over_one_base_model": 1.2},
                                                                 "three_copies": {"over_one_base_model": 2.2}}})}
    assert rows["4 resident: ours / one base"] == "no" and rows["4 resident: three copies / one base"] == "-"


def test_learns_runs_end_to_end_on_the_tiny_model(tmp_path):
    """`make learns`' pipeline (attack file, ours beside TRL, held-out
    evaluation, report) on the tiny Qwen3 with one step per iteration: the
    script must not rot between the runs that measure something. Needs TRL
    in bench/.trl-site (installed on first use) and ../shared/data."""
    data = ROOT.parent / "shared" / "data"
    if not data.is_dir():
        pytest.skip("no ../shared/data beside the checkout")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "learns.py"), "--quick", "--work", str(tmp_path), "--data", str(data)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "report" / "results.json").read_text())
    assert res["trl_prompt_ids_match_ours"] is True  # both trainers saw the same tokens
    for side in ("ours", "trl"):
        assert set(res[side]["sets"]) == {"jbb-harmful", "jbb-benign", "xstest-safe", "xstest-unsafe"}
        assert res[side]["curve"][0]["snapshot"] == "base" and len(res[side]["curve"]) >= 2
        after = res[side]["sets"]["jbb-harmful"]["after"]
        assert 0 <= after["asr"] <= 1 and 0 <= after["degenerate"] <= 1
    assert [t["target"] for t in res["targets"]][0].startswith("JBB harmful ASR down")
    assert (tmp_path / "report" / "learns.png").stat().st_size > 10_000 and "request withheld" in (tmp_path / "report" / "transcripts.md").read_text()


def test_judge_groups_compares_two_plans_of_one_run(finished_run, tmp_path):
    """bench/bench_judge_groups.py on the tiny run: both prefill plans time
    the same pairs and give the same label log-probs."""
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_judge_groups

    out = tmp_path / "judge_groups.json"
    assert bench_judge_groups.main([str(finished_run), "--iteration", "1", "--repeats", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    for phase in ("blue", "red"):
        got = res[phase]
        assert got["pairs"] > 0 and got["template_s"] > 0 and got["cheapest_s"] > 0
        assert got["max_abs_logprob_diff"] < 1e-4
        assert got["cheapest_prefill_tokens"] <= got["template_prefill_tokens"] + 16 * got["cheapest_prefix_forwards"]


def test_sampler_bench_times_both_samplers_on_the_tiny_model(tiny_model_dir, tmp_path):
    out = tmp_path / "sampler.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_sampler.py"), "--base", tiny_model_dir, "--prompts", "2",
                           "--samples", "3", "--max-new-tokens", "4", "--rounds", "1", "--vocab", "1000", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["sampler"]["vocab"] == 1000 and result["sampler"]["multinomial_ms"] > 0 < result["sampler"]["inverse_cdf_ms"]
    rollout = result["rollout"]
    assert rollout["rows"] == 6 and len(rollout["multinomial_all_s"]) == len(rollout["inverse_cdf_all_s"]) == 1
    assert rollout["multinomial_tokens_per_s"] > 0 and rollout["inverse_cdf_tokens_per_s"] > 0
