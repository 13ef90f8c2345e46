"""Names of adapters at a point in a run: `blue`, `blue@3`, `blue@-1`, `base`.

    base       the bare base model (adapters off)
    ROLE       the role's current adapter (red, blue, eval)
    ROLE@N     the role's snapshot after iteration N (`iter-000N`; 0 = untrained)
    ROLE@-N    the snapshot N phases before the role's latest one: during
               iteration k's P_red, `blue` is blue after iteration k-1 and
               `blue@-1` is blue after iteration k-2
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ..errors import UserError

ROLES = ("red", "blue", "eval")
_SPEC = re.compile(r"^([a-z][a-z_]*)(?:@(-?\d+))?$")


def _known_roles() -> set[str]:
    """Every role of every game (games/): `attacker@2` names a Taboo snapshot."""
    from ..games import available, game_class

    return {role for name in available() for role in game_class(name).roles}


class SpecError(UserError):
    """A malformed adapter name; the message says what is accepted."""


@dataclass(frozen=True)
class Spec:
    text: str
    role: str  # red, blue, eval, or base
    index: int | None  # None: the current adapter; >= 0 an iteration; < 0 relative to the latest

    @property
    def relative(self) -> bool:
        return self.index is not None and self.index < 0

    def resolve(self, latest: int) -> int | None:
        """The iteration a relative spec points to, given the role's latest
        snapshot; None when it would be before iteration 0."""
        if not self.relative:
            return self.index
        at = latest + self.index
        return at if at >= 0 else None


def parse_role(text: str, *, allow_base: bool = True, allow_relative: bool = False) -> tuple[str, int | None]:
    """(role, iteration or None) of a name a command takes: `blue`, `blue@3`,
    `base` (when allowed); `blue@-1` only where a run resolves it."""
    spec = parse_spec(text)
    if spec.role == "base" and not allow_base:
        raise SpecError(f"{text!r}: base is not a role here; use red, blue, eval or ROLE@N")
    if spec.relative and not allow_relative:
        raise SpecError(f"{text!r}: a relative snapshot (ROLE@-N) means something only inside a run; use ROLE@N")
    return spec.role, spec.index


def parse_spec(text: str) -> Spec:
    text = text.strip()
    if text == "base":
        return Spec(text, "base", None)
    m = _SPEC.match(text)
    if not m or m.group(1) not in _known_roles():
        raise SpecError(f"{text!r} is not an adapter name: use base, red, blue, eval, ROLE@N (iteration N) or ROLE@-N (N phases back)")
    index = None if m.group(2) is None else int(m.group(2))
    return Spec(text, m.group(1), index)


def parse_iterations(spec: str, available: Sequence[int]) -> list[int]:
    """`all`, `latest` or `N,M,...` against the snapshots present."""
    have = sorted(available)
    spec = (spec or "all").strip().lower()
    if spec == "all":
        return have
    if spec == "latest":
        return have[-1:]
    try:
        wanted = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise UserError(f"--iterations {spec!r}: use all, latest or a list such as 0,2,4") from None
    missing = [i for i in wanted if i not in have]
    if missing:
        raise UserError(f"--iterations {spec!r}: no snapshots for {missing}; present: {have}")
    return wanted
