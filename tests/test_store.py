"""The run folder's primitives: atomic files and folders, JSONL cut-back,
optimizer state without pickles, RNG round trip."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from lora_triplay.core.store import RunStore, atomic_write, restore_rng, rng_state


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "a" / "f.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]  # no temp files left


def test_jsonl_truncate_to_committed_count(tmp_path):
    store = RunStore(tmp_path / "run").create()
    store.append_jsonl("metrics", [{"step": 1}, {"step": 2}])
    store.append_jsonl("metrics", [{"step": 3}])  # written, then the process died before commit
    store.truncate_jsonl("metrics", 2)
    assert [r["step"] for r in store.read_jsonl("metrics")] == [1, 2]


def test_an_append_cut_short_is_dropped_not_parsed(tmp_path):
    """A kill in the middle of an append leaves half a row after the
    committed ones: resume cuts it away (it used to fail to parse it, so the
    run could never resume), and readers skip it meanwhile."""
    store = RunStore(tmp_path / "run").create()
    store.append_jsonl("transcripts", [{"step": 1, "text": "é" * 10}, {"step": 2}])
    committed = store.path("transcripts.jsonl").read_bytes()
    with open(store.path("transcripts.jsonl"), "ab") as f:
        f.write(b'{"step": 3, "text": "an answer cut sh')
    assert [r["step"] for r in store.read_jsonl("transcripts")] == [1, 2]
    store.truncate_jsonl("transcripts", 2)
    assert store.path("transcripts.jsonl").read_bytes() == committed  # byte for byte
    store.append_jsonl("transcripts", [{"step": 3}])
    assert [r["step"] for r in store.read_jsonl("transcripts")] == [1, 2, 3]


def test_a_file_shorter_than_its_commit_is_refused(tmp_path):
    from lora_triplay.errors import UserError

    store = RunStore(tmp_path / "run").create()
    store.append_jsonl("asp", [{"prompt": "a"}])
    with pytest.raises(UserError, match="asp.jsonl holds 1 complete rows but the run's last commit counted 3"):
        store.truncate_jsonl("asp", 3)
    assert store.read_jsonl("asp") == [{"prompt": "a"}]  # nothing cut
    store.truncate_jsonl("missing", 0)  # a file the run never wrote: nothing to keep
    with pytest.raises(UserError, match="missing.jsonl holds 0 complete rows"):
        store.truncate_jsonl("missing", 1)


def test_a_damaged_state_file_is_one_clear_error(tmp_path):
    from lora_triplay.errors import UserError

    store = RunStore(tmp_path / "run").create()
    store.commit({"iteration": 1, "step": 3})
    assert store.load_state()["step"] == 3
    store.path("state.json").write_text('{"iteration": 1, "st')
    with pytest.raises(UserError, match="state.json is not valid JSON .*the run folder is damaged"):
        store.load_state()


def test_a_run_folder_is_held_by_one_process(tmp_path):
    """A second `run --resume` on a folder another process holds would
    interleave its commits with the first's: refused before it reads
    anything. The lock goes with the holder (an OS lock: a killed holder
    releases it too), and is re-entrant inside one process (a notebook that
    runs, then resumes)."""
    import subprocess
    import sys
    from pathlib import Path

    from lora_triplay.core.session import Session
    from lora_triplay.errors import UserError
    from lora_triplay.recipe import load_recipe

    run = tmp_path / "run"
    RunStore(run).create().commit({"iteration": 1})
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(run)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        recipe = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml")
        with pytest.raises(UserError, match="in use by another lora-triplay process"):
            Session.open(recipe, run, resume=True)
        with pytest.raises(UserError, match="in use by another lora-triplay process"):
            RunStore(run).lock()
    finally:
        holder.kill()
        holder.wait()
    mine = RunStore(run)
    mine.lock()
    RunStore(run).lock()  # the same process again: fine
    mine.unlock()


def test_a_new_run_never_writes_into_a_folder_of_the_users(tmp_path, tiny_model_dir):
    """A new run in a folder holding the user's files (their recipe.yaml
    among them) is refused before anything is written or chmodded there; an
    empty folder, or what a start killed before its first commit left,
    takes the run."""
    from lora_triplay.core.session import Session
    from lora_triplay.errors import UserError
    from lora_triplay.recipe import build_recipe

    recipe = build_recipe({"model": {"base": tiny_model_dir, "device": "cpu", "dtype": "float32"},
                           "phases": {"red": {"steps": 0}, "blue": {"steps": 0}, "eval": {"steps": 0}}})
    mine = tmp_path / "project"
    mine.mkdir(mode=0o755)
    (mine / "recipe.yaml").write_text("# my notes\n")
    (mine / "notes.txt").write_text("keep me\n")
    with pytest.raises(UserError, match=r"holds files that are not a run's \(notes\.txt, recipe\.yaml\) and no run"):
        Session.open(recipe, mine)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "recipe.yaml"]
    assert (mine / "recipe.yaml").read_text() == "# my notes\n" and (mine.stat().st_mode & 0o777) == 0o755
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UserError, match="is a file, and a run needs a folder"):
        Session.open(recipe, tmp_path / "a-file")
    (mine / "notes.txt").unlink()  # the user's recipe.yaml alone: still the user's (no metrics.jsonl: no run began here)
    with pytest.raises(UserError, match=r"not a run's \(recipe\.yaml\)"):
        Session.open(recipe, mine)
    assert (mine / "recipe.yaml").read_text() == "# my notes\n"
    killed = tmp_path / "killed"  # a start killed after its first files, before state.json
    (killed / "red").mkdir(parents=True)
    for name in ("metrics.jsonl", "asp.jsonl", ".state.json.x1y2"):
        (killed / name).touch()
    empty = tmp_path / "empty"
    (empty / "lost+found").mkdir(parents=True)  # a fresh filesystem's root
    for folder in (killed, empty):
        Session.open(recipe, folder).run()
        assert json.loads((folder / "state.json").read_text())["done"]


def test_a_disk_that_refuses_a_checkpoint_is_an_os_error(tmp_path):
    """safetensors wraps the OS's refusal in its own error type (a
    traceback for the user); the optimizer state's writer raises it as the
    OSError it is, which the CLI words in one line. The refusal here is real:
    a file-size limit in a child process (EFBIG, as a full disk's ENOSPC)."""
    import subprocess
    import sys

    code = ("import resource, signal, sys, torch\n"
            "from pathlib import Path\n"
            "from lora_triplay.core.store import RunStore\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "w = torch.nn.Parameter(torch.zeros(4096))\n"
            "opt = torch.optim.AdamW([w])\n"
            "w.grad = torch.ones(4096)\n"
            "opt.step()\n"
            "try:\n"
            "    RunStore.save_optimizer(Path(sys.argv[1]), opt)\n"
            "except OSError as exc:\n"
            "    print(type(exc).__name__, exc.errno, exc.filename)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["OSError", "27", str(tmp_path / "optimizer.safetensors")], out.stderr


def test_run_folder_is_private(tmp_path):
    store = RunStore(tmp_path / "run").create()
    assert (store.root.stat().st_mode & 0o777) == 0o700


def test_write_folder_is_all_or_nothing(tmp_path):
    store = RunStore(tmp_path / "run").create()

    def fill_then_fail(tmp):
        (tmp / "adapter_model.safetensors").write_bytes(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        store.write_folder(store.snapshot_dir("red", 1), fill_then_fail)
    assert not store.snapshot_dir("red", 1).exists()
    assert list((store.root / "red").iterdir()) == []
    assert store.snapshots("red") == []


def test_optimizer_state_round_trip_without_pickle(tmp_path):
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    opt = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(2):
        sum(p.square().sum() for p in params).backward()
        opt.step()
    RunStore.save_optimizer(tmp_path, opt)
    assert {p.name for p in tmp_path.iterdir()} == {"optimizer.safetensors", "optimizer.json"}
    # the state comes from disk, the hyper-parameters from the optimizer as the
    # recipe built it: a resume with a changed grpo.lr must train at the new rate
    fresh = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in params], lr=5.0, weight_decay=0.3, betas=(0.8, 0.95))
    assert RunStore.load_optimizer(tmp_path, fresh)
    a, b = opt.state_dict(), fresh.state_dict()
    group = b["param_groups"][0]
    assert (group["lr"], group["weight_decay"], tuple(group["betas"])) == (5.0, 0.3, (0.8, 0.95))
    for idx in a["state"]:
        for key, value in a["state"][idx].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["state"][idx][key])), key


def test_snapshot_keeps_the_optimizer_only_when_asked(tmp_path):
    store = RunStore(tmp_path / "run").create()
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors", "optimizer.json"):
        (checkpoint / name).write_bytes(name.encode())
    plain, kept = store.snapshot("eval", 1, checkpoint), store.snapshot("eval", 2, checkpoint, optimizer=True)
    assert {p.name for p in plain.iterdir()} == {"adapter_model.safetensors", "adapter_config.json"}
    assert {p.name for p in kept.iterdir()} == {p.name for p in checkpoint.iterdir()}
    assert (kept / "optimizer.json").read_bytes() == b"optimizer.json"
    assert store.snapshots("eval") == [1, 2]


def test_rng_round_trip_through_json():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = json.loads(json.dumps(rng_state()))
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    restore_rng(saved)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
