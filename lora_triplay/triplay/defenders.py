"""Which defenders answer red's prompts in a P_red phase.

Resolved at the start of every red phase, from the recipe's `defenders`:
`blue@N` is the snapshot of iteration N (once it exists); `blue@-N` is the
blue N phases before the current one, so it moves with the run. A defender
whose weights equal an earlier one's is skipped for the phase: `blue@1`
during iteration 2's P_red is the current `blue` (blue has not trained
since), and an untrained snapshot (B = 0) is the bare `base`. Asking the
same weights twice would only double-count them in red's reward. A
defender with a `model` is another model family (an OpenAI-compatible
endpoint or a local model), as the paper's other defenders: it answers
outside the mixed batch, through the expert panel's sources.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from ..core.snapshots import parse_spec

log = logging.getLogger(__name__)
ZERO = "zero-adapter"  # the fingerprint of `base` and of any all-zero adapter


@dataclass(frozen=True)
class Defender:
    name: str  # as the recipe writes it: metrics are asr_<name>
    adapter: str  # what the engine serves: blue, base, blue@N (a model defender: its spec)
    weight: float
    source: object | None = None  # a model defender: experts' EngineSource / EndpointSource, asked with .ask()


def fingerprint(folder: Path) -> str:
    """Identity of an adapter's weights: ZERO when every lora_B is zero."""
    from safetensors.torch import load_file

    weights = Path(folder) / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    if all(not t.any() for k, t in tensors.items() if "lora_B" in k):
        return ZERO
    return hashlib.sha256(weights.read_bytes()).hexdigest()


def model_sources(defenders, engine, device=None, dtype=None, trust_remote_code: bool = False) -> dict[str, object]:
    """One source per model defender (an endpoint, or a local model loaded
    once for the run), by name."""
    from .experts import build_sources

    return {d.name: build_sources([d.model], engine, device, dtype, trust_remote_code)[0] for d in defenders if d.model}


def resolve(defenders, store, engine, sources: dict[str, object] | None = None) -> list[Defender]:
    """The defenders of this red phase, snapshots loaded into the engine,
    duplicates and not-yet-existing snapshots left out (logged); model
    defenders answer through `sources` (model_sources)."""
    snapshots = store.snapshots("blue")
    latest = max(snapshots) if snapshots else 0
    out: list[Defender] = []
    seen: dict[str, str] = {}
    for d in defenders:
        if getattr(d, "model", None):
            out.append(Defender(d.name, d.model, d.weight, (sources or {})[d.name]))
            continue
        spec = parse_spec(d.name)
        if spec.role == "base":
            adapter, print_ = "base", ZERO
        elif spec.index is None:  # the current blue = its latest snapshot (blue trains after red)
            adapter, print_ = "blue", fingerprint(store.snapshot_dir("blue", latest))
        else:
            at = spec.resolve(latest)
            if at is None or at not in snapshots:
                log.info("defender %s skipped this phase: no such blue snapshot yet (latest is iteration %d)", d.name, latest)
                continue
            adapter = f"blue@{at}"
            folder = store.snapshot_dir("blue", at)
            print_ = fingerprint(folder)
            if adapter not in engine.adapters():
                engine.load_adapter(adapter, str(folder))
        if print_ in seen:
            log.info("defender %s skipped this phase: the same weights as %s", d.name, seen[print_])
            continue
        seen[print_] = d.name
        out.append(Defender(d.name, adapter, d.weight))
    used = {d.adapter for d in out}
    for name in engine.adapters():  # snapshots no defender points to any more
        if name.startswith("blue@") and name not in used:
            engine.remove_adapter(name)
    return out
