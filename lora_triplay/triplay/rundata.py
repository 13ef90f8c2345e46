"""What the loop draws from and adds to, kept in step with the run folder:
red's seed requests, blue's benign stream, eval's pair pool and the panel's
labels.

Cursors live in `state.json` (they commit with the step); the pair pool and
the labels are rebuilt on resume from the committed rows of
`eval_pairs.jsonl` and `panel.jsonl`. Labels found during a step stay
pending until the step commits, then join the labelled set.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from ..errors import UserError
from .experts import panel_summary
from .pairs import PairPool
from .roles import BasicPrompt, load_basic_prompts, load_techniques


def _file(value: str) -> str | None:
    return None if value == "builtin" else value


def _twins(benign: list[BasicPrompt], seeds: list[BasicPrompt], builtin: bool) -> dict[str, BasicPrompt]:
    """Seed id -> its benign topic twin. Builtin benign requests take theirs
    from prompts/twins.yaml (a twin whose seed data.basic_prompts or
    data.limit left out is dropped); a benign file's `twin_of` column must
    name a seed request."""
    if builtin:
        from importlib import resources

        import yaml

        links = yaml.safe_load(resources.files("lora_triplay.triplay").joinpath("prompts/twins.yaml").read_text(encoding="utf-8"))
    else:
        links = {b.id: b.twin_of for b in benign if b.twin_of}
    ids = {s.id for s in seeds}
    missing = sorted(f"{b}: {s}" for b, s in links.items() if s not in ids)
    if missing and not builtin:
        raise UserError(f"data.benign_prompts: twin_of names no seed request of data.basic_prompts ({', '.join(missing[:3])}); "
                        "give the id of a seed request or leave twin_of empty")
    return {links[b.id]: b for b in benign if links.get(b.id) in ids}


def load_gold_pairs(path: str, need_kind: bool = False) -> list[dict]:
    """`experts.gold_pairs`: JSONL rows with prompt, response and label (and
    kind, harmful | benign, where eval reads it: `need_kind`)."""
    import json

    from ..benchmarks import EXPECTED
    from ..judging.parsing import LABELS

    rows = []
    for n, line in enumerate(Path(path).expanduser().read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"experts.gold_pairs {path}: line {n} is not JSON") from None
        if not all(isinstance(row.get(k), str) for k in ("prompt", "response", "label")) or row["label"] not in LABELS:
            raise UserError(f"experts.gold_pairs {path}: line {n} needs prompt, response and label (one of {', '.join(LABELS)})")
        if row.get("kind", "harmful") not in EXPECTED or (need_kind and "kind" not in row):
            raise UserError(f"experts.gold_pairs {path}: line {n} needs a kind, harmful or benign (eval reads it: "
                            "rewards.eval_sees_kind)" if need_kind else f"experts.gold_pairs {path}: line {n}: kind is harmful or benign")
        rows.append(row)
    if not rows:
        raise UserError(f"experts.gold_pairs {path}: no rows")
    return rows


class RunData:
    def __init__(self, recipe, state: dict, panel):
        r = recipe
        self.recipe, self.state, self.panel = r, state, panel
        self.basic = load_basic_prompts(_file(r.data.basic_prompts), r.data.prompt_column, r.data.limit)
        self.techniques = load_techniques(_file(r.data.techniques))
        self.benign: list[BasicPrompt] = []
        if r.data.benign_share > 0:
            if r.data.benign_prompts == "builtin":
                from importlib import resources

                path = str(resources.files("lora_triplay.triplay").joinpath("prompts/benign_prompts.jsonl"))
            else:
                path = r.data.benign_prompts
            self.benign = load_basic_prompts(path)
        # topic twins: a benign request's harmful seed of the same topic (phases.blue.twin_groups)
        self.twin_of_seed = _twins(self.benign, self.basic, builtin=r.data.benign_prompts == "builtin")
        if r.phases.blue.twin_groups and not self.twin_of_seed:
            raise UserError("phases.blue.twin_groups: no benign request is the twin of a seed request here (the builtin "
                            "twins pair the builtin seeds); give the benign file a twin_of column or set twin_groups=false")
        # a fixed attack set for blue (data.blue_attacks: a file), in its own order
        self.attacks = [] if r.data.blue_attacks in ("red", "seeds") else load_basic_prompts(r.data.blue_attacks)
        self.gold = load_gold_pairs(r.experts.gold_pairs, r.rewards.eval_sees_kind) if r.experts.gold_pairs else []
        self.pairs = PairPool(r.experts.pool_cap, r.seed)
        self.labelled: list[dict] = []  # panel rows with a label (text included)
        self.pending: list[dict] = []  # this step's, until it commits

    # ------------------------------------------------------------ seed data
    def next_seed_items(self, k: int):
        """The next k (basic prompt, technique) pairs of a seeded shuffle of
        all pairs (paper: 200 x 9 = 1,800 seed prompts), epoch after epoch."""
        n = len(self.basic) * len(self.techniques)
        out = []
        for _ in range(k):
            cursor = self.state["cursor"]
            epoch, pos = divmod(cursor, n)
            order = np.random.default_rng(self.recipe.seed + epoch).permutation(n)
            b, t = divmod(int(order[pos]), len(self.techniques))
            out.append((self.basic[b], self.techniques[t]))
            self.state["cursor"] = cursor + 1
        return out

    def next_benign(self, k: int) -> list[BasicPrompt]:
        """The next k benign requests of a seeded shuffle, epoch after epoch."""
        out = []
        for _ in range(k if self.benign else 0):
            cursor = self.state.setdefault("benign_cursor", 0)
            epoch, pos = divmod(cursor, len(self.benign))
            order = np.random.default_rng([self.recipe.seed, 7, epoch]).permutation(len(self.benign))
            out.append(self.benign[int(order[pos])])
            self.state["benign_cursor"] = cursor + 1
        return out

    def blue_requests(self, count: int, twins: bool = False) -> tuple[list, list[BasicPrompt]]:
        """One blue step's requests: (harmful requests, benign requests),
        `data.benign_share` of the `count` benign. Harmful: (seed request,
        technique) pairs for red to wrap, or with a fixed attack set
        (`data.blue_attacks` a file) its next attacks as (attack, None).
        With `twins` the benign ones are first the topic twins of this
        step's harmful requests, then the stream's next."""
        n_benign = self.benign_count(count)
        harmful = self.next_attacks(count - n_benign) if self.attacks else self.next_seed_items(count - n_benign)
        paired = []
        if twins:  # each seed's twin once, in the order of the step's harmful requests
            seeds = dict.fromkeys(b.id for b, _ in harmful if b.id in self.twin_of_seed)
            paired = [self.twin_of_seed[i] for i in seeds][:n_benign]
        return harmful, paired + self.next_benign(n_benign - len(paired))

    def next_attacks(self, k: int) -> list[tuple[BasicPrompt, None]]:
        """The next k attacks of the fixed set, in the file's order, epoch after epoch."""
        out = []
        for _ in range(k):
            cursor = self.state.setdefault("attack_cursor", 0)
            out.append((self.attacks[cursor % len(self.attacks)], None))
            self.state["attack_cursor"] = cursor + 1
        return out

    def benign_count(self, prompts: int) -> int:
        """How many of a blue step's prompts come from the benign stream."""
        if not self.benign:
            return 0
        return min(prompts - 1, max(1, round(self.recipe.data.benign_share * prompts))) if prompts > 1 else 0

    # ----------------------------------------------------------- eval pairs
    def label_new_pairs(self, k: int) -> tuple[list[dict], dict[str, float]]:
        """The panel labels k pairs eval has not been taught yet, most from
        the current iteration (pairs.py). Returns the panel rows (pending
        until the step commits) and the panel's summary metrics."""
        rng = random.Random(f"{self.recipe.seed}:label:{self.state['global_step']}")
        todo = self.pairs.pick(k, self.recipe.experts.fresh_share, rng, by_source=self.recipe.experts.pick_by == "source")
        rows, summary = self._label(todo)
        if todo:
            summary["panel_fresh_share"] = sum(p.get("iteration") == self.pairs.iteration for p in todo) / len(todo)
        return rows, summary

    def label_fresh(self, eval_rows: list[dict]) -> tuple[list[dict], dict[str, float]]:
        """Label pairs made in this step (eval's warm start): they get their
        pool index now, the one they will have when the step commits."""
        for i, row in enumerate(eval_rows):
            row["pair"] = self.pairs.count + i
        return self._label(eval_rows)

    def _label(self, todo: list[dict]) -> tuple[list[dict], dict[str, float]]:
        if not todo:
            return [], {}
        labels = self.panel.label([(p["prompt"], p["response"], p.get("kind", "harmful"), p.get("generic", False)) for p in todo])
        rows = [
            {"pair": p["pair"], "prompt": p["prompt"], "response": p["response"], "kind": p.get("kind", "harmful"),
             "generic": p.get("generic", False), "iteration": p.get("iteration"), "panel_label": lab.label,
             "agreement": lab.agreement, "votes": lab.votes, "quorum": lab.quorum, "heldout": self._held_out(p["pair"])}
            for p, lab in zip(todo, labels)
        ]
        self.pending = rows
        return rows, panel_summary(labels)

    def _held_out(self, pair: int) -> bool:
        """Whether a pair is kept out of eval's training (`experts.heldout_share`),
        decided by its pool index and the seed alone."""
        return random.Random(f"{self.recipe.seed}:heldout:{pair}").random() < self.recipe.experts.heldout_share

    def labelled_count(self) -> int:
        return len(self.labelled) + sum(1 for r in self.pending if r["panel_label"])

    def heldout_pairs(self) -> list[dict]:
        """The committed labelled pairs eval never trains on."""
        return [r for r in self.labelled if r.get("heldout")]

    def sample_labelled_pairs(self, k: int) -> list[dict]:
        """k labelled pairs drawn uniformly (with replacement) from all pairs
        the panel has labelled so far (the held-out ones aside), this step's
        included; with
        `experts.balance_classes`, the labels present in turns (in a
        shuffled order, so a batch holds each about equally often), a pair
        drawn for each (drawing the label at random gave batches of 8 such
        as 1/4/3), each label's pair from the current iteration's with
        probability `experts.batch_fresh_share`; with `kind`, each (request
        kind, label) cell present in turns."""
        pool = [r for r in self.labelled + [r for r in self.pending if r["panel_label"]] if not r.get("heldout")]
        if not pool:
            return []
        if not self.recipe.experts.balance_classes:
            return [pool[random.randrange(len(pool))] for _ in range(min(k, len(pool)))]
        by_kind = self.recipe.experts.balance_classes == "kind"
        by: dict[tuple[str, str], list[dict]] = {}
        for row in pool:
            by.setdefault((row.get("kind", "harmful") if by_kind else "", row["panel_label"]), []).append(row)
        classes = sorted(by)
        random.shuffle(classes)
        fresh_share = self.recipe.experts.batch_fresh_share
        out = []
        for i in range(min(k, len(pool))):
            rows = by[classes[i % len(classes)]]
            fresh = [r for r in rows if r.get("iteration") == self.pairs.iteration]
            # no draw where every row is fresh (eval's warm start): its batches stay those of a recipe without it
            if fresh_share and 0 < len(fresh) < len(rows) and random.random() < fresh_share:
                rows = fresh
            out.append(rows[random.randrange(len(rows))])
        return out

    def commit(self, eval_rows: list[dict], panel_rows: list[dict]) -> None:
        """A step committed: its pairs join the pool, its labels the set."""
        self.pairs.add(eval_rows)
        self.pairs.mark_labelled(r["pair"] for r in panel_rows)
        self.labelled.extend(r for r in panel_rows if r["panel_label"])
        self.pending = []

    def restore(self, store) -> None:
        """Rebuild the pool and the labels from the committed rows."""
        self.pairs.add(store.iter_jsonl("eval_pairs"))
        rows = list(store.iter_jsonl("panel"))
        self.pairs.mark_labelled(r["pair"] for r in rows)
        self.labelled = [r for r in rows if r["panel_label"]]
