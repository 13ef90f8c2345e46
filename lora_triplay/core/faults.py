"""Fail points for crash tests.

`LORA_TRIPLAY_CRASH_AT="checkpoint:2,generate:5"` makes the process SIGKILL
itself the 2nd time it reaches `crash_point("checkpoint")` (or the 5th
`generate`): the resume tests kill a run at exact, repeatable moments
(mid-generation, mid-optimizer-step, half-way through writing a folder,
between the data files and the commit). Unset, it costs one dict lookup.
"""
from __future__ import annotations

import os
import signal

_seen: dict[str, int] = {}


def crash_point(name: str) -> None:
    spec = os.environ.get("LORA_TRIPLAY_CRASH_AT")
    if not spec:
        return
    for item in spec.split(","):
        point, _, nth = item.strip().partition(":")
        if point == name:
            _seen[name] = _seen.get(name, 0) + 1
            if _seen[name] == int(nth or 1):
                os.kill(os.getpid(), signal.SIGKILL)
