"""Tail averaging (training/averaging.py, `phases.eval_warmup.average_last`):
the weights a phase ends on are the mean of its last steps' weights, the
running mean survives a checkpoint and resume, and nothing else moves."""
from __future__ import annotations

import torch

from lora_triplay.core.store import RunStore
from lora_triplay.recipe import build_recipe
from lora_triplay.training.averaging import COUNT, MEAN, add_to_tail, take_tail_average


def _steps(optimizer, param, n: int, seed: int = 0) -> list[torch.Tensor]:
    """n AdamW steps on a random quadratic; the weights after each."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        target = torch.randn(param.shape, generator=gen)
        optimizer.zero_grad()
        ((param - target) ** 2).sum().backward()
        optimizer.step()
        out.append(param.detach().clone())
    return out


def test_the_weights_end_on_the_mean_of_the_steps_folded_in():
    p = torch.nn.Parameter(torch.zeros(3, 4))
    opt = torch.optim.AdamW([p], lr=0.1)
    before = _steps(opt, p, 2)
    tail = []
    for i in range(3):
        tail += _steps(opt, p, 1, seed=1 + i)
        add_to_tail(opt, [p])
    assert not torch.allclose(p.detach(), torch.stack(tail).mean(0))  # the last weights are not the mean
    assert take_tail_average(opt, [p]) == 3
    assert torch.allclose(p.detach(), torch.stack(tail).mean(0), atol=1e-6)
    assert not torch.allclose(p.detach(), torch.stack(before + tail).mean(0))  # the earlier steps stay out
    assert MEAN not in opt.state[p] and COUNT not in opt.state[p]  # forgotten: a later phase starts clean
    _steps(opt, p, 1)  # and AdamW goes on with its own state
    assert take_tail_average(opt, [p]) == 0


def test_a_parameter_never_updated_is_left_alone():
    used, unused = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([used, unused], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (used - 1).pow(2).sum().backward()
        opt.step()
        add_to_tail(opt, [used, unused])
    assert len(opt.state[unused]) == 0  # AdamW builds its state on an empty entry
    take_tail_average(opt, [used, unused])
    assert torch.equal(unused.detach(), torch.ones(2))


def test_the_running_mean_survives_a_checkpoint(tmp_path):
    """Saved with the optimizer (safetensors + JSON), loaded into a fresh one,
    the tail goes on to the same mean as without the interruption."""
    def run(interrupt: bool) -> torch.Tensor:
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.zeros(5))
        opt = torch.optim.AdamW([p], lr=0.05)
        for i in range(2):
            _steps(opt, p, 1, seed=i)
            add_to_tail(opt, [p])
        if interrupt:
            folder = tmp_path / "ckpt"
            folder.mkdir()
            RunStore.save_optimizer(folder, opt)
            weights = p.detach().clone()
            p = torch.nn.Parameter(weights)
            opt = torch.optim.AdamW([p], lr=0.05)
            assert RunStore.load_optimizer(folder, opt)
            assert opt.state[p][COUNT] == 2
        for i in range(2):
            _steps(opt, p, 1, seed=10 + i)
            add_to_tail(opt, [p])
        assert take_tail_average(opt, [p]) == 4
        return p.detach().clone()

    assert torch.equal(run(False), run(True))


def test_a_warm_start_ends_on_the_mean_of_its_last_steps(tiny_model_dir, tmp_path):
    """The same warm start twice, with average_last 0 and 3: the averaged
    run's eval adapter is the mean of the plain run's weights after steps
    2, 3 and 4 (the trajectory is the same until the end), and the metrics
    row says so; red's and blue's adapters do not move."""
    from lora_triplay.core.session import Session
    from lora_triplay.model import adapter_parameters

    def warm_start(average: int, folder: str) -> tuple[list[dict], dict, list[dict]]:
        recipe = build_recipe({
            "model": {"base": tiny_model_dir, "device": "cpu", "dtype": "float32"}, "lora": {"rank": 4, "alpha": 8},
            "iterations": 1,
            "phases": {"red": {"steps": 0}, "blue": {"steps": 0}, "eval": {"steps": 0},
                       "eval_warmup": {"steps": 4, "pairs": 8, "lr": 1e-2, "average_last": average}},
            "grpo": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4},
            "rewards": {"judge_mode": "choice", "embedding_model": "hashing"},
            "experts": {"safety_experts": 0, "utility_experts": 0, "min_votes": 1, "balance_classes": True},
        })
        session = Session.open(recipe, tmp_path / folder)
        roles = session.game.roles
        weights, rows = [], []
        session.hooks.step_done = lambda row: (rows.append(row), weights.append(
            {k: v.detach().clone() for k, v in adapter_parameters(session.model, roles["eval"]).items()}))
        others = {r: {k: v.detach().clone() for k, v in adapter_parameters(session.model, roles[r]).items()} for r in ("red", "blue")}
        session.run()
        for r, before in others.items():
            assert all(torch.equal(v, before[k]) for k, v in adapter_parameters(session.model, roles[r]).items())
        return weights, rows

    plain, plain_rows = warm_start(0, "plain")
    averaged, rows = warm_start(3, "averaged")
    assert len(plain) == len(averaged) == 4
    for k in plain[0]:
        assert torch.equal(averaged[1][k], plain[1][k])  # the same path
        expected = torch.stack([w[k] for w in plain[1:]]).mean(0)
        assert torch.allclose(averaged[-1][k], expected, atol=1e-6), k
    assert any(not torch.allclose(averaged[-1][k], plain[-1][k]) for k in plain[0])
    assert rows[-1]["tail_averaged_steps"] == 3 and all("tail_averaged_steps" not in r for r in rows[:-1] + plain_rows)
