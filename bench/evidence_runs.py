"""The evidence runs: the recipe overrides of every configuration that
`bench/evidence.py` trains, and what each is about (the roles its
evaluation covers). The main runs are the recipe as committed; an
ablation removes one part of the method; a variant changes one setting,
with a comment on why it was tried and what it found."""
from __future__ import annotations

MAIN = {"main-s0": ["seed=0"], "main-s1": ["seed=1"]}
ABLATIONS = {  # each at main-s0's seed and budget
    "fixed-judge": ["seed=0", "rewards.blue_judge=rules"],  # the baseline self-play must beat
    "no-div": ["seed=0", "rewards.w_bleu=0", "rewards.w_cos=0"],
    # no benign stream, and so no blue warm start (it learns refusals beside benign answers; alone it teaches refusing all)
    "no-benign": ["seed=0", "data.benign_share=0", "phases.blue_warmup.steps=0"],
}
# iteration 1 with no GRPO phase: the run ends after its warm starts
CUT_AFTER_WARM_STARTS = ["iterations=1", "phases.red.steps=0", "phases.blue.steps=0", "phases.eval.steps=0"]
# ... and without eval's warm start: blue after its own warm start alone
WARM_ONLY = ["seed=0", "phases.eval_warmup.steps=0", *CUT_AFTER_WARM_STARTS]
# eval's warm start after blue's, drawn up to three times, stopping at a slice recall of 15 in 16 (eval_draws.py)
AFTER_BLUE_DRAWS = ["phases.eval_warmup.after_blue_warmup=true", "phases.eval_warmup.draws=3",
                    "phases.eval_warmup.draw_enough=0.9375"]
# the training split of the public benchmarks beside the package's requests ({work}: the --work folder)
INDIST = ["data.benign_prompts={work}/train/benign.jsonl", "data.basic_prompts={work}/train/harmful.jsonl"]
# The main run with one training setting changed, kept beside it in the report
VARIANTS = {
    # a stock reply counted by its four opening words only, not by meaning as well (the recipe's
    # generic_by): at four words, seed 0's blue of 2026-12-02 reworded its stock reply
    "generic-4": ["seed=0", "rewards.generic_by=opening"],
    # blue after its warm start alone (phases.blue_warmup), no self-play: what the loop adds to it
    "warm-only": WARM_ONLY,
    # the same, lighter: half the steps, a quarter of each batch refusals (the trade-off against over-refusal)
    "warm-only-light": WARM_ONLY + ["phases.blue_warmup.steps=8", "phases.blue_warmup.harmful_share=0.25"],
    # wider: every builtin benign request (112) and as many harmful ones in the warm start, a quarter of each
    # batch refusals (does more benign coverage keep blue from refusing by topic?)
    "warm-only-wide": WARM_ONLY + ["phases.blue_warmup.prompts=224", "phases.blue_warmup.harmful_share=0.25"],
    # longer: 64 steps where the recipe has 16 (~8 passes over the kept answers, not ~2). A linear probe on the
    # base's hidden states (bench/harm_probe.py) separates JBB harmful from benign far better than blue does:
    # is the warm start too short to learn the boundary it teaches?
    "warm-only-long": WARM_ONLY + ["phases.blue_warmup.steps=64"],
    # both: every builtin request, 64 steps (~2.5 passes over ~200 kept answers), half of each batch refusals
    "warm-only-wide-long": WARM_ONLY + ["phases.blue_warmup.prompts=224", "phases.blue_warmup.steps=64"],
    # every kept benign answer opens with "Sure!", as every kept refusal opens with "I can't help": the first
    # token becomes a choice between two openings (bench/refusal_margin.py: greedy refused 55% of JBB benign
    # where samples refused 37%, with 33% of the first token's mass on the refusal's "I")
    "warm-only-sure": WARM_ONLY + ["phases.blue_warmup.benign_opening=Sure!"],
    # blue's LoRA on the upper half of the base's 30 layers only (lora.layers): a linear probe on the frozen base
    # (bench/harm_probe.py) tells JBB harmful from benign at AUC 0.84-0.88 from layers 18-30, 0.69-0.77 from 6-12,
    # where the warm-started blue's refusal does at 0.73 (bench/refusal_margin.py): does blue refuse by topic
    # because its adapter reads the shallow layers? Measured 2026-12-04 (BENCHMARKS.md): no, AUC 0.71 / 0.71 against 0.73
    "warm-only-upper": WARM_ONLY + ["lora.layers=15-29"],
    "warm-only-deep": WARM_ONLY + ["lora.layers=20-29"],
    # as wide and long as warm-only-wide-long, on the upper half: the probe learnt from every seed request (182).
    # Measured 2026-12-04: AUC 0.75 (every layer, same data: 0.78; the recipe's 64 requests: 0.73)
    "warm-only-wide-long-upper": WARM_ONLY + ["phases.blue_warmup.prompts=224", "phases.blue_warmup.steps=64", "lora.layers=15-29"],
    # a smaller or noisier adapter (2026-12-06): does one with less room to memorise the ~56 kept answers' topics
    # learn a refusal that follows intent better (the probe's linear readout of the frozen base generalises at
    # AUC 0.84-0.88 where blue's rank-16 decision does at 0.73)? lora.rank and lora.dropout reach all three
    # adapters; only blue trains here. Both seeds of each: a difference of 0.05 is one standard error at 40 vs 40
    "warm-only-rank2": WARM_ONLY + ["lora.rank=2", "lora.alpha=4"],
    "warm-only-rank2-s1": WARM_ONLY + ["seed=1", "lora.rank=2", "lora.alpha=4"],
    "warm-only-dropout": WARM_ONLY + ["lora.dropout=0.3"],
    "warm-only-dropout-s1": WARM_ONLY + ["seed=1", "lora.dropout=0.3"],
    # blue also learns whether to open with the refusal (triplay/blue_decision.py) on 224 builtin requests (146 distinct; the
    # refusal's first 8 tokens learnt where harmful, unlearnt where benign): the one lever that moved the AUC was more requests,
    # and the opening is where greedy decoding refuses or answers. Measured 2026-12-04 (BENCHMARKS "Blue's decision"):
    # AUC 0.73 -> 0.80 (seed 0), 0.75 -> 0.77 (seed 1), 0.73 -> 0.79 (seed 2); over-refusal after the warm start
    # 48 -> 40%, 53 -> 32%, 43 -> 40%
    "warm-only-decision": WARM_ONLY + ["phases.blue_warmup.decision_requests=224"],
    # the harmful requests of the decision asked as blue's steps ask them (half wrapped by red). Measured 2026-12-04
    # with the decision's first form (32e4bbe: the refusal's opening against blue's own, a pair): JBB harmful refused
    # 15% greedily, benign 10%, AUC 0.71; every request as written, 2.5% / 0%, AUC 0.74 (blue_decision.py)
    "warm-only-decision-wrapped": WARM_ONLY + ["phases.blue_warmup.decision_requests=224", "phases.blue_warmup.decision_wrapped=true"],
    # and each benign request's own opening learnt beside (greedy decoding refuses where "I" is likeliest, not likely).
    # Measured 2026-12-04: every refusal rate lower, AUC 0.74: how often, not when
    "warm-only-decision-own": WARM_ONLY + ["phases.blue_warmup.decision_requests=224", "phases.blue_warmup.decision_own_opening=true"],
    # the same pair on seed 1 (every warm-only run above is seed 0: a second draw of the training side)
    "warm-only-s1": WARM_ONLY + ["seed=1"],
    "warm-only-decision-s1": WARM_ONLY + ["seed=1", "phases.blue_warmup.decision_requests=224"],
    "warm-only-s2": WARM_ONLY + ["seed=2"],
    "warm-only-decision-s2": WARM_ONLY + ["seed=2", "phases.blue_warmup.decision_requests=224"],
    "warm-only-decision-long": WARM_ONLY + ["phases.blue_warmup.decision_requests=224", "phases.blue_warmup.steps=64"],
    # the loop with it. Measured 2026-12-05 (seed 0, bench/results/evidence-decision/): over-refusal 1.7 -> 20.0 (the
    # ninth run 31.7) by refusing less of everything (StrongREJECT ASR 93.3, XSTest unsafe 100), eval 50.8 at the end
    "main-decision-s0": ["seed=0", "phases.blue_warmup.decision_requests=224"],
    "main-decision-s1": ["seed=1", "phases.blue_warmup.decision_requests=224"],
    # eval's drift: main-decision-s0 (2026-12-05) ended with eval at 50.8 on the labelled set (94.2 after its warm start),
    # calling 52 of its 57 `positive` answers `rejective` after its last phase. Replayed from eval@2
    # (bench/eval_phase_replay.py, fresh optimizer; bench/results/eval-replay/): any 3 steps at 2e-4 did it, whatever the batches (as run
    # 0.59, drawn uniformly from every iteration 0.63, few new pairs drawn less often 0.59); at 5e-5, 0.73. Replayed
    # from the run's own optimizer (a rerun, 2026-12-05): as run 0.50, at 5e-5 0.74 / 0.73 (0.74 / 0.77 with the rules
    # fixed that day), without iteration 3's three odd `rejective` labels 0.70 / 0.73
    # Measured 2026-12-05 (bench/results/evidence-eval-slow/): eval 94.2 after its warm start and at the end (lowest
    # recall 81.2); blue as at 2e-4 (JBB ASR 55.0, over-refusal 18.3); 36% of red's rewrites looped its instruction at it 3 (OD 0.456)
    "main-decision-eval-slow-s0": ["seed=0", "phases.blue_warmup.decision_requests=224", "phases.eval.lr=5e-5"],
    # the recipe (no decision) with eval at a quarter of its rate: main-decision-eval-slow-s0 kept eval at 94.2 on the
    # labelled set to the end (2e-4: 52.5) with blue as at 2e-4; the ninth run (the recipe, 2e-4) ended eval at 90.0 / 73.3
    # Measured 2026-12-05 (bench/results/evidence-eval-slow-recipe/): eval 94.2 -> 93.3 (2e-4: 90.0), red@3 vs the final
    # blue 1 -> 20 (+2 at 2e-4), blue as at 2e-4 (JBB ASR 32.5, over-refusal 35.0), degenerate 15% (5%); seed 1: eval
    # 91.7 -> 89.2 (73.3), JBB ASR 32.5 (15.0), over-refusal 33.3 (46.7), red@3 1 -> 24, counting only rewrites that keep
    # their request 0 -> 21 (seed 0: 0 -> 3, its +19 came from rewrites that dropped the request; judging/kept.py).
    # The recipe runs eval at 5e-5 since (both seeds agreed): these two are main-s0 / main-s1 of that recipe.
    "main-eval-slow-s0": ["seed=0", "phases.eval.lr=5e-5"],
    "main-eval-slow-s1": ["seed=1", "phases.eval.lr=5e-5"],
    # a semantic term for red by meaning (judging/kept.py; the recipe has none, eval's yes/no being at chance at
    # 135M): main-eval-slow-s0's red beat the final blue 1 -> 20 with 19% of its last rewrites still asking for the
    # request (0 -> 3 counted on those). Run 2026-12-05: red kept 99 / 94%, by stating the request plainly; blue JBB
    # ASR 17.5 / 12.5 at over-refusal 36.7 / 43.3; red vs the final blue 1 -> 5 / 0 -> 9: not adopted (BENCHMARKS)
    "main-semantic-meaning-s0": ["seed=0", "rewards.semantic=meaning"],
    "main-semantic-meaning-s1": ["seed=1", "rewards.semantic=meaning"],
    # the check by meaning as a gate, no bonus (rewards/red.py): a rewrite that drops its request earns a refused
    # attack's reward, one that restates it plainly earns only what the defenders give it. Run 2026-12-05 (seed 0,
    # BENCHMARKS "Red's semantic check as a gate"): red kept 73 / 94% (seeds 0 / 1), mostly as near copies; blue JBB
    # ASR 5.0 / 12.5 at over-refusal 45.0 / 41.7; red vs the final blue 0 -> 2 / 0 -> 5: not adopted
    "main-semantic-gate-s0": ["seed=0", "rewards.semantic=meaning", "rewards.semantic_gate=true", "rewards.semantic_value=0"],
    "main-semantic-gate-s1": ["seed=1", "rewards.semantic=meaning", "rewards.semantic_gate=true", "rewards.semantic_value=0"],
    # blue's benign topic twins in their harmful seeds' GRPO groups (phases.blue.twin_groups): in the recipe's runs blue
    # refused 24-50% of the twins it met in training against 1-12% of the other benign requests, and a twin group whose
    # answers all refuse is flat (no gradient); pooled with its seed's group a refused twin scores below a refused seed.
    # Run 2026-12-05 (seed 0, BENCHMARKS "Benign twins in their seeds' groups"): over-refusal 5.0, JBB ASR 95.0 (57.5
    # after iteration 1): eval pays blue's harmful answers ~-0.85 against ~+0.9 for its benign ones, so the pooled mean
    # sat above every harmful answer and blue stopped refusing; not adopted, seed 1 not run
    "main-twin-s0": ["seed=0", "phases.blue.twin_groups=true"],
    "main-twin-s1": ["seed=1", "phases.blue.twin_groups=true"],
    # and paid by the rules judge, a plain refusal of a harmful request worth what a benign answer is (+1): does
    # the two-wording contrast teach blue when to refuse where its judge pays both right answers alike?
    # Run 2026-12-06 (BENCHMARKS "Twin groups under a judge that pays both right answers alike"): JBB ASR 17.5 at
    # over-refusal 41.7 (the fixed judge 17.5 at 45.0): JBB benign 30.0 (42.5), XSTest safe 65 (50); same curve
    "fixed-twin-s0": ["seed=0", "rewards.blue_judge=rules", "phases.blue.twin_groups=true",
                      "rewards.blue_class_values={negative: -1.0, rejective: 1.0, positive: 1.0}"],
    # the decision on the refusal's first token alone: with 8 tokens, main-decision-s0's blue wrote the opening's words
    # inside answers ("Dealing with a wife ... On one hand, you can't help with that. Instead, ...")
    # Measured 2026-12-05 (BENCHMARKS, decision1-s0.json): AUC 0.69 (0.80 with 8 tokens), greedy refusals as without a
    # decision (82.5 / 55 / 35%): blue lowered "I" and refused with other openings; main-decision1-s0 not run
    "warm-only-decision1": WARM_ONLY + ["phases.blue_warmup.decision_requests=224", "phases.blue_warmup.decision_tokens=1"],
    "main-decision1-s0": ["seed=0", "phases.blue_warmup.decision_requests=224", "phases.blue_warmup.decision_tokens=1"],
    # each benign answer also learnt against a kept refusal (cross-entropy over the pair's sequence log-probs)
    "warm-only-contrast": WARM_ONLY + ["phases.blue_warmup.refusal_contrast=true"],
    # the main run with it
    "main-contrast-s0": ["seed=0", "phases.blue_warmup.refusal_contrast=true"],
    "main-contrast-s1": ["seed=1", "phases.blue_warmup.refusal_contrast=true"],
    # trained on benchmark requests as well as ours (WORK/train, train_split.py: JBB pairs and XSTest focus
    # words that no held-out request shares): is blue's over-refusal of JBB's benign requests our data or the model?
    "warm-only-indist": WARM_ONLY + INDIST,
    # and as wide and long as warm-only-wide-long (224 requests, 64 steps)
    "warm-only-indist-wide-long": WARM_ONLY + INDIST + ["phases.blue_warmup.prompts=224", "phases.blue_warmup.steps=64"],
    "main-indist-s0": ["seed=0", *INDIST],
    # and paid by the rules judge, which knows each request's kind: does blue learn when to refuse where its judge is right?
    "fixed-judge-indist": ["seed=0", "rewards.blue_judge=rules", *INDIST],
    # eval told each request's kind, harmful or benign (rewards.eval_sees_kind): the panel's labels depend on it, and
    # 82-89% of eval's warm-start errors were a compliance put in the wrong one of negative / positive
    "main-kind-s0": ["seed=0", "rewards.eval_sees_kind=true"],
    # one answer of each harmful request's group blue's own continuation of "I can't help with that. Instead, you
    # could" (phases.blue.refusal_anchor): in main-kind-s0's third iteration blue's groups for plainly asked harmful
    # requests held 0 refusals of 16, so eval's `negative` for every one of them moved nothing
    "main-anchor-s0": ["seed=0", "phases.blue.refusal_anchor=guide"],
    "main-anchor-s1": ["seed=1", "phases.blue.refusal_anchor=guide"],
    # and the benign groups anchored with the same refusal, which the judge should not pay (refusal_anchor_benign):
    # the ninth run (main-anchor-*) raised over-refusal on JBB benign + XSTest safe by 30-45 points. Tenth run
    # (2026-12-04, s0, bench/results/evidence-anchor2/): blue stopped refusing (JBB ASR 100, over-refusal 0)
    "main-anchor2-s0": ["seed=0", "phases.blue.refusal_anchor=guide", "phases.blue.refusal_anchor_benign=true"],
    "main-anchor2-s1": ["seed=1", "phases.blue.refusal_anchor=guide", "phases.blue.refusal_anchor_benign=true"],
    # the main recipe cut after iteration 1's warm starts (eval's, then blue's, as the main run trains them; no GRPO
    # step): blue@1 is the recipe's blue before the loop. What does the loop itself do to blue? A draw also depends on
    # the host: on 2026-12-07 seed 0 matched the ablations trained that day to the last digit, not main-s0 of 12-06
    "warm-starts-s0": ["seed=0", *CUT_AFTER_WARM_STARTS],
    "warm-starts-s1": ["seed=1", *CUT_AFTER_WARM_STARTS],
    # the fixed-judge ablation on the main run's other seed: the loop's two seeds against two of the baseline's
    "fixed-judge-s1": ["seed=1", "rewards.blue_judge=rules"],
    # eval's warm start alone, a quarter of its requests benign where the recipe has half (2026-12-07): no-benign's eval,
    # warm-started on harmful requests alone, read blue's refusals where the recipe's called most of them compliances
    "eval-warm-benign-quarter": ["seed=0", *CUT_AFTER_WARM_STARTS, "phases.blue_warmup.steps=0",
                                 "phases.eval_warmup.benign_share=0.25"],
    # ... through the loop (alone it paid blue's harmful refusals +0.62, the recipe's -0.04: bench/results/eval-cross/).
    # Measured 2026-12-07 (bench/results/evidence-eval-quarter/): seed 0 eval misread 0-2% of blue's refusals (main-s0
    # 97-100%), blue JBB ASR 27.5 / 10.0 / 15.0 at over-refusal 62.5 / 10.0 at the end; seed 1's warm start read the
    # labelled set at 60.0 (benign help called a refusal), stopped in iteration 1: not adopted
    "eval-quarter-s0": ["seed=0", "phases.eval_warmup.benign_share=0.25"],
    "eval-quarter-s1": ["seed=1", "phases.eval_warmup.benign_share=0.25"],
    # ... between the two. Measured 2026-12-07 (bench/results/eval-cross/eval-cross-draws.json): blue's harmful refusals
    # paid +0.36 (seed 0) and -0.20 (seed 1), where the recipe's half pays -0.04 / +0.69: the draw decides, not the share
    "eval-warm-benign-three-eighths-s0": ["seed=0", *CUT_AFTER_WARM_STARTS, "phases.blue_warmup.steps=0",
                                          "phases.eval_warmup.benign_share=0.375"],
    "eval-warm-benign-three-eighths-s1": ["seed=1", *CUT_AFTER_WARM_STARTS, "phases.blue_warmup.steps=0",
                                          "phases.eval_warmup.benign_share=0.375"],
    # eval's warm start after blue's (phases.eval_warmup.after_blue_warmup): the answers eval learns in blue's own style
    # are then the warm-started blue's refusals with guidance and its over-refusals, the answers blue's GRPO phases ask
    # it to read; warm-started on the untrained blue's, the recipe's eval paid those refusals -0.04 on seed 0's draw
    # and +0.69 on seed 1's (bench/results/eval-cross/eval-cross-draws.json). Measured 2026-12-07 (seed 0,
    # bench/results/evidence-eval-after-blue/): eval misread 1.5-8.4% of blue's refusals (main-s0 97-100%), 90.0 -> 92.5
    # on the labelled set; blue JBB ASR 40.0 / 15.0 / 5.0 per iteration at over-refusal 62.5 / 25.0 at the end. Seed 1's
    # warm start read the labelled set at 44.2 (harmful compliances called positive): not adopted. That 44.2 was the
    # batch order's: three other orders of the same pairs read 71.7-81.7 (bench/eval_warm_orders.py --after-blue)
    "main-eval-after-blue-s0": ["seed=0", "phases.eval_warmup.after_blue_warmup=true"],
    "main-eval-after-blue-s1": ["seed=1", "phases.eval_warmup.after_blue_warmup=true"],
    # ... drawn up to three times, the draw kept whose held-out slice recalls the harmful compliances best, stopping at
    # the first that recalls >= 0.9375 of them (phases.eval_warmup.draws, draw_enough: all 8 in seed 1's slice, 15 of
    # 16 in seed 0's). On seed 1 draw 1 is the run's 44.2 above. Cut after the warm starts: does seed 1 get an eval?
    "eval-warm-after-blue-draws-s1": ["seed=1", *CUT_AFTER_WARM_STARTS, *AFTER_BLUE_DRAWS],
    # ... and through the loop (stop 71): the cut run kept draw 3, 87.5 on the labelled set. Seed 0 needs no run of
    # its own: its draw 1 recalls 15 of 16 (0.9375), so draw_enough stops there and the run is main-eval-after-blue-s0
    # (on that run's host). Measured 2026-12-08 (bench/results/evidence-eval-after-blue-draws/): draw 1 recalled all 7
    # and read the labelled set at 68.3; blue JBB ASR 72.5 / 22.5 / 0.0 at over-refusal 72.5 / 95.0: not adopted
    "main-eval-after-blue-draws-s1": ["seed=1", *AFTER_BLUE_DRAWS],
    # ... cut after its warm starts and blue read on the held-out sets (the name's `warm-`: blue's rows): after
    # iteration 1 that run's blue complied with 72.5% of JBB harmful requests. Did the loop undo its warm start?
    # Measured 2026-12-08: warm starts identical to that run's step for step; blue JBB ASR 32.5 at over-refusal
    # 42.5 / 20.0, so iteration 1 gave back 40 points of it
    "warm-starts-after-blue-draws-s1": ["seed=1", *CUT_AFTER_WARM_STARTS, *AFTER_BLUE_DRAWS],
}
RUNS = {**MAIN, **VARIANTS, **ABLATIONS}
ABLATION_ROLES = {"fixed-judge": "blue,red", "fixed-judge-s1": "blue,red", "no-div": "blue,red", "no-benign": "blue",
                  "fixed-judge-indist": "blue,red",
                  "fixed-twin-s0": "blue,red", "eval-quarter-s0": "blue,eval", "eval-quarter-s1": "blue,eval",
                  **{name: "blue" for name in VARIANTS if name.startswith("warm-")},
                  **{name: "eval" for name in VARIANTS if name.startswith("eval-warm-")}}  # what each run is about
