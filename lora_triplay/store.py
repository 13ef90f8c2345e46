"""The run folder: everything a run produces, written atomically.

Layout (`adapters/<run>/`):
    recipe.yaml                 resolved recipe
    state.json                  the commit point: iteration, phase, step, counts
    rng.safetensors, rng.json   RNG states at the last committed step
    latest/<role>/              current adapter weights (PEFT format)
    optim/<role>.safetensors    optimizer state (+ .json for scalars)
    <role>/iter-NNNN/           adapter snapshot at the end of each phase
    metrics.jsonl, asp.jsonl, eval_pairs.jsonl, transcripts.jsonl

Every file is written to a temp file, fsynced and renamed; `state.json` is
written last, so a crash at any moment leaves the previous step committed.
Append-only JSONL files are cut back to the counts in `state.json` on
resume, so rows written after the last commit are never read twice.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

JSONL = ("metrics", "asp", "eval_pairs", "panel", "transcripts")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


class RunStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    def create(self) -> "RunStore":
        # User-only permissions: transcripts hold adversarial text.
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        return self

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
        file = self.path(f"{name}.jsonl")
        if not file.is_file():
            return []
        with open(file, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def truncate_jsonl(self, name: str, count: int) -> None:
        """Keep the first `count` rows: the ones the last commit counted."""
        rows = self.read_jsonl(name)
        if len(rows) != count:
            body = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows[:count])
            atomic_write(self.path(f"{name}.jsonl"), body.encode("utf-8"))

    # ---------------------------------------------------------------- state
    def has_state(self) -> bool:
        return self.path("state.json").is_file()

    def load_state(self) -> dict:
        return self.read_json("state.json")

    def commit(self, state: dict) -> None:
        self.write_json("state.json", state)

    # ------------------------------------------------------------- adapters
    def latest_dir(self, role: str) -> Path:
        return self.path("latest", role)

    def snapshot_dir(self, role: str, iteration: int) -> Path:
        return self.path(role, f"iter-{iteration:04d}")

    def snapshot(self, role: str, iteration: int) -> Path:
        """Copy latest/<role> to <role>/iter-NNNN through a temp folder and a
        rename, so a half-written snapshot never looks complete."""
        target = self.snapshot_dir(role, iteration)
        if target.is_dir():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        for file in self.latest_dir(role).iterdir():
            if not file.name.startswith("."):
                shutil.copy2(file, tmp / file.name)
                with open(tmp / file.name, "rb") as f:
                    os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
        return target

    def snapshots(self, role: str) -> list[int]:
        folder = self.path(role)
        if not folder.is_dir():
            return []
        return sorted(int(p.name[5:]) for p in folder.glob("iter-[0-9]*") if (p / "adapter_model.safetensors").is_file())

    # ------------------------------------------------------------ optimizer
    def save_optimizer(self, role: str, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer state as safetensors + JSON: no pickle on disk."""
        from safetensors.torch import save

        sd = optimizer.state_dict()
        tensors, scalars = {}, {}
        for idx, entry in sd["state"].items():
            for key, value in entry.items():
                if torch.is_tensor(value):
                    tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
                else:
                    scalars[f"{idx}.{key}"] = value
        atomic_write(self.path("optim", f"{role}.safetensors"), save(tensors) if tensors else save({"_empty": torch.zeros(1)}))
        self.write_json(f"optim/{role}.json", {"param_groups": sd["param_groups"], "scalars": scalars})

    def load_optimizer(self, role: str, optimizer: torch.optim.Optimizer) -> bool:
        from safetensors.torch import load_file

        file = self.path("optim", f"{role}.safetensors")
        if not file.is_file():
            return False
        tensors = load_file(str(file))
        meta = self.read_json(f"optim/{role}.json")
        state: dict[int, dict[str, Any]] = {}
        for name, value in list(tensors.items()) + list(meta["scalars"].items()):
            if name == "_empty":
                continue
            idx, _, key = name.partition(".")
            state.setdefault(int(idx), {})[key] = value
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        return True

    # ------------------------------------------------------------------ RNG
    def save_rng(self) -> None:
        from safetensors.torch import save

        tensors = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                tensors[f"cuda{i}"] = s
        atomic_write(self.path("rng.safetensors"), save(tensors))
        py = random.getstate()
        np_state = np.random.get_state()
        self.write_json("rng.json", {
            "python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        })

    def load_rng(self) -> None:
        from safetensors.torch import load_file

        tensors = load_file(str(self.path("rng.safetensors")))
        torch.set_rng_state(tensors["torch"])
        cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda"))]
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda)
        meta = self.read_json("rng.json")
        v, internal, gauss = meta["python"]
        random.setstate((v, tuple(internal), gauss))
        n = meta["numpy"]
        np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
