"""Writing so that a crash never leaves a half-written file or folder that a
later run would trust: build under a temp name beside the target, fsync,
rename (atomic on POSIX). The one place the project does it."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_tensors(tensors: dict, path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' save_file, with the disk's refusal (full, read-only,
    over a file-size limit) raised as the OSError it is: safetensors wraps it
    in its own error type, which reached the user as a traceback."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as exc:
        code = re.search(r"(?:os error |code: )(\d+)", str(exc))  # 0.8's wording, then older versions' IoError(Os { code: N ...
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None


def write_file(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
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
    fsync_dir(path.parent)


def write_folder(target: Path, fill: Callable[[Path], None], existing: str = "replace") -> Path:
    """Build a folder with `fill(tmp)` under a temp name, fsync its files and
    rename it to `target`: a folder with the final name is always complete.
    `existing`: what to do with a target already there: `replace` it (the
    old one stays whole until the new one is in place), or `keep` it (a
    concurrent builder won) and drop ours."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(tmp)
        for file in tmp.rglob("*"):
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        # and the folders' entries: the rename, then state.json naming the
        # folder, must not reach the disk before the names inside it
        for folder in [*(d for d in tmp.rglob("*") if d.is_dir()), tmp]:
            fsync_dir(folder)
        if target.exists() or target.is_symlink():
            if existing == "keep":
                shutil.rmtree(tmp)
                return target
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(target.parent)
    return target


def plain_write(path: Path, data: bytes) -> None:
    """For files inside a folder that write_folder will rename into place."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data)
