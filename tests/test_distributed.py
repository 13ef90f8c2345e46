"""Two processes (gloo on the CPU, launched by `accelerate launch`) take the
same GRPO step as one process on the whole batch: each rank trains on its
block of groups, gradients are summed across ranks, and both ranks end with
the adapter one process would have."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from inprocess import run_cli

from lora_triplay.core.distributed import Collective

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"
WRONG_SHARD = ROOT / "tests" / "wrong_shard"  # its sitecustomize breaks the sharding when asked


def _env(env_extra: dict | None = None) -> dict:
    """A child process's environment: one thread, this checkout first, the
    sharding correct unless `env_extra` sets LORA_TRIPLAY_WRONG_SHARD."""
    env = {k: v for k, v in os.environ.items() if k != "LORA_TRIPLAY_WRONG_SHARD"}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{WRONG_SHARD}", **(env_extra or {})}


def test_blocks_are_contiguous_and_cover_everything():
    items = list(range(7))
    blocks = []
    for rank in range(3):
        c = Collective(world=1)
        c.rank, c.world = rank, 3
        start, block = c.block(items)
        assert block == items[start : start + len(block)]
        blocks.append(block)
    assert blocks == [[0, 1, 2], [3, 4], [5, 6]]
    assert Collective(world=1).block(items) == (0, items)


def test_tensor_parallel_groups_share_a_block():
    """vLLM tensor parallel: ranks 2k and 2k+1 form one engine and serve the
    same block; one block per group covers everything in order."""
    items = list(range(7))
    blocks = {}
    for rank in range(4):
        c = Collective(world=1)
        c.rank, c.world = rank, 4
        blocks[rank] = c.block(items, group=2)
    assert blocks[0] == blocks[1] and blocks[2] == blocks[3]
    assert blocks[0][1] + blocks[2][1] == items and blocks[2][0] == len(blocks[0][1])


def test_tensor_parallel_must_divide_the_processes():
    from lora_triplay.engine.sharded import ShardedEngine
    from lora_triplay.engine.vllm import parallel_kwargs
    from lora_triplay.errors import UserError

    c = Collective(world=1)
    c.world = 3
    with pytest.raises(UserError, match="tensor_parallel_size 2 must divide the number of processes"):
        ShardedEngine(object(), c, group=2)
    with pytest.raises(UserError, match="tensor_parallel_size 2 must divide"):
        parallel_kwargs(3, 2, cpu=False)
    with pytest.raises(UserError, match="needs GPUs"):
        parallel_kwargs(2, 1, cpu=True)
    assert parallel_kwargs(8, 2, cpu=False) == {"distributed_executor_backend": "external_launcher"}


def test_an_unknown_adapter_fails_on_every_rank_before_any_work(role_model):
    """Rank 0's block holds only the first request; the second names an
    adapter nobody serves: rank 0 must fail too, before generating or
    waiting for the gather (rank 1 fails the same way in its block)."""
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.engine.sharded import ShardedEngine

    model, tok = role_model
    c = Collective(world=1)
    c.world = 2  # rank 0 of 2, no process group: reaching the gather would raise another error
    engine = ShardedEngine(HFEngine(model, tok), c)
    reqs = [Request("blue", [{"role": "user", "content": "hi"}]), Request("purple", [{"role": "user", "content": "hi"}])]
    with pytest.raises(KeyError, match="adapter 'purple' is not loaded; known: "):
        engine.generate(reqs, Sampling(max_new_tokens=2, temperature=0.0))
    with pytest.raises(KeyError, match="adapter 'purple' is not loaded"):
        engine.score_choices([Request(r.adapter, r.messages, choices=("a", "b")) for r in reqs])
    assert engine.local_requests == 0


def test_ranks_load_a_sharded_base_as_many_at_a_time_as_host_memory_holds(monkeypatch):
    from lora_triplay.training.sharding import copies_at_once

    monkeypatch.delenv("LORA_TRIPLAY_LOAD_AT_ONCE", raising=False)
    available = int(dict(x.split(":", 1) for x in Path("/proc/meminfo").read_text().splitlines())["MemAvailable"].split()[0]) * 1024
    assert copies_at_once(available * 2.0, 8) == 1  # bigger than the host: one at a time, never zero
    assert copies_at_once(available * 0.3, 8) == 2  # 80% of what is free holds two copies
    assert copies_at_once(1e6, 8) == 8 and copies_at_once(None, 8) == 8  # small or unknown: all at once
    monkeypatch.setenv("LORA_TRIPLAY_LOAD_AT_ONCE", "3")
    assert copies_at_once(1e6, 8) == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# One process never shards, so a wrong sharding (env_extra) cannot change its
# result: each (base, loss types, mode) is computed once per session.
_ONE_PROCESS: dict[tuple, dict[str, dict]] = {}


def _worker(tiny_model_dir, tmp_path, loss_types: str, mode: str, env_extra: dict | None = None) -> tuple[dict, dict]:
    """The worker as 1 process and as 2 (accelerate launch), one step per loss
    type (comma-separated) from the same adapter: ({loss type: 1-process
    result}, {loss type: each rank's})."""
    env = _env(env_extra)
    key = (tiny_model_dir, loss_types, mode)
    if key not in _ONE_PROCESS:
        one = subprocess.run([sys.executable, str(WORKER), tiny_model_dir, str(tmp_path / "one"), loss_types, mode],
                             env=env, capture_output=True, text=True, timeout=300)
        assert one.returncode == 0, one.stderr[-2000:]
        _ONE_PROCESS[key] = {lt: torch.load(tmp_path / f"one.{lt}.rank0") for lt in loss_types.split(",")}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "recipes" / "accelerate" / "2proc-1node.yaml"),
              "--main_process_port", str(_free_port()), str(WORKER), tiny_model_dir, str(tmp_path / "two"), loss_types, mode]
    two = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    return _ONE_PROCESS[key], {lt: [torch.load(tmp_path / f"two.{lt}.rank{r}") for r in (0, 1)] for lt in loss_types.split(",")}


@pytest.fixture(scope="module")
def ddp_steps(tiny_model_dir, tmp_path_factory):
    """Both loss types in one launch (a launch is ~7 s of start-up)."""
    return _worker(tiny_model_dir, tmp_path_factory.mktemp("ddp"), "grpo,token_mean", "ddp")


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "token_mean"])
def test_two_ranks_take_the_one_process_step(ddp_steps, loss_type):
    ref, ranks = ddp_steps[0][loss_type], ddp_steps[1][loss_type]
    assert ref["world"] == 1 and [r["world"] for r in ranks] == [2, 2]
    _assert_same_step(ref, ranks)


@pytest.mark.slow
def test_the_loss_types_take_different_steps(ddp_steps):
    """The worker restores the adapter between its loss types: each step
    starts from the same weights, and the two objectives move them apart."""
    ref = ddp_steps[0]
    for key, value in ref["grpo"]["start"].items():
        assert torch.equal(ref["token_mean"]["start"][key], value), key
    gap = max((ref["grpo"]["state"][k] - v).abs().max().item() for k, v in ref["token_mean"]["state"].items())
    assert gap > 100 * STEP_ATOL


@pytest.mark.slow
def test_a_sharded_base_takes_the_same_step_and_keeps_the_ranks_in_step(tiny_model_dir, tmp_path):
    """model.fsdp: each rank holds half of the decoder layers; with unequal
    work (3 and 2 groups, 3 and 2 one-row generate batches) the ranks'
    forwards stay in step through dummies, and generation, forced-choice
    scores and the GRPO step equal one unsharded process."""
    ref, ranks = (x["grpo"] for x in _worker(tiny_model_dir, tmp_path, "grpo", "fsdp"))
    assert not ref["sharded"] and all(r["sharded"] for r in ranks)
    _assert_same_step(ref, ranks)
    for r in ranks:
        assert r["generated"] == ref["generated"]
        flat = [x for request in r["scores"] for choice in request for x in choice]
        assert flat == pytest.approx([x for request in ref["scores"] for choice in request for x in choice], abs=1e-5)
    assert ranks[1]["engine_dummies"] > 0 and ranks[0]["engine_dummies"] == 0  # rank 1 had one batch fewer
    assert ranks[0]["microbatches"] == ranks[1]["microbatches"]  # padded to the busier rank ...
    assert ranks[0]["grpo_dummies"] == 0 and ranks[1]["grpo_dummies"] >= 1  # ... rank 1's dummy left out of every total:
    for key in ("kl", "entropy", "clip_fraction"):
        assert all(r[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7) for r in ranks), key
    # what each rank holds is what `plan` counts: decoder layers split in two, the rest whole
    from lora_triplay.plan import load_shape

    shape = load_shape(tiny_model_dir)
    layers = shape.layers * shape.block_params()
    assert ref["base_sharded"] == 0 and ref["base_whole"] == shape.params()
    assert sum(r["base_sharded"] for r in ranks) == layers and all(r["base_whole"] == shape.params() - layers for r in ranks)
    assert all(abs(r["base_sharded"] - layers / 2) <= layers * 0.01 for r in ranks)


@pytest.mark.slow
def test_a_wrong_sharding_fails_the_step_comparison(tiny_model_dir, tmp_path):
    """The companion of the test above: with rank 1's shard of one weight
    lost (zeroed), the same comparison must fail, by far more than the
    tolerance (a shard counted twice: test_a_wrong_sharding_fails_the_run_comparison)."""
    ref, ranks = (x["grpo"] for x in _worker(tiny_model_dir, tmp_path, "grpo", "fsdp", {"LORA_TRIPLAY_WRONG_SHARD": "dropped"}))
    assert all(r["sharded"] for r in ranks)
    with pytest.raises(AssertionError):
        _assert_same_step(ref, ranks)
    gap = max((r["state"][k] - v).abs().max().item() for r in ranks for k, v in ref["state"].items())
    assert gap > 100 * STEP_ATOL


def _assert_same_step(ref: dict, ranks: list[dict]) -> None:
    for r in ranks:
        assert r["tokens"] == ref["tokens"]
        assert r["loss"] == pytest.approx(ref["loss"], abs=ATOL)
        assert r["grad_norm"] == pytest.approx(ref["grad_norm"], rel=RTOL)
        for key, value in ref["state"].items():
            assert torch.allclose(r["state"][key], value, rtol=0, atol=STEP_ATOL), key
    for key in ref["state"]:
        assert torch.equal(ranks[0]["state"][key], ranks[1]["state"][key]), f"ranks differ on {key}"


RECIPE = """\
model: {{base: "{base}", device: cpu, dtype: float64}}
lora: {{rank: 4, alpha: 8}}
iterations: 2
phases: {{red: {{steps: 1}}, blue: {{steps: 1}}, eval: {{steps: 1}}}}
grpo: {{group_size: 2, prompts_per_step: 3, lr: 1.0e-3, max_new_tokens: 8}}
rewards: {{judge_mode: choice, embedding_model: hashing}}
defenders: [{{name: blue, weight: 1.0}}, {{name: base, weight: 0.5}}, {{name: blue@-1, weight: 0.3}}]
experts: {{safety_experts: 2, utility_experts: 2}}
"""


def _run(recipe: Path, run_dir: Path, *extra: str, crash: str | None = None, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = _env(env_extra)
    env.pop("LORA_TRIPLAY_CRASH_AT", None)
    if crash:
        env["LORA_TRIPLAY_CRASH_AT"] = crash
    cmd = [sys.executable, "-m", "lora_triplay", "run", str(recipe), "--run-dir", str(run_dir), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _final(run: Path) -> dict:
    import json

    from safetensors.torch import load_file

    state = json.loads((run / "state.json").read_text())
    adapters = {role: load_file(run / state["checkpoints"][role] / "adapter_model.safetensors") for role in ("red", "blue", "eval")}
    metrics = [{k: v for k, v in json.loads(line).items() if "seconds" not in k} for line in (run / "metrics.jsonl").read_text().splitlines()]
    data = {name: [json.loads(x) for x in (run / f"{name}.jsonl").read_text().splitlines()] for name in ("asp", "eval_pairs", "panel", "transcripts")}
    return {"state": state, "adapters": adapters, "metrics": metrics, "data": data}


# How close "equal" is. Each rank computes its rows in other batches and
# micro-batches than one process does: the same maths in another summation
# order. In float32 that moved adapters by up to 1.5e-5 on one machine (and
# 1e-6 on another): AdamW divides each update by sqrt(v) + eps, so where a
# gradient is near zero an absolute gradient error dg becomes an update
# error of up to lr * dg / eps (capped at 2 * lr, a sign flip), and lr/eps
# is 1e5 here. So the equivalence runs are float64 (model.dtype; our scores
# stay float64 too, precision.py): only transformers' RMSNorm still rounds
# to float32, which left gradient norms 1e-9 apart and adapters at most
# 5e-8 apart after 2 updates per role at lr 1e-3 (measured, 2026-12-01).
# The bound scales with the learning rate, so the tolerance is per unit of
# lr: 1e-3 x lr, i.e. ATOL = 1e-6 for the runs (lr 1e-3: 20x the 5e-8
# measured) and STEP_ATOL = 1e-5 for the single step of dist_worker.py (lr
# 1e-2: 1.4e-6 measured with a sharded base, whose full-sequence layout
# rounds differently from one process's shared-prompt one; 3e-17 without).
# A wrong sharding (a rank's shard dropped or counted twice) moves the rows
# and the adapters by far more, and the companion tests below check that it
# fails these comparisons.
ATOL = 1e-6
STEP_ATOL = 1e-5
RTOL = 1e-6


def _close(x, y) -> bool:
    """Equal, floats within RTOL (a row's numbers come from batches made up
    differently on each rank: the same maths, another summation order)."""
    if isinstance(x, float) and isinstance(y, float):
        return abs(x - y) <= RTOL * max(1.0, abs(x))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_close(a, b) for a, b in zip(x, y))
    return x == y


def _assert_same_run(a: dict, b: dict) -> None:
    for name, rows in a["data"].items():  # every rollout, label and pool row, in the same order
        assert _close(rows, b["data"][name]), name
    assert len(a["metrics"]) == len(b["metrics"])
    for x, y in zip(a["metrics"], b["metrics"]):
        assert x.keys() == y.keys()
        for key, value in x.items():
            assert y[key] == (pytest.approx(value, rel=RTOL, abs=ATOL) if isinstance(value, float) else value), (x["phase"], key)
    for role, weights in a["adapters"].items():
        for key, value in weights.items():
            assert torch.allclose(b["adapters"][role][key], value, rtol=0, atol=ATOL), (role, key)


@pytest.fixture(scope="module")
def one_process_run(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-e2e")
    (root / "r.yaml").write_text(RECIPE.format(base=tiny_model_dir))
    proc = run_cli("run", root / "r.yaml", "--run-dir", root / "one")  # one process: in this one
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, _final(root / "one")


@pytest.mark.slow
def test_two_process_run_equals_one_process_run(one_process_run):
    """`run --nproc 2`: each rank serves half of every engine call and
    trains on half of the groups; the run folder equals one process's
    (data rows exactly, metrics and adapters within 1e-5), and the ranks
    checked at every phase end that they hold the same adapter."""
    root, ref = one_process_run
    proc = _run(root / "r.yaml", root / "two", "--nproc", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ranks agree on the eval adapter (2 processes)" in proc.stdout + proc.stderr
    two = _final(root / "two")
    assert two["state"]["world_size"] == 2
    _assert_same_run(ref, two)


@pytest.mark.slow
def test_a_two_process_run_on_a_sharded_base_equals_one_process_run(one_process_run):
    """model.fsdp (with gradient checkpointing, as the paper recipes run):
    decoder layers sharded across the 2 ranks (loaded one rank at a time,
    as on a host that holds one copy), the snapshot defender blue@-1
    loaded onto the sharded model; the run folder equals one unsharded
    process's."""
    root, ref = one_process_run
    proc = _run(root / "r.yaml", root / "fsdp", "--nproc", "2", "model.fsdp=true", "model.gradient_checkpointing=true",
                env_extra={"LORA_TRIPLAY_LOAD_AT_ONCE": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "loading the base 1 process(es) at a time on this node" in out
    assert "decoder layers sharded 2 ways" in out and "ranks agree on the eval adapter (2 processes)" in out
    _assert_same_run(ref, _final(root / "fsdp"))


def _max_adapter_gap(a: dict, b: dict) -> float:
    return max((b["adapters"][role][k].double() - v.double()).abs().max().item() for role, w in a["adapters"].items() for k, v in w.items())


@pytest.mark.slow
def test_a_wrong_sharding_fails_the_run_comparison(one_process_run):
    """The companion of the test above: the same sharded run with rank 1's
    shard of one weight counted twice must fail the comparison (its rows
    change, and its adapters move by far more than ATOL)."""
    root, ref = one_process_run
    proc = _run(root / "r.yaml", root / "wrong", "--nproc", "2", "model.fsdp=true", "model.gradient_checkpointing=true",
                env_extra={"LORA_TRIPLAY_WRONG_SHARD": "doubled"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    wrong = _final(root / "wrong")
    with pytest.raises(AssertionError):
        _assert_same_run(ref, wrong)
    assert _max_adapter_gap(ref, wrong) > 100 * ATOL


@pytest.mark.slow
def test_a_sharded_run_killed_resumes_on_one_unsharded_process(one_process_run):
    """A crash on several GPUs, resumed where one suffices: adapters and
    optimizer state are whole in the run folder, so `model.fsdp` may change
    (with --allow-recipe-change) and the run ends as the uninterrupted one."""
    root, ref = one_process_run
    crashed = _run(root / "r.yaml", root / "sharded-killed", "--nproc", "2", "model.fsdp=true", crash="commit:5")
    assert crashed.returncode != 0
    assert not __import__("json").loads((root / "sharded-killed" / "state.json").read_text())["done"]
    refused = run_cli("run", root / "r.yaml", "--run-dir", root / "sharded-killed", "--resume")
    assert refused.returncode == 2 and "model.fsdp: True -> False" in refused.stderr
    resumed = run_cli("run", root / "r.yaml", "--run-dir", root / "sharded-killed", "--resume", "--allow-recipe-change")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    _assert_same_run(ref, _final(root / "sharded-killed"))


@pytest.mark.slow
def test_two_process_run_killed_and_resumed_equals_the_uninterrupted_one(one_process_run):
    root, ref = one_process_run
    crashed = _run(root / "r.yaml", root / "killed", "--nproc", "2", crash="commit:5")
    assert crashed.returncode != 0
    state = __import__("json").loads((root / "killed" / "state.json").read_text())
    assert not state["done"]
    resumed = _run(root / "r.yaml", root / "killed", "--nproc", "2", "--resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    _assert_same_run(ref, _final(root / "killed"))


def _eval(run: Path, out: Path, bench: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "lora_triplay", "eval", str(run), "-b", f"mine=generic:{bench}", "--judge", "eval",
           "--roles", "blue,red", "--temperature", "1", "--batch-size", "5", "--out", str(out), "--no-progress", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_process_eval_equals_one_process_eval(one_process_run, tmp_path):
    """`eval --nproc 2`: every generate and scoring call split across the
    ranks (sampled answers seeded per row), rank 0 alone writing: the same
    answers, labels and aggregates as one process."""
    import json

    root, _ = one_process_run
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"prompt": f"Explain how to get around rule {i} of a game.", "label": "unsafe" if i % 3 else "safe"}) + "\n"
                             for i in range(7)))
    one = run_cli("eval", root / "one", "-b", f"mine=generic:{bench}", "--judge", "eval", "--roles", "blue,red", "--temperature", "1",
                  "--batch-size", "5", "--out", tmp_path / "one.json", "--no-progress")  # one process: in this one
    assert one.returncode == 0, one.stderr[-3000:]
    two = _eval(root / "one", tmp_path / "two.json", bench, "--nproc", "2")
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-3000:]
    assert two.stdout.count("wrote ") == 1  # rank 1 prints nothing

    def items(out):
        rows = [json.loads(x) for x in (tmp_path / f"{out}.json.items.jsonl").read_text().splitlines()]
        return sorted((r["benchmark"], r["iteration"], r["role"], r["defender"], r["id"], r["response"], r["label"]) for r in rows)

    assert items("one") == items("two") and len(items("one")) > 7
    a, b = (json.loads((tmp_path / f"{x}.json").read_text()) for x in ("one", "two"))
    for key in ("benchmarks", "red"):
        assert _close(a[key], b[key]), key
    per_process = b["work"]["requests_per_process"]
    assert len(per_process) == 2 and min(per_process) > 0.3 * sum(per_process)  # each rank served its block of every call

    # the same run folder with a sharded base (model.fsdp in its recipe): the same items
    import shutil

    sharded = shutil.copytree(root / "one", tmp_path / "sharded-run")
    recipe = (sharded / "recipe.yaml").read_text()
    assert "fsdp: false" in recipe
    (sharded / "recipe.yaml").write_text(recipe.replace("fsdp: false", "fsdp: true"))
    fsdp = _eval(sharded, tmp_path / "fsdp.json", bench, "--nproc", "2")
    assert fsdp.returncode == 0, fsdp.stdout[-2000:] + fsdp.stderr[-3000:]
    assert "decoder layers sharded 2 ways" in fsdp.stdout + fsdp.stderr
    assert items("fsdp") == items("one")


def test_several_processes_need_a_run_folder(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "2", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "lora_triplay", "run", str(ROOT / "recipes" / "tiny.yaml")],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "--run-dir" in proc.stderr


def test_a_missing_accelerate_config_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "lora_triplay", "run", str(ROOT / "recipes" / "tiny.yaml"), "--run-dir", str(tmp_path / "r"),
                           "--nproc", "2", "--accelerate-config", str(tmp_path / "nope.yaml")], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nope.yaml: no such file" in proc.stderr
