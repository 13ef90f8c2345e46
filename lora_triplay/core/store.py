"""The run folder: everything a run produces, written atomically.

Layout (`adapters/<run>/`):
    recipe.yaml                      resolved recipe
    state.json                       the commit point: iteration, phase, step,
                                     data cursors, row counts, RNG states and
                                     which checkpoint holds each role
    checkpoints/<role>/step-NNNNNN/  a role's adapter (PEFT format) and its
                                     optimizer state after global step N
    <role>/iter-NNNN/                adapter snapshot at the end of each phase
    metrics.jsonl, asp.jsonl, eval_pairs.jsonl, panel.jsonl, transcripts.jsonl

A checkpoint folder is built under a temp name and renamed, files are
fsynced, and `state.json` is replaced last: it is the single commit point.
A crash at any moment leaves the previous step committed: a newer
checkpoint folder is ignored (and pruned), and the append-only JSONL files
are cut back to the row counts in `state.json` on resume.
"""
from __future__ import annotations

import base64
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from ..errors import UserError
from ..outputs import RUN_FILES, RUN_FOLDERS
from .atomic import save_tensors, write_file, write_folder
from .faults import crash_point

atomic_write = write_file  # the name the rest of the code and the tests use
IGNORED = {"lost+found", ".DS_Store"}  # what a filesystem or a file browser puts in any folder
_HELD: dict[str, int] = {}  # run folders this process holds (RunStore.lock), by real path


class RunStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    def create(self) -> "RunStore":
        # User-only permissions: transcripts hold adversarial text.
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        return self

    def lock(self) -> None:
        """Hold the run folder (an flock on the folder itself, released by
        the OS however the process ends): a second `run` or `--resume` on the
        same folder from another process would interleave its commits with
        ours. Re-entrant within a process (a notebook that runs, then
        resumes). The lock is the host's: on a shared filesystem another
        node's process may not see it; where the filesystem has no flock, the
        run goes on unlocked, with a warning."""
        import errno
        import fcntl
        import logging

        key = os.path.realpath(self.root)
        if key in _HELD:
            return
        fd = os.open(self.root, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{self.root} is in use by another lora-triplay process; wait for it to end (or stop it), "
                            "then resume with --resume") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL):
                raise
            logging.getLogger(__name__).warning("%s: this filesystem cannot lock the run folder (%s); make sure no other "
                                                "process runs in it", self.root, exc.strerror)
            return
        _HELD[key] = fd

    def unlock(self) -> None:
        """Let the folder go (before it is deleted, or for another process)."""
        fd = _HELD.pop(os.path.realpath(self.root), None)
        if fd is not None:
            os.close(fd)

    def check_new_run_folder(self, own: Iterable[str]) -> None:
        """Refuse to start a run in a folder that holds something a run did
        not write (`own`: the names a run writes, besides state.json and the
        trackers' folders): the run would chmod it to the user alone and
        write beside, or over, what is there (a `recipe.yaml` of the user's).
        A new folder, an empty one, or what a start killed before its first
        commit left behind (it always begins with metrics.jsonl) is fine."""
        if not self.root.is_dir():
            if self.root.exists():
                raise UserError(f"{self.root} is a file, and a run needs a folder: choose another --run-dir (or run.root / run.name)")
            return
        names = {*RUN_FILES, *RUN_FOLDERS, *own}
        started = (self.root / "metrics.jsonl").is_file()
        foreign = sorted(p.name for p in self.root.iterdir()
                         if p.name not in IGNORED and not (started and (p.name in names or any(p.name.startswith(f".{n}.") for n in names))))
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise UserError(f"{self.root} holds files that are not a run's ({shown}) and no run (no state.json): a new run "
                            "needs a new or empty folder; choose another --run-dir (or --resume a run's own folder)")

    # ---------------------------------------------------------------- files
    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def write_text(self, name: str, text: str) -> None:
        atomic_write(self.path(name), text.encode("utf-8"))

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write(self.path(name), (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))

    def read_json(self, name: str) -> Any:
        return json.loads(self.path(name).read_text(encoding="utf-8"))

    def append_jsonl(self, name: str, rows: Iterable[dict]) -> int:
        """Append rows (durably); return how many were written."""
        lines = [json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows]
        if not lines:
            return 0
        with open(self.path(f"{name}.jsonl"), "a", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        return len(lines)

    def read_jsonl(self, name: str) -> list[dict]:
        return list(self.iter_jsonl(name))

    def iter_jsonl(self, name: str):
        """Rows one at a time (the pools rebuilt on resume can be large). A
        last line without its newline is an append a crash cut short (every
        row is written with one): never committed, so not a row."""
        file = self.path(f"{name}.jsonl")
        if not file.is_file():
            return
        with open(file, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    return
                if line.strip():
                    yield json.loads(line)

    def truncate_jsonl(self, name: str, count: int) -> None:
        """Keep the first `count` rows, the ones the last commit counted, byte
        for byte. The lines after them are not parsed: a crash in the middle
        of an append leaves half a row there."""
        file = self.path(f"{name}.jsonl")
        kept = rows = 0
        if file.is_file():
            with open(file, "rb") as f:
                for line in f:
                    if rows == count or not line.endswith(b"\n"):
                        break
                    kept += len(line)
                    rows += bool(line.strip())
        if rows < count:
            raise UserError(f"{file} holds {rows} complete rows but the run's last commit counted {count}: the run folder "
                            "was edited or damaged since; restore the file from a copy, or start the run afresh")
        if file.is_file() and file.stat().st_size != kept:
            with open(file, "r+b") as f:
                f.truncate(kept)
                f.flush()
                os.fsync(f.fileno())

    # ---------------------------------------------------------------- state
    def has_state(self) -> bool:
        return self.path("state.json").is_file()

    def load_state(self) -> dict:
        try:
            state = self.read_json("state.json")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # written atomically: only an edit or a bad disk does this
            raise UserError(f"{self.path('state.json')} is not valid JSON ({exc}): the run folder is damaged; restore the "
                            "file from a copy, or start the run afresh") from None
        if not isinstance(state, dict) or not isinstance(state.get("checkpoints", {}), dict):
            raise UserError(f"{self.path('state.json')} is not a run's state (a mapping with a `checkpoints` mapping): the run "
                            "folder is damaged; restore the file from a copy, or start the run afresh")
        return state

    def commit(self, state: dict) -> None:
        self.write_json("state.json", state)

    # ------------------------------------------------------------- adapters
    def checkpoint_dir(self, role: str, global_step: int) -> Path:
        return self.path("checkpoints", role, f"step-{global_step:06d}")

    def latest_dir(self, role: str) -> Path:
        """The committed checkpoint of `role` (adapter + optimizer)."""
        where = self.load_state().get("checkpoints", {}).get(role)
        if not isinstance(where, str):
            raise UserError(f"{self.path('state.json')} names no checkpoint of {role}: the run folder is damaged, or the run "
                            "has not committed its first step; pass --iteration N for a snapshot")
        return self.path(where)

    def write_folder(self, target: Path, fill) -> Path:
        """Build a folder under a temp name, fsync, rename into place."""
        return write_folder(target, fill)

    def prune(self, role: str, keep: Path) -> None:
        """Drop a role's checkpoints other than `keep`, and stale temp folders."""
        for folder in self.path("checkpoints", role).glob("*"):
            if folder.resolve() != keep.resolve():
                shutil.rmtree(folder, ignore_errors=True)
        for stale in self.path(role).glob(".iter-*"):
            shutil.rmtree(stale, ignore_errors=True)

    def snapshot_dir(self, role: str, iteration: int) -> Path:
        return self.path(role, f"iter-{iteration:04d}")

    def snapshot(self, role: str, iteration: int, source: Path, optimizer: bool = False) -> Path:
        """Copy a checkpoint's adapter files to <role>/iter-NNNN (and its
        optimizer state with `optimizer`: run.snapshot_optimizer)."""
        names = ["adapter_model.safetensors", "adapter_config.json"]
        if optimizer and (source / "optimizer.safetensors").is_file():
            names += ["optimizer.safetensors", "optimizer.json"]

        def fill(tmp: Path) -> None:
            for name in names:
                shutil.copy2(source / name, tmp / name)
                crash_point("snapshot")

        return self.write_folder(self.snapshot_dir(role, iteration), fill)

    def snapshots(self, role: str) -> list[int]:
        folder = self.path(role)
        if not folder.is_dir():
            return []
        return sorted(int(p.name[5:]) for p in folder.glob("iter-[0-9]*") if (p / "adapter_model.safetensors").is_file())

    # ------------------------------------------------------------ optimizer
    @staticmethod
    def save_optimizer(folder: Path, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer state as safetensors + JSON: no pickle on disk."""
        sd = optimizer.state_dict()
        tensors, scalars = {}, {}
        for idx, entry in sd["state"].items():
            for key, value in entry.items():
                if torch.is_tensor(value):
                    tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
                else:
                    scalars[f"{idx}.{key}"] = value
        save_tensors(tensors or {"_empty": torch.zeros(1)}, folder / "optimizer.safetensors")
        (folder / "optimizer.json").write_text(json.dumps({"param_groups": sd["param_groups"], "scalars": scalars}))

    @staticmethod
    def load_optimizer(folder: Path, optimizer: torch.optim.Optimizer) -> bool:
        """The saved state (moments, step counts) into `optimizer`; its
        hyper-parameters (lr, betas, weight decay) stay the ones it was built
        with, i.e. the recipe's: a resume with `--allow-recipe-change` and a
        new `grpo.lr` trains at the new rate."""
        from safetensors.torch import load_file

        file = folder / "optimizer.safetensors"
        if not file.is_file():
            return False
        tensors = load_file(str(file))
        meta = json.loads((folder / "optimizer.json").read_text())
        state: dict[int, dict[str, Any]] = {}
        for name, value in list(tensors.items()) + list(meta["scalars"].items()):
            if name == "_empty":
                continue
            idx, _, key = name.partition(".")
            state.setdefault(int(idx), {})[key] = value
        recipe = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        for group, settings in zip(optimizer.param_groups, recipe):
            group.update(settings)
        return True


# ---------------------------------------------------------------------- RNG
def rng_state() -> dict:
    """Every RNG the run draws from, as JSON (it lives in state.json, so it
    commits atomically with the step it belongs to)."""
    py = random.getstate()
    np_state = np.random.get_state()
    out = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(state: dict) -> None:
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]])


class FollowerStore(RunStore):
    """The run folder as a rank other than 0 sees it in a multi-process
    run: the same paths, read from, never written (rank 0 writes; every
    rank waits for it at each commit). Writes return what rank 0's return."""

    def create(self) -> "RunStore":
        return self

    def lock(self) -> None:
        """Rank 0 holds the folder for the run."""

    def unlock(self) -> None:
        pass

    def write_text(self, name: str, text: str) -> None:
        pass

    def write_json(self, name: str, obj: Any) -> None:
        pass

    def append_jsonl(self, name: str, rows: Iterable[dict]) -> int:
        return len(list(rows))

    def truncate_jsonl(self, name: str, count: int) -> None:
        pass

    def commit(self, state: dict) -> None:
        pass

    def write_folder(self, target: Path, fill) -> Path:
        return target

    def prune(self, role: str, keep: Path) -> None:
        pass
