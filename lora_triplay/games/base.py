"""What a game is, for the core that runs it (session.py).

The core owns what every multi-role self-play method needs: one frozen
base with one LoRA adapter per role, the engine that serves them all in
mixed batches, a GRPO learner per role, the run folder (checkpoints,
snapshots, JSONL rows, `state.json`), exact resume, several processes,
trackers and progress. A game owns the rest: its roles and their adapter
names, the phases of an iteration and how many steps each takes, what one
step does (rollouts, rewards, the samples the role trains on, metrics),
its own JSONL files and pools, and what it keeps in `state.json`.

A game is a module `lora_triplay/games/<name>.py` defining `GAME`, a
subclass of `Game`; `game: <name>` in a recipe picks it and `game_config:`
(validated by the game's `Config`) configures it, so adding a game touches
no file outside its own module, recipes and prompts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict


class NoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoSections(BaseModel):
    """A game without top-level recipe sections of its own (its settings are
    `game_config`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


@dataclass
class StepResult:
    """One step of a phase: what the phase's role trains on (GRPO samples
    with advantages), its metrics (one `metrics.jsonl` row), and rows for the
    game's own JSONL files (`rows[name]` goes to `<name>.jsonl`)."""

    samples: list
    metrics: dict[str, float]
    rows: dict[str, list[dict]] = field(default_factory=dict)
    # labelled forced choices whose cross-entropy joins the update (supervised.py)
    examples: list = field(default_factory=list)
    smoothing: float = 0.0
    # metrics the game reads off the update's statistics (StepStats.extra),
    # joined to the row: eval's answers come out of its cross-entropy
    # forward, which scores every label before the update moves it
    after_update: Callable[[dict[str, float]], dict[str, float]] | None = None

    def jsonl_rows(self) -> dict[str, list[dict]]:
        return self.rows


class Game:
    """Defaults for every hook; a game overrides what it needs."""

    name: ClassVar[str] = ""
    # role -> PEFT adapter name (a name that is no nn.Module attribute:
    # `eval` would clash, hence TriPlay's `evaluator`)
    roles: ClassVar[dict[str, str]] = {}
    jsonl: ClassVar[tuple[str, ...]] = ()  # the game's files beside metrics.jsonl
    Config: ClassVar[type[BaseModel]] = NoConfig
    # top-level recipe sections the game adds to the core's (recipe.recipe_class)
    Sections: ClassVar[type[BaseModel]] = NoSections
    # metrics worth a column, by phase: the step log line and the closing table
    headline: ClassVar[dict[str, tuple[str, ...]]] = {}
    # protocols `serve` exposes as one model name (pipelines.py): name -> what it does
    pipelines: ClassVar[dict[str, str]] = {}

    def __init__(self, recipe):
        self.recipe = recipe
        self.config = self.Config.model_validate(recipe.game_config or {})
        self.session = None

    # ---------------------------------------------------------- structure
    def phases_of(self, iteration: int) -> list[str]:
        """The phases of one iteration, in order (default: one per role)."""
        return list(self.roles)

    def role_of(self, phase: str) -> str:
        """Whose adapter a phase trains."""
        return phase

    def steps(self, iteration: int, phase: str) -> int:
        """GRPO steps of `phase` this iteration; default `game_config.<phase>_steps`."""
        return getattr(self.config, f"{phase}_steps")

    def snapshot_after(self, phase: str) -> bool:
        """Whether the end of `phase` is a snapshot `<role>/iter-N` of its role."""
        return phase in self.roles

    def lr_of(self, role: str) -> float:
        return self.recipe.grpo.lr

    def phase_lr(self, phase: str, step: int = 1, steps: int = 1) -> float:
        """The learning rate of `phase`'s update `step` of `steps` (a phase
        may train its role at a rate, or a schedule, of its own); default its
        role's."""
        return self.lr_of(self.role_of(phase))

    def segment(self, phase: str, step: int, steps: int) -> tuple[int, int]:
        """Where update `step` of `steps` falls in the stretch of updates that
        trains one set of weights: (its step there, that stretch's steps).
        Default the whole phase; a phase that trains its role several times
        from the same start (TriPlay's warm-start draws) gives each its own,
        so tail averaging ends each draw."""
        return step, steps

    def average_last(self, phase: str) -> int:
        """How many of `phase`'s last steps its role's weights are averaged
        over at the phase's end (training/averaging.py); 0: the last step's
        weights, as trained."""
        return 0

    def max_new_tokens_of(self, role: str) -> int:
        return self.recipe.grpo.max_new_tokens

    def prompts_of(self, role: str) -> int:
        return self.recipe.grpo.prompts_per_step

    def group_size_of(self, role: str) -> int:
        return self.recipe.grpo.group_size

    def temperature_of(self, role: str) -> float:
        return self.recipe.grpo.temperature

    def longest_completion(self) -> int:
        """The longest rollout a role writes (memory planning)."""
        return max(self.max_new_tokens_of(role) for role in self.roles)

    def largest_batch(self) -> int:
        """Completions in the largest GRPO step (memory planning)."""
        return max(self.prompts_of(role) * self.group_size_of(role) for role in self.roles)

    def extra_adapters(self) -> int:
        """Adapters served beside the roles' (past snapshots): memory planning, vLLM's LoRA slots."""
        return 0

    def endpoints(self) -> list[tuple[str, str]]:
        """(the recipe key naming it, `openai:MODEL@URL`) for every endpoint
        the game will call: each is asked once before the model loads."""
        return []

    def initial_state(self) -> dict[str, Any]:
        """The game's keys in a new run's `state.json`."""
        return {}

    # ---------------------------------------------------------- lifetime
    def build(self, session) -> None:
        """After the model, engine and learners exist: pools, judges, data."""
        self.session = session

    def restore(self, store) -> None:
        """On resume, after the adapters: rebuild pools from the JSONL rows."""

    def phase_start(self, iteration: int, phase: str) -> list[dict] | None:
        """Before a phase's first step (also when resuming inside it); may
        return `metrics.jsonl` rows. Default: `measure(0)` before any training."""
        if iteration == 1 and phase == self.phases_of(1)[0] and self.state["step"] == 0:
            return self.measure(0)
        return None

    def measure(self, iteration: int) -> list[dict]:
        """Held-out measurement rows (`phase: measure`), by default before
        training (iteration 0) and after each iteration's last phase; the
        run's RNG is restored on resume, so a redone measurement repeats."""
        return []

    def step(self, phase: str, iteration: int, step: int) -> StepResult:
        raise NotImplementedError

    def after_step(self, iteration: int, phase: str, row: dict) -> list[dict]:
        """Extra `metrics.jsonl` rows after a step (decisions, alarms)."""
        return []

    def commit_step(self, result: StepResult) -> None:
        """After the step's rows are on disk: pools that rewards read."""

    def after_phase(self, iteration: int, phase: str) -> list[dict]:
        """Extra `metrics.jsonl` rows at a phase's end. Default: `measure`
        after the iteration's last phase."""
        return self.measure(iteration) if phase == self.phases_of(iteration)[-1] else []

    # ---------------------------------------------------------- inference
    def play(self, engine, requests: list[str], temperature: float) -> list[dict]:
        """`lora-triplay play RUN REQUEST...` for this game: its roles together
        on each request, as the game deploys them; one dict per request."""
        from ..errors import UserError

        raise UserError(f"game {self.name}: `play` is not defined for it; use `chat --role ROLE`")

    def run_pipeline(self, name: str, chat, request: dict) -> dict:
        """One served request through pipeline `name`: `chat(model, messages,
        max_tokens=, temperature=, prefix=)` is one turn of one role on the
        server; returns {"content": final answer, "turns": {...}}."""
        raise NotImplementedError

    def for_inference(self, engine) -> "Game":
        """This game bound to a loaded run's engine (play), outside training."""
        from types import SimpleNamespace

        self.session = SimpleNamespace(engine=engine, state={"global_step": 0, "step": 0}, store=None)
        return self

    # ----------------------------------------------------------- helpers
    @property
    def state(self) -> dict:
        return self.session.state

    @property
    def engine(self):
        return self.session.engine

    @property
    def store(self):
        return self.session.store
