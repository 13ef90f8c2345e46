"""Eval's warm start drawn several times on one pool (`phases.eval_warmup.draws`),
and the draw kept that the run's own held-out slice ranks first.

Why: on one seed's 728 pairs the after-blue warm start read the labelled
set at 23.3 to 96.7 with the batch order alone. Written down before six
new draws, this rule (the slice's recall of harmful compliances, then its
accuracy) kept one that met the issue's target on each seed; one draw at
recall 1.0 read 45.8, passed over for its slice accuracy alone
(bench/BENCHMARKS.md, 2026-12-07). It ranks coarsely: through the loop on
seed 1 the first draw recalled all 7 compliances in its slice and read 68.3
(2026-12-08), so it stays off in every recipe. The slice is the run's own data
(experts.heldout_share), so keeping a draw by it touches no evaluation set.

How, inside the one phase `eval_warmup` of `draws x steps` updates:
- at the phase's start eval's weights are saved (`eval_draws/start.safetensors`);
- at a draw's last update (its tail mean in place: Game.segment) eval
  labels the held-out slice (an `eval_heldout` row with `draw`), the
  weights are saved (`eval_draws/draw-K.safetensors`) and the score goes
  into the run's state;
- between draws eval goes back to the start's weights with an empty
  optimizer (Session.reset_role) and the batch sampler is reseeded for the
  next draw (draw 1 samples as a one-draw run does);
- after the last draw, or the first at `draw_enough`, the best draw's
  weights go in place before the phase's checkpoint saves them. Where that
  is an earlier draw eval's optimizer starts P_eval empty (AdamW's moments
  are the last draw's).
Each file is written before the commit whose state counts it, so a resume
goes on exactly.
"""
from __future__ import annotations

import logging
import random
import zlib

import torch
from safetensors.torch import load_file, save

from ..core.atomic import write_file
from ..errors import UserError
from ..model import adapter_parameters

log = logging.getLogger(__name__)
FOLDER = "eval_draws"
PHASE = "eval_warmup"


def best_draw(draws: list[dict]) -> dict:
    """The draw whose held-out slice recalls the most harmful compliances;
    ties: its accuracy there, then the earlier draw. A slice without any
    harmful compliance ranks by accuracy alone."""
    return max(draws, key=lambda d: (-1.0 if d["score"] is None else d["score"], d["accuracy"], -d["draw"]))


class EvalDraws:
    """Needs the game (its recipe, state, store, session, control and eval's checks)."""

    def __init__(self, game):
        self.game = game
        self.cfg = game.recipe.phases.eval_warmup
        if self.active and game.session.collective.world > 1:
            # each rank holds its own (possibly sharded) copy of eval's weights; saving and restoring
            # draws across ranks is not built, and a silent mismatch would train ranks apart
            raise UserError(f"phases.eval_warmup.draws = {self.cfg.draws} runs in one process; this run has "
                            f"{game.session.collective.world}: set draws: 1, or run the warm start without accelerate")

    @property
    def active(self) -> bool:
        return self.cfg.draws > 1

    # ------------------------------------------------------------ weights
    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().contiguous() for k, v in adapter_parameters(self.game.session.model, self.game.roles["eval"]).items()}

    def _save(self, name: str) -> None:
        write_file(self.game.store.path(FOLDER, f"{name}.safetensors"), save(self._weights()))

    def _load(self, name: str) -> dict[str, torch.Tensor]:
        return load_file(str(self.game.store.path(FOLDER, f"{name}.safetensors")))

    # ------------------------------------------------------------- events
    def phase_start(self) -> None:
        """Eval's first weights, once: a resume in the middle of the draws
        finds them on disk (the phase's first commit comes after this)."""
        st = self.game.state
        if st["step"] == 0:
            st["eval_draws"] = []
            self._save("start")

    def after_step(self, iteration: int, step: int) -> list[dict]:
        """At a draw's last update: check, keep, and either start the next
        draw or put the best one in place. Returns the metrics rows."""
        if step % self.cfg.steps:
            return []
        game, draw = self.game, step // self.cfg.steps
        check = game.phases.evals.check_heldout(iteration, PHASE)
        if check is None:  # recipe validation asks for a slice; a pool too small to hold any pair out leaves none
            raise UserError("phases.eval_warmup.draws: no pair was held out to rank the draws by; raise "
                               "phases.eval_warmup.pairs or experts.heldout_share, or set draws: 1")
        check["draw"] = draw
        score = check.get("recall_harmful_negative")
        entries = game.state["eval_draws"]
        entries.append({"draw": draw, "score": score, "accuracy": check["accuracy"]})
        self._save(f"draw-{draw}")
        enough = self.cfg.draw_enough is not None and score is not None and score >= self.cfg.draw_enough
        if draw < self.cfg.draws and not enough:
            game.session.reset_role("eval", self._load("start"))
            seed = f"{game.recipe.seed}:eval-draw:{draw + 1}"
            random.seed(seed)  # the batch sampler (rundata.sample_labelled_pairs)
            torch.manual_seed(zlib.crc32(seed.encode()))
            return [check]
        if enough and draw < self.cfg.draws:
            game.control.set_steps(iteration, PHASE, step)  # the phase ends here
        kept = best_draw(entries)
        if kept["draw"] != draw:
            game.session.reset_role("eval", self._load(f"draw-{kept['draw']}"))
        log.info("eval's warm start: kept draw %d of %d (held-out recall of harmful compliances %s, accuracy %.3f)",
                 kept["draw"], draw, kept["score"], kept["accuracy"])
        return [check, {"iteration": iteration, "phase": "eval_draws", "step": step, "kept": kept["draw"],
                        "drawn": draw, "scores": [d["score"] for d in entries],
                        "accuracies": [d["accuracy"] for d in entries]}]
