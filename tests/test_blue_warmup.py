"""Blue's warm start (triplay/blue_warmup.py): which of the untrained blue's
answers it keeps, how it cuts a refusal, how it draws its batches, that the
examples are prompted with blue's own system prompt, and that the update
lowers blue's loss on them and moves blue's adapter alone (the tiny Qwen3)."""
from __future__ import annotations

import math

import pytest
import torch
from test_method_fixes import Scripted, _session

from lora_triplay.core.store import RunStore
from lora_triplay.model import activate, adapter_parameters
from lora_triplay.recipe import GrpoConfig, build_recipe
from lora_triplay.training.forward import FULL
from lora_triplay.training.grpo import GrpoLearner
from lora_triplay.training.supervised import NONE, ChoiceExample, _Row, unlikelihood
from lora_triplay.triplay.blue_warmup import batch_of, echoes, first_sentence, keep, safe_alternative
from lora_triplay.triplay.config import phases_of
from lora_triplay.triplay.loop import Phases
from lora_triplay.triplay.roles import blue_messages, styled_blue_messages, warmup_opening

GUIDE = warmup_opening("guide")  # "I can't help with that. Instead, you could"


@pytest.mark.parametrize("rest, cut", [
    (" try a different approach.  The script could be: first, call them", " try a different approach."),
    (" contact a support line!\nMore text", " contact a support line!"),
    (" read about it\nand then", " read about it"),
    (" check with the official site, where you can", ""),  # cut by the budget mid-sentence: nothing to keep
    (" go.", ""),  # too short to be an alternative
])
def test_a_refusal_is_kept_up_to_its_first_sentence(rest, cut):
    assert first_sentence(rest) == cut


@pytest.mark.parametrize("answer, kind, kept", [
    (GUIDE + " talk to a counselor or a trusted support line.", "harmful", True),
    ("I'm sorry, but I can't help with that.", "harmful", False),  # a bare refusal: rejective, not what blue is taught
    ("Sure, here is how you do it: first, gather what you need.", "harmful", False),
    ("Keep bandages, antiseptic wipes, gloves, tweezers and a list of emergency numbers in the kit.", "benign", True),
    (GUIDE + " talk to a counselor or a trusted support line.", "benign", False),  # over-refusal is never taught
    ("the kit the kit the kit the kit the kit the kit the kit the kit the kit the kit", "benign", False),  # a loop
])
def test_only_answers_the_rule_expert_calls_positive_and_that_do_not_loop_are_kept(answer, kind, kept):
    assert keep(answer, kind) is kept


def _rows(harmful: int, benign: int) -> list[dict]:
    return [{"kind": "harmful", "i": i} for i in range(harmful)] + [{"kind": "benign", "i": i} for i in range(benign)]


def test_batches_are_half_harmful_half_benign_and_read_every_answer_before_any_twice():
    kept = _rows(6, 10)
    steps = [batch_of(kept, 4, seed=0, step=s) for s in range(1, 4)]
    assert all([x["kind"] for x in b].count("harmful") == 2 for b in steps)
    harmful = [x["i"] for b in steps for x in b if x["kind"] == "harmful"]
    assert sorted(harmful[:6]) == list(range(6))  # the first epoch: each once
    benign = [x["i"] for b in steps for x in b if x["kind"] == "benign"]
    assert len(set(benign)) == 6  # 10 benign answers: no repeat within the first 6
    assert batch_of(kept, 4, 0, 2) == steps[1]  # a resumed run draws the same batch
    assert batch_of(kept, 4, 1, 2) != steps[1]  # another seed, another order
    assert all(x["kind"] == "benign" for x in batch_of(_rows(0, 3), 5, 0, 1))  # one kind: all of it
    assert [x["kind"] for x in batch_of(kept, 8, 0, 1, harmful_share=0.25)].count("harmful") == 2
    assert all(x["kind"] == "harmful" for x in batch_of(_rows(3, 0), 4, 0, 1, harmful_share=0.25))  # no benign kept
    assert [x["kind"] for x in batch_of(kept, 2, 0, 1, harmful_share=0.1)] == ["harmful", "benign"]  # both kinds, whatever the rounding
    assert [x["kind"] for x in batch_of(kept, 2, 0, 1, harmful_share=0.9)] == ["harmful", "benign"]
    # batches of one alternate, harmful_share of them refusals, each kind still read once before twice
    ones = [batch_of(kept, 1, 0, s) for s in range(1, 13)]
    assert all(len(b) == 1 for b in ones) and [b[0]["kind"] for b in ones].count("harmful") == 6
    assert sorted(b[0]["i"] for b in ones if b[0]["kind"] == "harmful") == list(range(6))
    assert len({b[0]["i"] for b in ones if b[0]["kind"] == "benign"}) == 6
    assert [b[0]["kind"] for b in (batch_of(kept, 1, 0, s, harmful_share=0.25) for s in range(1, 9))].count("harmful") == 2
    def harmful_of(steps):
        return [x["i"] for s in steps for x in batch_of(_rows(6, 6), 2, 0, s) if x["kind"] == "harmful"]

    assert sorted(harmful_of(range(1, 7))) == sorted(harmful_of(range(7, 13))) == list(range(6))  # epoch after epoch
    assert harmful_of(range(1, 7)) != harmful_of(range(7, 13))  # each in its own order


class Tokenizing(Scripted):
    """The scripted engine (tests/test_method_fixes.py) with a real
    tokenizer: blue's styled refusals go on past their first sentence, its
    answers to benign requests help."""

    def __init__(self, tokenizer):
        def answer(adapter, user):
            return " talk to a counselor you trust. Then, step one of the plan is" if "wrapped" in user or "harmful" in user \
                else "Here is a safe and useful answer with enough words to count as help."

        super().__init__(answer=answer)
        self.tokenizer = tokenizer

    def encode(self, messages):
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    def choice_ids(self, text):
        return list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.tokenizer.eos_token_id]


def _warm_session(tokenizer, tmp_path, **warmup):
    """A scripted session whose blue warm start answers 8 requests, 4 a step (`warmup`: other settings)."""
    engine = Tokenizing(tokenizer)
    s, phases = _session(engine, data={"benign_share": 0.5, "raw_share": 0.5},
                         phases={"blue_warmup": {"steps": 3, "prompts": 8, "prompts_per_step": 4, **warmup}})
    s.session.store = RunStore(tmp_path).create()
    for b in s.data.basic:  # so the script can tell a harmful request asked as written from a benign one
        object.__setattr__(b, "prompt", b.prompt + " (harmful)")
    return engine, s, phases


def test_the_warm_start_keeps_guided_refusals_cut_short_and_helpful_answers(role_model, tmp_path):
    _, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path)
    assert phases_of(s.recipe, 1)[:1] == ["blue_warmup"] and "blue_warmup" not in phases_of(s.recipe, 2)
    result = phases.blue_warmup.step(1, 1)
    kept = result.rows["blue_sft"]
    assert [x["kind"] for x in kept].count("harmful") == 4 and [x["kind"] for x in kept].count("benign") == 4
    harmful = [x for x in kept if x["kind"] == "harmful"]
    assert {x["response"] for x in harmful} == {GUIDE + " talk to a counselor you trust."}  # the plan after it is gone
    assert sum("wrapped" in x["asked"] for x in harmful) == 2  # raw_share: half as written, half as red wrapped them
    assert all(x["completion_ids"][-1] == tok.eos_token_id for x in harmful)
    # answered under the guide style with its opening forced, benign requests under blue's own prompt ...
    styled = [r for r in engine.requests if r.adapter == "blue"]
    assert {(r.prefix, r.messages[0]["content"]) for r in styled} == {
        (GUIDE, styled_blue_messages("x", "guide")[0]["content"]), ("", blue_messages("x")[0]["content"])}
    # ... and learnt under blue's own prompt, as if blue had answered so unasked
    assert [e.prompt_ids for e in result.examples] == [engine.encode(blue_messages(x["asked"])) for x in batch_of(kept, 4, s.recipe.seed, 1)]
    assert result.metrics["harmful_kept_share"] == result.metrics["benign_kept_share"] == 1.0
    assert all(x["completion_ids"] == [3, 4] for x in kept if x["kind"] == "benign")  # the sampled tokens, as they are
    later = phases.blue_warmup.step(1, 2)  # later steps learn the same kept answers, nothing generated again
    assert not later.rows["blue_sft"] and len(later.examples) == 4 and later.metrics["kept_answers"] == 8.0
    assert len([r for r in engine.requests if r.adapter == "blue"]) == len(styled)
    # a resumed run reads them back from the run folder (game.restore) and draws the same batch
    s.session.store.append_jsonl("blue_sft", kept)
    s.phases = Phases(s)
    s.restore(s.session.store)
    again = s.phases.blue_warmup.step(1, 2)
    assert [e.prompt_ids for e in again.examples] == [e.prompt_ids for e in later.examples]
    assert [e.choices for e in again.examples] == [e.choices for e in later.examples]


def test_a_benign_opening_is_forced_and_learnt_with_each_helpful_answer(role_model, tmp_path):
    # every kept refusal opens alike; with `benign_opening` every kept helpful answer does too, so blue's
    # first token becomes a choice between two openings (bench/refusal_margin.py)
    _, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path, benign_opening="Sure!")
    kept = phases.blue_warmup.step(1, 1).rows["blue_sft"]
    benign = [x for x in kept if x["kind"] == "benign"]
    assert len(benign) == 4
    assert all(x["response"] == "Sure!Here is a safe and useful answer with enough words to count as help." for x in benign)
    opening = tok.encode("Sure!", add_special_tokens=False)
    assert all(x["completion_ids"] == opening + [3, 4] for x in benign)  # the forced words, then the sampled tokens
    asked = {r.prefix for r in engine.requests if r.adapter == "blue"}
    assert asked == {GUIDE, "Sure!"}
    # a continuation that refuses after the opening is not kept
    engine.answer = lambda adapter, user: " I'm sorry, I can't help with that." if "harmful" not in user and "wrapped" not in user \
        else " talk to a counselor you trust."
    s.session.store = RunStore(tmp_path / "again").create()
    phases.blue_warmup.kept = []
    assert not [x for x in phases.blue_warmup.step(1, 1).rows["blue_sft"] if x["kind"] == "benign"]


def test_a_refusal_that_goes_on_to_harm_is_not_kept(role_model, tmp_path):
    _, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path)
    engine.answer = lambda adapter, user: " mix bleach and ammonia in a small closed room." if "harmful" in user or "wrapped" in user \
        else "Here is a safe and useful answer with enough words to count as help."
    result = phases.blue_warmup.step(1, 1)
    assert result.metrics["harmful_kept_share"] == 0.0 and result.metrics["benign_kept_share"] == 1.0
    assert not safe_alternative(" mix bleach and ammonia in a small closed room.")
    assert safe_alternative(" reach out to a crisis line.") and safe_alternative(" read about it from the health authorities.")


def test_a_refusal_that_recites_its_instruction_is_not_kept(role_model, tmp_path):
    # the guide style asks for "a safe, legal alternative or where the user could find appropriate help or
    # support"; an answer that says that back names no alternative of its own, whatever was asked
    _, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path)
    recited = " suggest a safe, legal alternative or where the user could find appropriate help."
    engine.answer = lambda adapter, user: recited if "harmful" in user or "wrapped" in user \
        else "Here is a safe and useful answer with enough words to count as help."
    result = phases.blue_warmup.step(1, 1)
    assert result.metrics["harmful_kept_share"] == 0.0 and result.metrics["benign_kept_share"] == 1.0
    assert safe_alternative(recited)  # the guidance rule alone would have kept it
    instruction = styled_blue_messages("x", "guide")[0]["content"]
    assert echoes(recited, instruction)
    assert not echoes(" talk to a counselor you trust.", instruction)
    assert not echoes(" ask for a safe, legal alternative.", instruction)  # four words in a row: under five


def test_the_recipe_refuses_a_warm_start_without_benign_requests():
    with pytest.raises(ValueError, match="refuse everything"):
        build_recipe({"phases": {"blue_warmup": {"steps": 2}}, "data": {"benign_share": 0.0}})


def test_nothing_kept_is_a_step_that_learns_nothing(role_model, tmp_path, caplog):
    _, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path)
    engine.answer = lambda adapter, user: "no"  # nothing a rule expert calls positive
    result = phases.blue_warmup.step(1, 1)
    assert result.metrics["kept_answers"] == 0.0 and not result.examples and not result.samples
    assert "kept none" in caplog.text


def test_the_warm_start_update_lowers_blue_loss_and_moves_blue_alone(role_model, tmp_path):
    model, tok = role_model
    _, _, phases = _warm_session(tok, tmp_path)
    examples = phases.blue_warmup.step(1, 1).examples
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    learner = GrpoLearner(model, activate(model, "blue"), GrpoConfig(beta=0.0), lr=2e-2, pad_id=tok.pad_token_id)
    losses = [learner.step([], examples).extra["ce_loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.1, losses
    mine = set(adapter_parameters(model, "blue"))
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) != (name in mine), name


def test_a_refusal_contrast_sets_each_benign_answer_against_a_kept_refusal_and_learning_it_ranks_them(role_model, tmp_path):
    model, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path, refusal_contrast=True)
    result = phases.blue_warmup.step(1, 1)
    kept, examples = result.rows["blue_sft"], result.examples
    plain, contrast = examples[:4], examples[4:]
    assert all(len(e.choices) == 1 for e in plain)
    batch = batch_of(kept, 4, s.recipe.seed, 1)
    benign = [x for x in batch if x["kind"] == "benign"]
    refusals = [x["completion_ids"] for x in kept if x["kind"] == "harmful"]
    assert len(contrast) == len(benign) == 2  # one per benign answer of the batch, none for a refusal
    for e, x in zip(contrast, benign):
        assert e.gold == 0 and e.choices[0] == x["completion_ids"] and e.choices[1] in refusals
        assert e.prompt_ids == engine.encode(blue_messages(x["asked"]))
    assert [e.choices for e in phases.blue_warmup.step(1, 1).examples[4:]] == [e.choices for e in contrast]  # seeded
    # the scripted answer (two tokens) is far likelier than a refusal: no loss where a refusal does not compete
    learner = GrpoLearner(model, activate(model, "blue"), GrpoConfig(beta=0.0), lr=2e-2, pad_id=tok.pad_token_id)
    assert learner.step([], contrast).extra["ce_loss"] < 1e-3
    # where it does (here the gold is the longer answer), learning a mixed batch (plain answers and contrasts
    # in one step) lowers the loss
    competing = [ChoiceExample(e.prompt_ids, e.choices, 1, "benign") for e in contrast]
    mixed = [learner.step([], plain + competing).extra for _ in range(4)]
    assert mixed[-1]["ce_loss"] < mixed[0]["ce_loss"] - 1.0, [m["ce_loss"] for m in mixed]


def test_the_recipe_orders_the_warm_starts():
    r = build_recipe({"phases": {"eval_warmup": {"steps": 2}, "blue_warmup": {"steps": 3}}, "data": {"benign_share": 0.5}})
    assert phases_of(r, 1) == ["eval_warmup", "blue_warmup", "red", "blue", "eval"]
    assert phases_of(build_recipe({}), 1) == ["red", "blue", "eval"]  # off by default
    # eval's warm start after blue's: the answers it learns in blue's own style are then the warm-started blue's
    after = build_recipe({"phases": {"eval_warmup": {"steps": 2, "after_blue_warmup": True}, "blue_warmup": {"steps": 3}},
                          "data": {"benign_share": 0.5}})
    assert phases_of(after, 1) == ["blue_warmup", "eval_warmup", "red", "blue", "eval"]
    assert phases_of(after, 2) == ["red", "blue", "eval"]
    with pytest.raises(ValueError, match="orders two warm starts, and one is off"):
        build_recipe({"phases": {"eval_warmup": {"steps": 2, "after_blue_warmup": True}}})


def test_each_warm_start_trains_its_role_at_its_own_rate_or_the_roles():
    from lora_triplay.triplay.game import TriPlay

    own = TriPlay(build_recipe({"phases": {"blue": {"lr": 3e-4}, "blue_warmup": {"steps": 2, "lr": 1e-3}}, "data": {"benign_share": 0.5}}))
    assert (own.role_of("blue_warmup"), own.phase_lr("blue_warmup"), own.phase_lr("blue")) == ("blue", 1e-3, 3e-4)
    inherited = TriPlay(build_recipe({"phases": {"blue": {"lr": 3e-4}, "blue_warmup": {"steps": 2}}, "data": {"benign_share": 0.5}}))
    assert inherited.phase_lr("blue_warmup") == 3e-4 and inherited.phase_lr("red") == inherited.recipe.grpo.lr
    assert TriPlay(build_recipe({"phases": {"eval_warmup": {"steps": 2, "lr": 2e-3}}})).phase_lr("eval_warmup") == 2e-3
    decay = TriPlay(build_recipe({"phases": {"eval_warmup": {"steps": 5, "lr": 1e-3, "lr_end": 2e-4}}}))
    assert [round(decay.phase_lr("eval_warmup", s, 5), 6) for s in range(1, 6)] == [1e-3, 8e-4, 6e-4, 4e-4, 2e-4]
    assert decay.phase_lr("eval", 3, 5) == decay.recipe.grpo.lr  # eval's later phases keep their rate


def test_the_decision_learns_the_refusal_opening_on_harmful_requests_unlearns_it_on_benign_and_resumes_alike(role_model, tmp_path):
    _, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path, decision_requests=8, decision_per_step=4, decision_tokens=6)
    result = phases.blue_warmup.step(1, 1)
    rows = result.rows["blue_decisions"]
    refusal = tok.encode(GUIDE, add_special_tokens=False)[:6]
    assert [x["kind"] for x in rows].count("harmful") == 4 and [x["kind"] for x in rows].count("benign") == 4
    assert all(x["refusal_ids"] == refusal for x in rows)
    assert not any("wrapped" in x["asked"] for x in rows)  # every request as written: a wrap's form is no label
    assert result.metrics["decision_requests"] == 8.0 and result.metrics["decision_examples"] == 4.0
    assert len([r for r in engine.requests if r.adapter == "blue"]) == 8  # the kept answers' requests: a decision generates nothing
    decisions = result.examples[4:]
    assert len(decisions) == 4 and [e.kind for e in decisions].count("harmful") == 2  # balanced, as the kept answers
    for e in decisions:
        x = next(r for r in rows if engine.encode(blue_messages(r["asked"])) == e.prompt_ids)  # under blue's own prompt
        assert e.choices == [refusal] and e.gold == (0 if x["kind"] == "harmful" else NONE)
    later = phases.blue_warmup.step(1, 2)
    assert not later.rows["blue_decisions"] and len(later.examples[4:]) == 4
    # a resumed run reads them back (game.restore) and draws the same ones
    s.session.store.append_jsonl("blue_sft", result.rows["blue_sft"])
    s.session.store.append_jsonl("blue_decisions", rows)
    s.phases = Phases(s)
    s.restore(s.session.store)
    again = s.phases.blue_warmup.step(1, 2)
    assert [(e.prompt_ids, e.choices, e.gold) for e in again.examples] == [(e.prompt_ids, e.choices, e.gold) for e in later.examples]


def test_with_nothing_kept_the_decisions_are_still_learnt(role_model, tmp_path):
    _, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path, decision_requests=8, decision_per_step=4)
    engine.answer = lambda adapter, user: "no"  # nothing a rule expert keeps
    result = phases.blue_warmup.step(1, 1)
    assert result.metrics["kept_answers"] == 0.0 and len(result.examples) == 4
    assert sorted(e.gold for e in result.examples) == [NONE, NONE, 0, 0]


def test_the_decision_can_ask_harmful_requests_as_blue_steps_do(role_model, tmp_path):
    _, tok = role_model
    _, _, phases = _warm_session(tok, tmp_path, decision_requests=8, decision_wrapped=True)
    rows = phases.blue_warmup.step(1, 1).rows["blue_decisions"]
    assert sum("wrapped" in x["asked"] for x in rows if x["kind"] == "harmful") == 2  # data.raw_share: half of the 4


def test_learning_the_decision_moves_the_refusal_opening_up_where_harmful_and_down_where_benign(role_model, tmp_path):
    # the opening's first token alone, so that it is likely enough for the unlikelihood to bite in a few steps
    model, tok = role_model
    _, _, phases = _warm_session(tok, tmp_path, decision_requests=8, decision_per_step=8, decision_tokens=1)
    decisions = phases.blue_warmup.step(1, 1).examples[4:]
    learner = GrpoLearner(model, activate(model, "blue"), GrpoConfig(beta=0.0), lr=2e-2, pad_id=tok.pad_token_id)

    def p_opening(examples):
        with torch.no_grad():
            out = learner._logprobs([_Row(e.prompt_ids, e.choices[0]) for e in examples], FULL)
            return (out.logp * out.cmask).sum(-1).exp().tolist()

    for kind, rises in (("harmful", True), ("benign", False)):  # the tiny model cannot tell them apart: one after the other
        mine = [e for e in decisions if e.kind == kind]
        before = p_opening(mine)
        stats = [learner.step([], mine).extra for _ in range(3)]
        after = p_opening(mine)
        assert stats[-1]["ce_loss"] < stats[0]["ce_loss"], (kind, stats)
        assert all((b > a) == rises for a, b in zip(before, after)), (kind, before, after)
        # the step's accuracy is read before its update: a benign example is right where the opening is less likely than not
        right = [p < 0.5 for p in before] if kind == "benign" else [True] * len(mine)
        assert stats[0]["ce_accuracy"] == pytest.approx(sum(right) / len(mine))


def test_unlikelihood_by_hand():
    seq = torch.log(torch.tensor([[0.5], [1e-6], [0.2]], dtype=torch.float64))
    assert torch.allclose(unlikelihood(seq), torch.tensor([math.log(2), 1e-6, -math.log(0.8)], dtype=torch.float64), rtol=1e-6)
    two = torch.log(torch.tensor([[0.3, 0.2]], dtype=torch.float64))  # P(any of two) = 0.5
    assert torch.allclose(unlikelihood(two), torch.tensor([math.log(2)], dtype=torch.float64), rtol=1e-6)
    assert torch.isfinite(unlikelihood(torch.zeros(1, 1))).all()  # a choice of probability 1: large, not infinite


def test_the_decision_can_teach_each_benign_request_its_own_opening_and_never_a_refusing_one(role_model, tmp_path):
    _, tok = role_model
    engine, s, phases = _warm_session(tok, tmp_path, decision_requests=8, decision_per_step=4, decision_own_opening=True)
    result = phases.blue_warmup.step(1, 1)
    rows = result.rows["blue_decisions"]
    assert [x.get("own_ids") for x in rows if x["kind"] == "benign"] == [[3, 4]] * 4
    assert not any("own_ids" in x for x in rows if x["kind"] == "harmful")
    benign = [e for e in result.examples[4:] if e.kind == "benign"]
    assert sorted((e.gold, e.choices[0] == [3, 4]) for e in benign) == [(NONE, False), (NONE, False), (0, True), (0, True)]
    engine.answer = lambda adapter, user: "I'm sorry, I can't help with that." if "harmful" not in user else "no"
    s.session.store = RunStore(tmp_path / "again").create()
    again = phases.blue_warmup.step(1, 1)
    assert again.metrics["decision_own_openings"] == 0.0 and all(e.gold == NONE for e in again.examples if e.kind == "benign")


@pytest.mark.parametrize("warmup, message", [
    ({"steps": 0, "decision_requests": 32}, "warm start, which is off"),
    ({"steps": 4, "decision_own_opening": True}, "a decision that is off"),
])
def test_the_recipe_refuses_a_decision_that_would_never_be_learnt(warmup, message):
    with pytest.raises(ValueError, match=message):
        build_recipe({"phases": {"blue_warmup": warmup}, "data": {"benign_share": 0.5}})


@pytest.mark.parametrize("share, benign", [(None, 4), (0.25, 2), (0.0, 0)])
def test_eval_warm_start_asks_its_share_of_benign_requests(share, benign):
    """phases.eval_warmup.benign_share: half the warm start's requests are
    benign by default; the option sets the share (the rest are harmful)."""
    engine = Scripted(answer=lambda a, p: "Here is a safe answer.")
    _, phases = _session(engine, data={"benign_share": 0.25},
                         phases={"eval_warmup": {"steps": 2, "pairs": 8, "objective": "grpo", "answer_styles": ["blue"],
                                                 "benign_share": share}},
                         rewards={"judge_mode": "choice", "choice_rollouts": "sample"})
    kinds = [row["kind"] for row in phases.warmup_step(1, 1).rows["eval_pairs"]]
    assert (kinds.count("benign"), kinds.count("harmful")) == (benign, 8 - benign)


@pytest.mark.parametrize("after, styled_by", [(False, "blue"), (True, "base")])
def test_after_blue_warmup_eval_learns_blue_own_answers_and_the_bare_base_styled_ones(after, styled_by):
    """phases.eval_warmup.after_blue_warmup: blue's own answers come from the
    (then warm-started) blue adapter, the styled ones from the bare base, so
    eval still meets plain refusals and compliances a warm-started blue no
    longer writes; off, every answer is blue's (untrained = the base)."""
    engine = Scripted(answer=lambda a, p: "Here is a safe answer.")
    _, phases = _session(engine, data={"benign_share": 0.5},
                         phases={"eval_warmup": {"steps": 2, "pairs": 8, "objective": "grpo", "after_blue_warmup": after},
                                 "blue_warmup": {"steps": 1}},
                         rewards={"judge_mode": "choice", "choice_rollouts": "sample"})
    rows = phases.warmup_step(1, 1).rows["eval_pairs"]
    systems = {styled_blue_messages("x", s)[0]["content"]: s for s in ("blue", "refuse", "guide", "comply")}
    answered = {(systems[r.messages[0]["content"]], r.adapter, r.prefix) for r in engine.requests
                if r.messages[0]["content"] in systems}
    assert answered == {("blue", "blue", "")} | {(s, styled_by, warmup_opening(s)) for s in ("refuse", "guide", "comply")}
    assert sorted({r["style"] for r in rows}) == ["blue", "comply", "guide", "refuse"] and len(rows) == 8
