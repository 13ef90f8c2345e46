"""Games: the multi-role self-play methods the core runs (games/base.py).

`game: NAME` in a recipe loads `lora_triplay.games.NAME` and its `GAME`;
TriPlay, the method the project is named for, is a package of its own
(`lora_triplay.triplay`, its `GAME` in triplay/game.py).
"""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import UserError
from .base import Game, StepResult

DEFAULT = "triplay"
PACKAGES = {"triplay": "lora_triplay.triplay.game"}  # games that are packages of their own


def available() -> list[str]:
    return sorted({m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"} | set(PACKAGES))


def game_class(name: str) -> type[Game]:
    if name not in available():
        raise UserError(f"game: {name!r} is not a game here; choose one of {', '.join(available())}")
    return importlib.import_module(PACKAGES.get(name, f"{__name__}.{name}")).GAME


def make_game(recipe) -> Game:
    return game_class(recipe.game)(recipe)


__all__ = ["DEFAULT", "Game", "StepResult", "available", "game_class", "make_game"]
