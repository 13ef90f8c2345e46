"""The HF engine on the tiny model: mixed-adapter batches, log-probs,
forced choice, snapshots."""
from __future__ import annotations

import pytest
import torch

from lora_triplay.core.store import atomic_write
from lora_triplay.engine.base import Request, Sampling
from lora_triplay.engine.hf import HFEngine
from lora_triplay.model import save_adapter
from lora_triplay.recipe import LoraConfig
from lora_triplay.training.grpo import Sample
from tests.reference import batch_tensors as _batch_tensors
from tests.reference import token_logprobs

GREEDY = Sampling(max_new_tokens=8, temperature=0.0)
MSGS = [
    [{"role": "user", "content": "tell me a story"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a longer question about safety here"}],
]


@pytest.fixture()
def engine(role_model):
    model, tok = role_model
    return HFEngine(model, tok, max_batch_size=16, lora=LoraConfig(rank=4, alpha=8))


def _tokens(engine, adapter, messages):
    return [c[0].token_ids for c in engine.generate([Request(adapter, m) for m in messages], GREEDY)]


def test_mixed_batch_equals_separate_calls(engine):
    names = ["base", "red", "blue", "evaluator"]
    separate = {n: _tokens(engine, n, MSGS) for n in names}
    # The adapters really differ (random B), so equality below means routing works.
    assert len({str(v) for v in separate.values()}) == len(names)
    mixed = engine.generate([Request(n, m) for m in MSGS for n in names], GREEDY)
    for k, comp in enumerate(mixed):
        m_i, n = divmod(k, len(names))
        assert comp[0].token_ids == separate[names[n]][m_i], f"{names[n]} differs in a mixed batch"


def test_base_rows_are_the_model_with_adapters_off(engine, role_model):
    model, tok = role_model
    ids = engine.encode(MSGS[0])
    with model.disable_adapter():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                             eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id)
    ref = out[0, len(ids):].tolist()
    got = _tokens(engine, "base", MSGS[:1])[0]
    assert got == ref[: len(got)]


def test_generation_logprobs_match_the_training_forward(engine, role_model):
    model, tok = role_model
    comps = engine.generate([Request("red", m, n=2) for m in MSGS], Sampling(max_new_tokens=10, temperature=1.0))
    flat = [c for cs in comps for c in cs]
    model.base_model.set_adapter("red")
    samples = [Sample(c.prompt_ids, c.token_ids, 0, 0.0) for c in flat]
    ids, mask, pos, cmask, C = _batch_tensors(samples, tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, mask, pos, C)
    worst = 0.0
    for row, c in enumerate(flat):
        diff = (logp[row, : len(c.token_ids)] - torch.tensor(c.logprobs)).abs().max().item()
        worst = max(worst, diff)
    assert worst < 1e-4, f"generation and training log-probs differ by {worst}"


def test_forced_choice(engine):
    choices = ("Label: negative", "Label: rejective", "Label: positive")
    reqs = [Request("evaluator", m, n=1, choices=choices) for m in MSGS]
    scores = engine.score_choices(reqs)
    out = engine.generate(reqs, GREEDY)
    for per_choice, comps in zip(scores, out):
        totals = [sum(x) for x in per_choice]
        comp = comps[0]
        assert comp.text == choices[totals.index(max(totals))]
        assert sum(comp.choice_probs) == pytest.approx(1.0)
        assert comp.token_ids[-1] in engine.eos_ids
    sampled = engine.generate([Request("evaluator", MSGS[0], n=50, choices=choices)], Sampling(temperature=5.0))
    assert {c.text for c in sampled[0]} <= set(choices) and len({c.text for c in sampled[0]}) > 1


def test_snapshot_adapter_serves_the_saved_weights(engine, role_model, tmp_path):
    model, _ = role_model
    save_adapter(model, "blue", tmp_path / "blue-1", "tiny", atomic_write)
    engine.load_adapter("blue@1", str(tmp_path / "blue-1"))
    assert "blue@1" in engine.adapters()
    assert _tokens(engine, "blue@1", MSGS) == _tokens(engine, "blue", MSGS)


def test_unknown_adapter_is_a_clear_error(engine):
    with pytest.raises(KeyError, match="blue@9"):
        engine.generate([Request("blue@9", MSGS[0])], GREEDY)


def test_shared_prefill_matches_independent_rows(engine):
    # n=3 greedy samples share one prefilled cache: all must equal n=1.
    one = _tokens(engine, "blue", MSGS)
    many = engine.generate([Request("blue", m, n=3) for m in MSGS], GREEDY)
    for ref, comps in zip(one, many):
        assert all(c.token_ids == ref for c in comps)


def test_choice_scores_equal_a_full_forward(engine, role_model):
    # The cached-prefix scoring must equal scoring prompt+choice in one pass.
    model, tok = role_model
    choices = ("Verdict: yes", "Verdict: no")
    req = Request("red", MSGS[1], choices=choices)
    got = engine.score_choices([req])[0]
    model.base_model.set_adapter("red")
    samples = [Sample(engine.encode(MSGS[1]), engine.choice_ids(c), 0, 0.0) for c in choices]
    ids, mask, pos, cmask, C = _batch_tensors(samples, tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        ref, _ = token_logprobs(model, ids, mask, pos, C)
    for row, lp in enumerate(got):
        assert lp == pytest.approx(ref[row, : len(lp)].tolist(), abs=1e-4)


def test_choice_tree_equals_one_row_per_choice_and_a_full_forward(engine, role_model, monkeypatch):
    """Choices sharing a prefix, of different lengths, one a prefix of
    another, over mixed adapters and prompts of different lengths: the tree
    (one row per prompt) scores each choice as the row-per-choice path and
    as prompt + choice in one plain forward."""
    model, tok = role_model
    choices = ("Label: negative", "Label: neg", "Label: negative answer", "Verdict", "")
    reqs = [Request(a, m, choices=choices) for a in ("red", "evaluator") for m in MSGS]
    with engine._serving_requests(reqs):
        assert engine._tree_attention()  # the path under test
    tree = engine.score_choices(reqs)
    monkeypatch.setattr(HFEngine, "_tree_attention", lambda self: False)
    rows = engine.score_choices(reqs)
    for t, r in zip(tree, rows):
        for a, b in zip(t, r):
            assert len(a) == len(b) and a == pytest.approx(b, abs=1e-4)
    model.base_model.set_adapter("red")
    samples = [Sample(engine.encode(MSGS[1]), engine.choice_ids(c), 0, 0.0) for c in choices]
    ids, mask, pos, cmask, C = _batch_tensors(samples, tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        ref, _ = token_logprobs(model, ids, mask, pos, C)
    for row, lp in enumerate(tree[1]):
        assert lp == pytest.approx(ref[row, : len(lp)].tolist(), abs=1e-4)


LONG_SYSTEM = "You are a careful assistant who answers with safety in mind and explains your reasons. " * 3
SHARED = [
    [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "first question"}],
    [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "a second, much longer question about it"}],
]


def test_shared_prefix_batches_equal_single_rows(engine):
    prompts = [engine.encode(m) for m in SHARED]
    with engine._serve(["red"]):  # the path under test: one group, its prefix computed once
        assert min(engine._prefix_groups(prompts, ["red", "red"], several=True)) >= engine.MIN_SHARED_PREFIX
    batch = engine.generate([Request("red", m, n=2) for m in SHARED], GREEDY)
    for m, comps in zip(SHARED, batch):
        alone = engine.generate([Request("red", m)], GREEDY)[0][0]
        for c in comps:
            assert c.token_ids == alone.token_ids
            assert c.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    choices = ("Label: negative", "Label: positive")
    together = engine.score_choices([Request("evaluator", m, choices=choices) for m in SHARED])
    for m, scores in zip(SHARED, together):
        alone = engine.score_choices([Request("evaluator", m, choices=choices)])[0]
        for a, b in zip(scores, alone):
            assert a == pytest.approx(b, abs=1e-4)


OTHER_SYSTEM = "You judge whether an answer is safe; reply with one label and nothing else, ever. " * 3


def test_prefix_groups_share_one_batch_and_equal_single_rows(engine):
    """Two system prompts (two prefix groups), a row sharing nothing, mixed
    adapters: one batch, each group's prefix computed once per adapter, and
    every row equal to the row run alone."""
    reqs = [Request(a, [{"role": "system", "content": system}, {"role": "user", "content": q}])
            for system in (LONG_SYSTEM, OTHER_SYSTEM) for a, q in (("red", "first question"), ("blue", "another one"),
                                                                    ("red", "a third question, longer than the others"))]
    reqs.append(Request("evaluator", [{"role": "user", "content": "no system prompt at all"}]))
    prompts = [engine.encode(r.messages) for r in reqs]
    assert len(engine._batches(prompts)) == 1
    names = [engine._peft_name(r.adapter) for r in reqs]
    order = engine._batches(prompts)[0]
    with engine._serve(list(dict.fromkeys(names))):
        shared = engine._prefix_groups([prompts[i] for i in order], [names[i] for i in order], several=True)
    assert len({tuple(prompts[i][:n]) for i, n in zip(order, shared) if n}) == 2 and 0 in shared
    together = engine.generate(reqs, GREEDY)
    for r, comps in zip(reqs, together):
        alone = engine.generate([r], GREEDY)[0][0]
        assert comps[0].token_ids == alone.token_ids
        assert comps[0].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    choices = ("Label: negative", "Label: positive")
    scored = engine.score_choices([Request(r.adapter, r.messages, choices=choices) for r in reqs])
    for r, scores in zip(reqs, scored):
        for a, b in zip(scores, engine.score_choices([Request(r.adapter, r.messages, choices=choices)])[0]):
            assert a == pytest.approx(b, abs=1e-4)


def test_distinct_prompts_fill_batches(engine):
    """Prompts that share nothing still fill max_batch_size rows per batch
    (one batch per prompt ran a GPU at 0.6% of its roofline)."""
    prompts = [[7, i, 3] for i in range(2 * engine.max_batch_size + 1)]
    sizes = [len(b) for b in engine._batches(prompts)]
    assert sizes == [engine.max_batch_size, engine.max_batch_size, 1]
    assert sorted(i for b in engine._batches(prompts) for i in b) == list(range(len(prompts)))


def _hf_generate(model, engine, adapter, messages, max_new, **kw):
    """transformers' own generate, one row (no padding): the reference for
    our decode loop's tokens and raw log-probs."""
    ids = torch.tensor([engine.encode(messages)])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), adapter_names=[engine._peft_name(adapter)],
                         max_new_tokens=max_new, eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id,
                         output_logits=True, return_dict_in_generate=True, **kw)
    new = out.sequences[0, ids.shape[1]:]
    logp = torch.log_softmax(torch.stack(out.logits, 1)[0].float(), -1).gather(-1, new[:, None]).squeeze(-1)
    return new.tolist(), logp.tolist()


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_decode_loop_equals_transformers_generate(engine, role_model, penalty):
    """Greedy tokens and raw log-probs equal transformers' generate (1e-4),
    rows of every adapter in one batch, repetition penalty included."""
    model, _ = role_model
    reqs = [Request(a, m, n=2) for a in ("base", "red", "blue", "evaluator") for m in MSGS]
    got = engine.generate(reqs, Sampling(max_new_tokens=12, temperature=0.0, repetition_penalty=penalty))
    for req, comps in zip(reqs, got):
        ref_tokens, ref_logp = _hf_generate(model, engine, req.adapter, req.messages, 12, do_sample=False,
                                            repetition_penalty=penalty, temperature=None, top_p=None, top_k=None)
        for c in comps:
            assert c.token_ids == ref_tokens[: len(c.token_ids)]
            assert len(c.token_ids) == len(ref_tokens) or c.finished
            assert max(abs(a - b) for a, b in zip(c.logprobs, ref_logp)) < 1e-4


def test_decode_loop_stops_rows_at_eos_and_keeps_the_rest(engine, role_model):
    """Rows that end early leave the batch; the others go on exactly as
    they would alone. An EOS bias on lm_head is raised until some greedy
    rows end early and some do not."""
    model, _ = role_model
    eos = engine.eos_ids[0]
    head = model.get_output_embeddings()
    reqs = [Request(a, m) for a in ("base", "red", "blue", "evaluator") for m in MSGS]
    greedy = Sampling(max_new_tokens=12, temperature=0.0)
    head.bias = torch.nn.Parameter(torch.zeros(head.out_features), requires_grad=False)
    try:
        for value in torch.linspace(0.0, 8.0, 33).tolist():
            with torch.no_grad():
                head.bias[eos] = value
            together = [c[0] for c in engine.generate(reqs, greedy)]
            lengths = [len(c.token_ids) for c in together]
            if min(lengths) < 12 and max(lengths) == 12:
                break
        else:
            pytest.fail("no EOS bias made some rows end early and others not")
        assert any(c.finished for c in together) and not all(c.finished for c in together)
        for req, got in zip(reqs, together):
            alone = engine.generate([req], greedy)[0][0]
            assert got.token_ids == alone.token_ids and got.finished == alone.finished
            assert got.finished == (got.token_ids[-1] == eos)
            assert all(abs(x - y) < 1e-4 for x, y in zip(got.logprobs, alone.logprobs))
    finally:
        head.bias = None


def test_seeded_sampling_repeats_and_top_p_restricts(engine):
    s = Sampling(max_new_tokens=10, temperature=1.0, top_p=0.5, seed=7)
    reqs = [Request("red", MSGS[0], n=3), Request("blue", MSGS[1], n=2)]
    a = [c.token_ids for cs in engine.generate(reqs, s) for c in cs]
    b = [c.token_ids for cs in engine.generate(reqs, s) for c in cs]
    assert a == b
    # top_p tiny: only the single most likely token survives, i.e. greedy
    narrow = engine.generate(reqs[:1], Sampling(max_new_tokens=10, temperature=1.0, top_p=1e-6, seed=1))[0]
    greedy = engine.generate(reqs[:1], Sampling(max_new_tokens=10, temperature=0.0))[0][0]
    assert all(c.token_ids == greedy.token_ids for c in narrow)


def test_a_seeded_row_samples_the_same_however_it_is_batched(engine):
    """Rows are seeded by (call seed + request index, sample): the second
    request of a call seeded s samples what the first request of a call
    seeded s + 1 samples, with or without other rows around it (what the
    ranks of a multi-process run rely on), and an unseeded call draws its
    seed from torch's global RNG (saved with the run)."""
    hot = Sampling(max_new_tokens=8, temperature=1.0, seed=11)
    both = engine.generate([Request("red", MSGS[0], n=2), Request("blue", MSGS[1], n=3)], hot)
    alone = engine.generate([Request("blue", MSGS[1], n=3)], Sampling(max_new_tokens=8, temperature=1.0, seed=12))
    assert [c.token_ids for c in both[1]] == [c.token_ids for c in alone[0]]
    assert len({tuple(c.token_ids) for c in both[1]}) > 1  # samples of one request differ
    choice = ("Label: negative", "Label: rejective", "Label: positive")
    picks = engine.generate([Request("evaluator", MSGS[0], n=6, choices=choice), Request("evaluator", MSGS[1], n=6, choices=choice)], hot)
    single = engine.generate([Request("evaluator", MSGS[1], n=6, choices=choice)], Sampling(max_new_tokens=8, temperature=1.0, seed=12))
    assert [c.text for c in picks[1]] == [c.text for c in single[0]]
    torch.manual_seed(5)
    a = engine.generate([Request("red", MSGS[0], n=2)], Sampling(max_new_tokens=8, temperature=1.0))
    torch.manual_seed(5)
    b = engine.generate([Request("red", MSGS[0], n=2)], Sampling(max_new_tokens=8, temperature=1.0))
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]


def test_a_forced_prefix_starts_the_answer(engine):
    """Request.prefix: the prompt ends with the prefix's tokens and the
    completion continues it: the same tokens as transformers' generate from
    those prompt ids."""
    msgs = [{"role": "user", "content": "reply in JSON"}]
    start = '{"unsafe": '
    got = engine.generate([Request("blue", msgs, prefix=start)], GREEDY)[0][0]
    pre = list(engine.tokenizer.encode(start, add_special_tokens=False))
    assert pre and got.prompt_ids == engine.encode(msgs) + pre
    assert engine.generate([Request("blue", msgs)], GREEDY)[0][0].prompt_ids == engine.encode(msgs)
    ids = torch.tensor([got.prompt_ids])
    out = engine.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), adapter_names=[engine._peft_name("blue")],
                                max_new_tokens=len(got.token_ids), eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id, do_sample=False)
    assert out[0, ids.shape[1]:].tolist() == got.token_ids
