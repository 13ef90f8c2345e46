"""Everything about judging a (prompt, response), in three parts:

    parsing.py   the judge templates' answers: strict `Label:` / `Verdict:`
                 parsing, thinking stripped, red's and blue's text put in
                 neutralised data blocks (never instructions to the judge),
                 red's rewrite extracted from `<prompt>...</prompt>`
    refusals.py  refusal by rule: the one phrase list every rule-based
                 verdict uses (the panel's rule expert, the `rules` judge)
    fixed.py     the fixed judges of `lora-triplay eval`: rules, the
                 prompted panel, an eval snapshot, an OpenAI-compatible
                 endpoint
"""
