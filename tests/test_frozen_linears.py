"""The base's Linears through oneDNN in training (training/frozen_linears.py):
the same loss and LoRA gradients as autograd's F.linear, on the tiny model."""
from __future__ import annotations

import pytest
import torch

from lora_triplay.engine import fastgemm
from lora_triplay.training import frozen_linears
from lora_triplay.training.forward import FULL, SHARED, Rows, completion_logprobs
from lora_triplay.training.logprobs import LogprobComputer

pytestmark = pytest.mark.skipif(not fastgemm.onednn_ok(), reason="this torch has no usable oneDNN linear")


def _rows():
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (23, 17, 30)]
    return [Rows(p, torch.randint(5, 200, (m,), generator=g).tolist()) for p in prompts for m in (4, 9)]


def _loss_and_grads(model, tok, layout, patched: bool, monkeypatch):
    from lora_triplay.model import activate

    params = activate(model, "blue")
    model.train()
    monkeypatch.setattr(frozen_linears, "ENABLED", patched)
    for p in params:
        p.grad = None
    with frozen_linears.onednn_training(model):
        out = completion_logprobs(model, _rows(), tok.pad_token_id, layout, LogprobComputer(kernel="chunked"), with_entropy=True)
        loss = -(out.logp * out.cmask).sum() / out.cmask.sum() + 0.1 * (out.entropy * out.cmask).sum()
        loss.backward()
    return loss.item(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("layout", [SHARED, FULL])
def test_the_same_loss_and_gradients_as_autograds_linear(role_model, layout, monkeypatch):
    model, tok = role_model
    calls, real = [], frozen_linears._FrozenLinear.apply

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(frozen_linears._FrozenLinear, "apply", counting)
    plain_loss, plain = _loss_and_grads(model, tok, layout, False, monkeypatch)
    assert not calls
    ours_loss, ours = _loss_and_grads(model, tok, layout, True, monkeypatch)
    assert calls  # the patched path ran
    assert ours_loss == pytest.approx(plain_loss, rel=1e-5)
    for a, b in zip(ours, plain):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (a - b).abs().max()
    assert any(g.abs().sum() > 0 for g in ours)


def test_the_modules_are_given_back_and_no_grad_takes_the_plain_oneDNN_path(role_model):
    model, _ = role_model
    linears = fastgemm.plain_linears(model)
    with frozen_linears.onednn_training(model):
        assert all("forward" in m.__dict__ for m in linears)
        x = torch.randn(2, 3, linears[0].in_features)
        with torch.no_grad():
            y = linears[0](x)
        assert not y.requires_grad and torch.allclose(y, torch.nn.functional.linear(x, linears[0].weight, linears[0].bias), atol=1e-5)
    assert not any("forward" in m.__dict__ for m in linears)


def test_a_trainable_weight_keeps_autograds_linear():
    lin = torch.nn.Linear(8, 4)  # weight requires grad: its gradient is needed, so F.linear
    x = torch.randn(3, 8, requires_grad=True)
    frozen_linears.frozen_linear(lin, x).sum().backward()
    assert lin.weight.grad is not None and x.grad is not None
