"""The HF engine's sampler (engine/decode.py): inverse-CDF draws from the
distribution multinomial draws from, never a token of probability 0, and a
seeded row's tokens independent of the rows beside it."""
from __future__ import annotations

import torch

from lora_triplay.engine.base import Request, Sampling
from lora_triplay.engine.decode import BLOCK, sample_inverse_cdf
from lora_triplay.engine.hf import HFEngine
from lora_triplay.recipe import LoraConfig

MSGS = [{"role": "user", "content": "tell me a story"}]


def test_inverse_cdf_draws_each_token_at_its_probability():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]])
    n = 200_000
    u = torch.rand(n, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for row in range(2):
        picks = sample_inverse_cdf(probs[row].expand(n, 4), u[:, row])
        freq = torch.bincount(picks, minlength=4).double() / n
        p = probs[row].double()
        se = (p * (1 - p) / n).sqrt()
        assert ((freq - p).abs() <= 5 * se).all(), (row, freq)
        assert freq[p == 0].sum() == 0  # probability 0: never drawn


def test_inverse_cdf_ends_never_reach_a_zero_probability_token():
    # zeros at both ends; unnormalised rows (the total scales the target)
    probs = torch.tensor([[0.0, 2.0, 2.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    lowest = torch.zeros(2, dtype=torch.float64)
    highest = torch.full((2,), torch.nextafter(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)).item(),
                         dtype=torch.float64)
    assert sample_inverse_cdf(probs, lowest).tolist() == [1, 2]
    assert sample_inverse_cdf(probs, highest).tolist() == [2, 2]
    # u x total rounding up to the total itself still lands on the last positive token
    ones = torch.ones(2, dtype=torch.float64)
    assert sample_inverse_cdf(probs, ones).tolist() == [2, 2]


def test_the_engine_samples_its_first_token_from_the_models_distribution(role_model):
    """Thousands of one-token samples of one prompt under blue's adapter,
    against softmax(logits / T) from a plain forward of that prompt: every
    likely token within 5 standard errors of its probability."""
    model, tok = role_model
    engine = HFEngine(model, tok, max_batch_size=4096, lora=LoraConfig(rank=4, alpha=8))
    ids = engine.encode(MSGS)
    model.base_model.set_adapter("blue")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
    temperature = 0.05  # the random tiny model is flat: at 0.05 its top tokens hold 0.20, 0.14, 0.09, ...
    probs = torch.softmax(logits / temperature, -1)
    assert 0.05 < probs.max() < 0.95, "pick a temperature that leaves several likely tokens"
    n = 3000
    comps = engine.generate([Request("blue", MSGS, n=n)], Sampling(max_new_tokens=1, temperature=temperature, seed=3))[0]
    first = torch.tensor([c.token_ids[0] for c in comps])
    freq = torch.bincount(first, minlength=probs.numel()).double() / n
    likely = probs > 0.02
    assert likely.sum() >= 2
    se = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs()[likely] <= 5 * se[likely]).all(), (freq[likely], probs[likely])
    assert freq[probs < 1e-9].sum() == 0


def test_the_two_level_search_picks_what_one_cumulative_sum_picks():
    """Rows with zeros and a vocabulary that is no multiple of the block
    (the last block short), many uniforms: the same token as the first
    index of one float64 cumulative sum over the whole row that exceeds
    u x total."""
    gen = torch.Generator().manual_seed(0)
    vocab = 3 * BLOCK + 37
    probs = torch.softmax(torch.randn(6, vocab, generator=gen) * 4, -1)
    probs[0, : 2 * BLOCK] = 0  # whole blocks of zeros
    probs[1, BLOCK - 5: BLOCK + 5] = 0  # zeros across a block boundary
    probs[2, 3 * BLOCK:] = 0  # the short last block all zeros
    probs[3] = 0
    probs[3, -1] = 0.7  # only the last token (short block) and one other
    probs[3, BLOCK] = 0.3
    for _ in range(50):
        u = torch.rand(6, generator=gen, dtype=torch.float64)
        cdf = probs.double().cumsum(-1)
        expected = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
        got = sample_inverse_cdf(probs, u)
        assert torch.equal(got, expected), (u, got, expected)
        assert (probs.gather(1, got.unsqueeze(-1)) > 0).all()
