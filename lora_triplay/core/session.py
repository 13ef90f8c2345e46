"""The core of a run, whatever the game: model, engine, learners and the
run folder, kept in step.

`Session.open()` builds or resumes a run; `Session.run()` drives the
game's iterations and phases (games/: TriPlay's are P_red -> P_blue ->
P_eval) and commits after every GRPO step: adapter + optimizer + JSONL
rows + RNG first, `state.json` last. What a step does is the game's.
"""
from __future__ import annotations

import logging
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import UserError
from ..games import StepResult, make_game
from ..judging.fixed import check_endpoints
from ..model import (
    activate,
    adapter_parameters,
    check_lora_targets,
    load_adapter_weights,
    load_role_model,
    pick_device,
    save_adapter,
)
from ..recipe import (
    Recipe,
    RecipeError,
    build_recipe,
    diff_recipes,
    read_yaml,
)
from ..training.averaging import add_to_tail, take_tail_average
from ..training.grpo import GrpoLearner
from ..training.logprobs import LogprobComputer, logit_transform
from ..training.sharding import is_sharded
from .distributed import Collective
from .faults import crash_point
from .store import FollowerStore, RunStore, restore_rng, rng_state
from .trackers import Trackers, check_installed

log = logging.getLogger(__name__)
STATE_VERSION = 2


class RunError(UserError):
    """A run-level problem (resume mismatch, numerical failure), for the user."""


@dataclass
class Hooks:
    """Callbacks the CLI uses for progress bars and log lines."""

    phase_start: Callable[[int, str, int, int], None] = lambda it, phase, done, total: None
    step_done: Callable[[dict], None] = lambda row: None
    phase_end: Callable[[int, str], None] = lambda it, phase: None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_fits_gpu(recipe: Recipe, world: int = 1) -> None:
    """On CUDA, before any weight is loaded: refuse a recipe that cannot fit
    this GPU (the arithmetic of `lora-triplay plan`; with model.fsdp, as
    one of `world` GPUs sharing the base)."""
    if pick_device(recipe.model).type != "cuda":
        return
    from ..plan import PlanError, make_plan

    total = torch.cuda.get_device_properties(0).total_memory / 1e9
    try:
        plan = make_plan(recipe, gpus=world, gpu_memory_gb=total)
    except PlanError as exc:
        log.warning("memory plan skipped: %s", exc)
        return
    if not plan.fits:
        raise RecipeError(plan.refusal("recipe") + " (see `lora-triplay plan RECIPE`; --skip-plan-check to try anyway)")
    log.info("memory plan: %.1f of %.0f GB per GPU at the peak", plan.peak_gb, total)


class Session:
    def __init__(self, recipe: Recipe, store: RunStore, state: dict, check_plan: bool = True, collective: Collective | None = None):
        self.recipe, self.store, self.state = recipe, store, state
        self.game = make_game(recipe)
        self.files = ("metrics", *self.game.jsonl)  # the run folder's JSONL files
        self.collective = collective or Collective(world=1)
        self.hooks = Hooks()
        self.check_plan = check_plan

    # ------------------------------------------------------------- opening
    @classmethod
    def open(cls, recipe: Recipe, run_dir: Path, *, resume: bool = False, allow_recipe_change: bool = False,
             check_plan: bool = True) -> "Session":
        # Several processes (accelerate launch): every rank runs this loop on
        # the same data; rank 0 alone writes the run folder (distributed.py).
        collective = Collective()
        store = RunStore(run_dir) if collective.main else FollowerStore(run_dir)
        game = make_game(recipe)
        created, changed = False, []
        had_state = store.has_state()
        if not resume and not had_state:  # every rank: they raise alike
            RunStore(run_dir).check_new_run_folder([*game.roles, *(f"{n}.jsonl" for n in ("metrics", *game.jsonl))])
        collective.barrier()  # every rank has looked before rank 0 writes
        if resume:
            if not had_state:
                raise RunError(f"--resume: {run_dir} holds no run (no state.json); drop --resume to start a new run there")
            store.lock()
            saved = build_recipe(read_yaml(store.path("recipe.yaml")), source=str(store.path("recipe.yaml")))
            changed = diff_recipes(saved, recipe)
            if changed and not allow_recipe_change:
                raise RecipeError(
                    "--resume with a different recipe; differing keys: " + "; ".join(changed)
                    + ". Resume with the same recipe and overrides (the run keeps them: `lora-triplay run "
                    + f"{store.path('recipe.yaml')} --resume --run-dir {run_dir}`), or pass --allow-recipe-change to accept the new values"
                )
            state = store.load_state()
            if state.get("version") != STATE_VERSION:
                raise RunError(f"{run_dir} was written by another version of lora-triplay (state version {state.get('version')}, "
                               f"this one reads {STATE_VERSION}); finish it with that version or start a new run")
            if changed:
                log.warning("resuming under a changed recipe: %s", "; ".join(changed))
            if state["done"] and recipe.iterations > state["iteration"]:
                # every rank decides this from the state and the recipe alone: a
                # follower may read recipe.yaml after rank 0 has rewritten it
                nxt = state["iteration"] + 1
                state.update(done=False, iteration=nxt, phase=game.phases_of(nxt)[0], step=0)
                log.warning("the finished run goes on to iteration %d of %d", nxt, recipe.iterations)
        else:
            created = collective.main and not Path(run_dir).exists()
            if not had_state:
                store.create()
                store.lock()
            if had_state or store.has_state():  # or another process started a run here since we looked
                raise RunError(f"{run_dir} already holds a run; resume it with --resume, or choose another --run-dir")
            files = ("metrics", *game.jsonl)
            for name in files if collective.main else ():  # every run folder has the same files, empty or not
                store.path(f"{name}.jsonl").touch(mode=0o600)
            state = {
                "version": STATE_VERSION, "iteration": 1, "phase": game.phases_of(1)[0], "step": 0, "done": False,
                **game.initial_state(), "counts": {name: 0 for name in files},
                "global_step": 0, "base": recipe.model.base, "checkpoints": {},
                "nonfinite": {role: 0 for role in game.roles},
            }
        if state.get("world_size", collective.world) != collective.world:
            # Rollouts are seeded per request and gradients summed over ranks:
            # the world size only moves work between ranks (README: scale out).
            log.info("resuming a run written by %d process(es) with %d", state["world_size"], collective.world)
        state["world_size"] = collective.world
        session = cls(recipe, store, state, check_plan=check_plan, collective=collective)
        try:
            session._build(fresh=not resume)
        except BaseException:
            if not resume and created:  # a failed start leaves no half-made run behind
                store.unlock()
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        if resume and changed:  # only once the run has resumed under it: a change that cannot load leaves the folder as it was
            session._keep_recipe()
        return session

    def _build(self, fresh: bool) -> None:
        r = self.recipe
        _seed_everything(r.seed)
        check_installed(r.run.report_to)  # before minutes of model loading
        if self.check_plan:
            check_fits_gpu(r, self.collective.world)
        if fresh:
            check_lora_targets(r.model, r.lora)  # a typo among the names would leave a projection without LoRA
        check_endpoints(self.game.endpoints(), self.collective)  # a wrong URL, key or model name: now, not at the first judging
        t0 = time.perf_counter()
        game = self.game
        shared = self._load_shared()
        if shared is None:
            self.model, self.tokenizer, self.base_path = load_role_model(r.model, r.lora, r.seed, list(game.roles.values()), self.collective.world)
        else:
            self.model, self.tokenizer, self.base_path, self.engine = shared
        self.model.eval()
        log.info("base %s loaded with %d adapters in %.1fs (game %s)", r.model.base, len(game.roles), time.perf_counter() - t0, game.name)
        if shared is None:
            self.engine = self._make_engine()
        if r.engine.backend == "vllm":
            # vLLM seeds torch's RNG when it starts: reseed, so the first
            # rollouts do not depend on whether it started before the
            # trainer (shared base) or after it.
            _seed_everything(r.seed)
        if self.collective.world > 1:
            from ..engine.sharded import ShardedEngine

            tp = r.engine.tensor_parallel_size if r.engine.backend == "vllm" else 1
            self.engine = ShardedEngine(self.engine, self.collective, group=tp)
        self._unlogged: list[dict] = []  # this step's and earlier uncommitted rows, for the trackers after the commit
        self.trackers = Trackers(r.run.report_to if self.collective.main else [], self.store.root, r.model_dump(mode="json"), self.store.root.name)
        self.learners: dict[str, GrpoLearner] = {}
        computer = LogprobComputer(r.grpo.logprob_kernel, r.grpo.logprob_chunk_tokens, logit_transform(self.model.config))
        for role, adapter in game.roles.items():
            params = list(adapter_parameters(self.model, adapter).values())
            self.learners[role] = GrpoLearner(self.model, params, r.grpo, game.lr_of(role), self.tokenizer.pad_token_id,
                                              computer=computer, max_new_tokens=game.max_new_tokens_of(role), collective=self.collective)
        game.build(self)
        if fresh:
            self.store.write_text("recipe.yaml", r.dump())
            for role in game.roles:
                self.state["checkpoints"][role] = self._checkpoint(role)
                # iteration 0: the untrained adapter (B = 0, i.e. the base)
                self.store.snapshot(role, 0, self.store.path(self.state["checkpoints"][role]))
            self._commit()
        else:
            self._restore()

    def _load_shared(self):
        """(model, tokenizer, base path, engine) on one base copy when
        `engine.share_base` applies (engine/shared_base.py), else None."""
        r = self.recipe
        if r.engine.backend != "vllm" or r.engine.share_base is False:
            return None
        from ..engine import shared_base

        share, reason = shared_base.wanted(r, self.collective.world)
        if not share:
            log.info("engine.share_base=auto: two copies of the base (trainer and vLLM): %s", reason)
            return None
        from ..engine.vllm import VLLMEngine

        out = VLLMEngine.with_shared_trainer(r, list(self.game.roles.values()), self.game, self.collective.world,
                                             {"enable_thinking": r.model.enable_thinking})
        if isinstance(out, tuple):
            return out
        if r.engine.share_base is True:
            raise UserError(f"engine.share_base=true: the start-up check refused to share the base: {out}; "
                            "set engine.share_base=false (and report it: the mapping onto vLLM's layout is wrong)")
        log.warning("engine.share_base=auto: the start-up check refused to share (%s); loading a second copy", out)
        return None

    def _make_engine(self):
        r = self.recipe
        chat_kwargs = {"enable_thinking": r.model.enable_thinking}
        if r.engine.backend == "vllm":
            from ..engine.vllm import VLLMEngine  # noqa: PLC0415 (optional dependency)

            return VLLMEngine.from_session(self, chat_kwargs)
        from ..engine.hf import HFEngine

        return HFEngine(self.model, self.tokenizer, chat_kwargs=chat_kwargs, max_batch_size=r.engine.max_batch_size, lora=r.lora)

    def _restore(self) -> None:
        """Put every piece back exactly as the last commit left it."""
        st, store = self.state, self.store
        for name in self.files:  # rank 0 cuts the rows back to the last commit's counts ...
            store.truncate_jsonl(name, st["counts"].get(name, 0))
        self.collective.barrier()  # ... before any rank reads them
        for role, adapter in self.game.roles.items():
            folder = store.path(st["checkpoints"][role])
            load_adapter_weights(self.model, adapter, folder, expect_rank=self.recipe.lora.rank)
            if not store.load_optimizer(folder, self.learners[role].optimizer):  # every checkpoint is written with one
                raise RunError(f"{folder} has no optimizer state (optimizer.safetensors): the run folder is damaged, and a "
                               f"resume would restart {role}'s AdamW from nothing; restore the file, or start the run afresh")
            self.learners[role].nonfinite_in_a_row = st["nonfinite"][role]
            self.engine.sync_adapter(adapter)
            store.prune(role, keep=folder)  # checkpoints written after the last commit
        self.game.restore(store)
        restore_rng(st["rng"])
        log.info("resumed %s at iteration %d, phase %s, step %d", store.root, st["iteration"], st["phase"], st["step"])

    def _checkpoint(self, role: str) -> str:
        """Write the role's adapter and optimizer state into a new checkpoint
        folder; it counts once `state.json` points to it."""
        bad = [n for n, t in adapter_parameters(self.model, self.game.roles[role]).items() if not torch.isfinite(t).all()]
        if bad:
            raise RunError(
                f"the {role} adapter holds NaN/inf weights ({bad[0]}); it was not saved. The last good one is "
                f"{self.store.root / self.state['checkpoints'].get(role, '?')}; lower grpo.lr and resume with --allow-recipe-change"
            )

        def fill(tmp: Path) -> None:
            save_adapter(self.model, self.game.roles[role], tmp, self.base_path)
            crash_point("checkpoint")  # half-written: the folder still has its temp name
            self.store.save_optimizer(tmp, self.learners[role].optimizer)

        folder = self.store.write_folder(self.store.checkpoint_dir(role, self.state["global_step"]), fill)
        return str(folder.relative_to(self.store.root))

    def _commit(self) -> None:
        self.state["rng"] = rng_state()
        crash_point("commit")
        self.store.commit(self.state)
        self.collective.barrier()  # what rank 0 wrote is there before any rank reads it

    def _keep_recipe(self) -> None:
        """--resume --allow-recipe-change, resumed: the run goes on under the
        new recipe, so recipe.yaml becomes it (the next resume, `report` and
        `eval` read it), the old one kept as recipe.prev-<global step>.yaml.
        A finished run that the change does not extend trains nothing under
        it: its recipe stays the one it ran under."""
        st, store = self.state, self.store
        if st["done"]:
            log.warning("the run is finished and the change adds no iteration: nothing trains, recipe.yaml stays as it ran")
            return
        prev = f"recipe.prev-{st['global_step']:06d}.yaml"
        if self.collective.main:
            if not store.path(prev).exists():  # a second change before any step keeps the recipe the steps ran under
                store.write_text(prev, store.path("recipe.yaml").read_text())
            store.write_text("recipe.yaml", self.recipe.dump())

    # ----------------------------------------------------------------- run
    def run(self) -> None:
        st, game = self.state, self.game
        while not st["done"]:
            it, phase = st["iteration"], st["phase"]
            role = game.role_of(phase)
            total = game.steps(it, phase)
            self.hooks.phase_start(it, phase, st["step"], total)
            if st["step"] < total:  # rows a game measures first (committed with the phase's first step)
                st["counts"]["metrics"] += self.store.append_jsonl("metrics", game.phase_start(it, phase) or [])
            activate(self.model, game.roles[role])
            self.model.eval()
            self._place_optimizer_states(role)
            while st["step"] < total:
                self._one_step(it, phase, total)
                total = game.steps(it, phase)  # a game may end a phase early (TriPlay: control.py)
            if game.snapshot_after(phase):
                self.store.snapshot(role, it, self.store.path(st["checkpoints"][role]), optimizer=self.recipe.run.snapshot_optimizer)
            self._check_ranks_agree(role)
            self._after_phase(it, phase)
            self.hooks.phase_end(it, phase)
            self._advance_phase()
        if is_sharded(self.model):  # what keeping the ranks in step cost (sharding.py), all ranks together
            engine = getattr(self.engine, "lockstep", None)
            mine = (engine.dummies if engine else 0, sum(x.lockstep_dummies for x in self.learners.values()))
            every = self.collective.gather(mine)
            log.info("model.fsdp: %d engine forwards and %d GRPO micro-batch slots (each forward + backward per update) "
                     "ran only to keep step with the other ranks",
                     sum(x[0] for x in every), sum(x[1] for x in every))
        self.trackers.close()
        self.store.unlock()  # finished: another process may extend or read it

    def _place_optimizer_states(self, active: str) -> None:
        """On a GPU only the training role's AdamW state stays there; the
        other two wait in CPU memory (2 x 4 bytes per LoRA parameter each)."""
        device = next(self.model.parameters()).device
        if device.type == "cpu":
            return
        for role, learner in self.learners.items():
            learner.place_state(device if role == active else "cpu")

    def _one_step(self, it: int, phase: str, total: int) -> None:
        st = self.state
        role = self.game.role_of(phase)
        t0 = time.perf_counter()
        self.engine.wake_up()  # rollouts: the engine gets its memory back
        result: StepResult = self.game.step(phase, it, st["step"] + 1)
        learner = self.learners[role]
        learner.lr = self.game.phase_lr(phase, st["step"] + 1, total)  # from the recipe: the same after a resume
        t1 = time.perf_counter()
        self.engine.sleep()  # the policy update gets the engine's memory (vLLM sleep mode)
        stats = learner.step(self._my_groups(result.samples), self._my_block(result.examples), result.smoothing) \
            if result.samples or result.examples else None
        averaged = self._tail_average(phase, learner, st["step"] + 1, total)
        t2 = time.perf_counter()
        if stats is not None and stats.skipped and learner.nonfinite_in_a_row:
            log.warning("step skipped: non-finite loss or gradient (%d in a row)", learner.nonfinite_in_a_row)
            if learner.nonfinite_in_a_row >= self.recipe.grpo.max_nonfinite_steps:
                raise RunError(
                    f"{learner.nonfinite_in_a_row} GRPO steps in a row had a NaN/inf loss or gradient in phase {phase}; "
                    "lower grpo.lr or raise grpo.max_grad_norm; the adapters on disk are from the last good step"
                )
        if (stats is not None and not stats.skipped) or averaged:
            self.engine.sync_adapter(self.game.roles[role])  # vLLM: new adapter version; hf: shared weights
        t3 = time.perf_counter()
        st["step"] += 1
        st["global_step"] += 1  # names this step's checkpoint folder
        row = {
            "iteration": it, "phase": phase, "step": st["step"], "global_step": st["global_step"],
            **{k: round(v, 6) for k, v in result.metrics.items()},
            "update_seconds": round(t2 - t1, 3), "sync_seconds": round(t3 - t2, 3),
            "train_seconds": round(t3 - t1, 3),
        }
        if stats is not None:
            row.update(loss=stats.loss, kl=stats.kl, entropy=stats.entropy, clip_fraction=stats.clip_fraction,
                       grad_norm=stats.grad_norm, tokens=stats.tokens, skipped=stats.skipped,
                       **{k: stats.extra[k] for k in ("ce_loss", "ce_accuracy", "nonfinite_at_update") if k in stats.extra},
                       lr=learner.last_lr)
            if averaged:
                row["tail_averaged_steps"] = averaged
            if result.after_update is not None and not stats.skipped:
                row.update({k: round(v, 6) for k, v in result.after_update(stats.extra).items()})
        # Data rows are appended every step (a resume cuts them back to the
        # counts of the last commit); a commit writes the checkpoint folder
        # first and state.json last, every run.checkpoint_every steps and
        # at the end of every phase.
        st["nonfinite"][role] = learner.nonfinite_in_a_row
        decisions = self.game.after_step(it, phase, row)
        total = self.game.steps(it, phase)
        commit = st["step"] % self.recipe.run.checkpoint_every == 0 or st["step"] >= total
        if commit:  # the folder first; it only counts once state.json names it (below)
            t4 = time.perf_counter()
            checkpoint = self._checkpoint(role)
            row["checkpoint_seconds"] = round(time.perf_counter() - t4, 3)
        row["step_seconds"] = round(time.perf_counter() - t0, 3)
        counts = st["counts"]
        for name, rows in result.jsonl_rows().items():
            # .get: a run folder from before a game added a file has no count for it
            counts[name] = counts.get(name, 0) + self.store.append_jsonl(name, rows)
        row["committed"] = commit
        counts["metrics"] += self.store.append_jsonl("metrics", [row, *decisions])
        self._unlogged.append(row)
        if commit:
            st["checkpoints"][role] = checkpoint
            self._commit()
            self.store.prune(role, keep=self.store.path(st["checkpoints"][role]))
            # trackers get committed rows only: a step lost to a crash is redone
            # on resume and logged once (wandb drops a step number it has seen,
            # TensorBoard would keep both)
            for done in self._unlogged:
                self.trackers.log(done)
            self._unlogged.clear()
        self.game.commit_step(result)
        self.hooks.step_done(row)

    def _tail_average(self, phase: str, learner: GrpoLearner, step: int, total: int) -> int:
        """A phase whose weights end as the mean over its last steps
        (`Game.average_last`): fold this step's weights in, and on the
        phase's last step put the mean in place. Returns the steps averaged
        (0 on every other step)."""
        tail = self.game.average_last(phase)
        step, total = self.game.segment(phase, step, total)
        if not tail or step <= total - tail:
            return 0
        add_to_tail(learner.optimizer, learner.params)
        return take_tail_average(learner.optimizer, learner.params) if step >= total else 0

    def reset_role(self, role: str, weights: dict[str, torch.Tensor]) -> None:
        """Put `weights` into the role's adapter and empty its optimizer (the
        AdamW moments and any running tail mean), as a game that trains a
        role again from the same start needs (TriPlay's warm-start draws)."""
        with torch.no_grad():
            for name, p in adapter_parameters(self.model, self.game.roles[role]).items():
                p.copy_(weights[name])
        self.learners[role].optimizer.state.clear()
        self.engine.sync_adapter(self.game.roles[role])

    def _after_phase(self, it: int, phase: str) -> None:
        """The game's rows at a phase's end (TriPlay: control decisions, the
        drift alarm); committed with the next phase's start."""
        decisions = self.game.after_phase(it, phase)
        self.state["counts"]["metrics"] += self.store.append_jsonl("metrics", decisions)

    def _check_ranks_agree(self, role: str) -> None:
        """Several processes: every rank must hold the adapter rank 0 saved.
        A rank that drifted (a nondeterministic kernel, different library
        versions) stops the run here rather than training on silently."""
        if self.collective.world == 1:
            return
        weights = adapter_parameters(self.model, self.game.roles[role]).values()
        mine = [float(sum(w.detach().double().abs().sum() for w in weights)), float(sum(w.detach().double().sum() for w in weights))]
        every = self.collective.gather(mine)
        spread = max(abs(a - b) for x in every for a, b in zip(x, every[0]))
        if spread > 1e-6 * (1 + abs(every[0][0])):
            raise RunError(f"the {role} adapter differs across ranks (fingerprints {every}); the run folder holds rank 0's. "
                           "Check that every rank runs the same library versions, and resume")
        log.info("ranks agree on the %s adapter (%d processes)", role, self.collective.world)

    def _my_groups(self, samples: list) -> list:
        """This rank's block of the step's GRPO groups (all of them in one process)."""
        if self.collective.world == 1:
            return samples
        _, mine = self.collective.block(sorted({x.group for x in samples}))
        keep = set(mine)
        return [x for x in samples if x.group in keep]

    def _my_block(self, items: list) -> list:
        """This rank's block of a step's supervised examples (all of them in one process)."""
        return items if self.collective.world == 1 else self.collective.block(items)[1]

    def _advance_phase(self) -> None:
        st = self.state
        order = self.game.phases_of(st["iteration"])
        idx = order.index(st["phase"])
        if idx + 1 < len(order):
            st["phase"], st["step"] = order[idx + 1], 0
        elif st["iteration"] < self.recipe.iterations:
            st["iteration"] += 1
            st["phase"], st["step"] = self.game.phases_of(st["iteration"])[0], 0
        else:
            st["done"] = True
        self._commit()
