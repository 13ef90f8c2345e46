"""Where metrics go besides `metrics.jsonl` (always written):
`run.report_to: [jsonl, tensorboard, wandb]`.

TensorBoard writes event files to `<run>/tensorboard/`; Weights & Biases
logs to the run named after the run folder (`WANDB_MODE=offline` keeps it
local; the API key comes from the environment, as wandb reads it). A
missing package is a one-line recipe error before the model loads. Every
numeric value of a step's row is logged as `<phase>/<key>` at the global
step, once the step is committed (core/session.py): a step lost to a crash
is redone on resume and reaches the trackers once.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ..recipe import RecipeError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_installed(report_to: list[str]) -> None:
    for name in report_to:
        pkg = PACKAGES.get(name)
        if pkg and importlib.util.find_spec(pkg) is None:
            raise RecipeError(f"run.report_to includes {name} but the package is not installed: `pip install {pkg}` "
                              f"(or remove {name} from run.report_to)")


class Trackers:
    def __init__(self, report_to: list[str], run_dir: Path, config: dict, name: str):
        check_installed(report_to)
        self.tb = self.wandb = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        if "wandb" in report_to:
            import wandb

            self.wandb = wandb.init(project="lora-triplay", name=name, id=name.replace("/", "-"), dir=str(run_dir),
                                    config=config, resume="allow", reinit="finish_previous")

    def log(self, row: dict) -> None:
        scalars = {f"{row['phase']}/{k}": float(v) for k, v in row.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("iteration", "step", "global_step")}
        step = int(row["global_step"])
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({**scalars, "iteration": row["iteration"]}, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
