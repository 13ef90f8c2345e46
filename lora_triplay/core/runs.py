"""Open a finished (or running) run folder for inference.

Loads the run's base once, then the role adapters a command asks for:
`blue` (latest weights), `blue@3` (the snapshot of iteration 3), and so on,
all on one PeftModel served by one engine, so commands can mix roles and
iterations in a single batch without reloading the base.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..bases import ModelError
from ..model import add_frozen_adapter, load_adapter_weights, load_role_model
from ..recipe import Recipe, build_recipe, read_yaml
from .snapshots import parse_role
from .store import RunStore


@dataclass
class OpenRun:
    recipe: Recipe
    store: RunStore
    model: object  # PeftModel with the game's role adapters (+ snapshots)
    tokenizer: object
    engine: object  # HFEngine
    base_path: str
    roles: dict[str, str]  # the game's role -> adapter name (TriPlay: eval -> evaluator)

    def adapter(self, name: str) -> str:
        """What the engine serves a user's name as: `eval@2` -> `evaluator@2`
        (the game's adapter names), `base` as it is."""
        head, at, tail = name.partition("@")
        return self.roles.get(head, head) + at + tail

    def loaded(self) -> list[str]:
        """The user's names of what the engine serves (`evaluator@2` -> `eval@2`)."""
        inverse = {adapter: role for role, adapter in self.roles.items()}
        return [inverse.get(a.partition("@")[0], a.partition("@")[0]) + a.partition("@")[1] + a.partition("@")[2]
                for a in self.engine.adapters()]

    def ensure(self, name: str) -> str:
        """Make `name` (`blue`, `eval@2`, `base`...) servable; return the
        engine's adapter name for it."""
        adapter = self.adapter(name)
        if name == "base" or adapter in self.engine.adapters():
            return adapter
        role, it = parse_role(name, allow_base=False)
        if it is None:
            raise ModelError(f"adapter {name!r} is not loaded; name a snapshot such as {role}@1")
        folder = snapshot_folder(self.store, role, it)
        self.engine.load_adapter(adapter, str(folder))
        return adapter


def snapshot_folder(store: RunStore, role: str, iteration: int | None) -> Path:
    """`<role>/iter-NNNN` for an iteration, the latest weights for None."""
    if iteration is None:
        folder = store.latest_dir(role)
    else:
        folder = store.snapshot_dir(role, iteration)
    if not (folder / "adapter_model.safetensors").is_file():
        have = store.snapshots(role)
        if iteration is None:
            raise ModelError(f"{store.root}: the latest {role} adapter ({folder}) is missing: the run folder is damaged; "
                             f"pass --iteration N for a snapshot (present: {have or 'none'})")
        raise ModelError(
            f"{store.root}: no {role} adapter for iteration {iteration}; snapshots present: {have or 'none'}"
        )
    return folder


def read_run_recipe(run_dir: Path) -> Recipe:
    file = Path(run_dir) / "recipe.yaml"
    if not file.is_file():
        raise ModelError(f"{run_dir} is not a lora-triplay run folder (no recipe.yaml); pass the folder `run` wrote")
    return build_recipe(read_yaml(file), source=str(file))  # a damaged file: one line naming it


def open_run(run_dir: Path, iteration: int | None = None, *, device: str | None = None, world: int = 1) -> OpenRun:
    """Load base + the game's role adapters at `iteration` (None = latest);
    `world` processes share a sharded base where the recipe asks (model.fsdp)."""
    from ..engine.hf import HFEngine
    from ..games import game_class

    run_dir = Path(run_dir)
    recipe = read_run_recipe(run_dir)
    if device:
        recipe.model.device = device
    store = RunStore(run_dir)
    roles = game_class(recipe.game).roles  # role -> adapter name, whatever the game
    model, tokenizer, base_path = load_role_model(recipe.model, recipe.lora, recipe.seed, list(roles.values()), world)
    for role, adapter in roles.items():
        load_adapter_weights(model, adapter, snapshot_folder(store, role, iteration), expect_rank=recipe.lora.rank)
    model.eval()
    engine = HFEngine(
        model, tokenizer,
        chat_kwargs={"enable_thinking": recipe.model.enable_thinking},
        max_batch_size=recipe.engine.max_batch_size, lora=recipe.lora,
    )
    return OpenRun(recipe, store, model, tokenizer, engine, base_path, dict(roles))


__all__ = ["OpenRun", "open_run", "read_run_recipe", "snapshot_folder", "add_frozen_adapter"]
