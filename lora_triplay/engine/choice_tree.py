"""A prompt's forced choices as one token tree, scored in one row.

A judge asks for one of a few labels ("Label: negative", "Label: rejective",
"Label: positive"). Scoring each label as its own row after the shared
prompt copies the prompt's KV cache once per label (57 prompts -> 171 rows)
and appends each label's tokens to every copy: on the 135M judge of a blue
step that copying was 9.7 of 24.3 s (bench/results/judge-cost.json). Here
each prompt keeps one row: its labels' tokens are laid out as a trie (the
shared "Label:" once, then one branch per label) after the prompt, and a
token attends to the prompt and to its own ancestors only, so every label
scores exactly as if it were alone after the prompt.

Rows are padded to the widest tree; a padding node attends to itself so no
attention row is empty (SDPA turns an all-masked row into NaN).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChoiceTree:
    ids: torch.Tensor  # (B, N) node tokens, pad where a row's tree is narrower
    depth: torch.Tensor  # (B, N) node's offset after the prompt (its position - prompt end - 1)
    attend: torch.Tensor  # (B, N, N) bool: node i sees node j (ancestor or itself)
    # per row, per choice, per choice token after the first: the node whose
    # logits predict it (the first token comes from the prompt's own logits)
    source: list[list[list[int]]]

    @property
    def width(self) -> int:
        return self.ids.shape[1]


def build(choices_per_row: list[list[list[int]]], pad_id: int) -> ChoiceTree:
    """One tree per row from its choices' token ids. A node is a proper
    prefix of a choice (the tokens that are fed; a choice's last token is
    only predicted); choices sharing a prefix share its nodes."""
    keys_per_row, source = [], []
    for choices in choices_per_row:
        index: dict[tuple[int, ...], int] = {}
        for toks in choices:
            for t in range(1, len(toks)):
                index.setdefault(tuple(toks[:t]), len(index))
        keys_per_row.append(list(index))
        source.append([[index[tuple(toks[:t])] for t in range(1, len(toks))] for toks in choices])
    B, N = len(choices_per_row), max((len(k) for k in keys_per_row), default=0)
    ids = torch.full((B, N), pad_id, dtype=torch.long)
    depth = torch.zeros((B, N), dtype=torch.long)
    attend = torch.eye(N, dtype=torch.bool).repeat(B, 1, 1)
    for b, keys in enumerate(keys_per_row):
        where = {key: i for i, key in enumerate(keys)}
        for i, key in enumerate(keys):
            ids[b, i] = key[-1]
            depth[b, i] = len(key) - 1
            for n in range(1, len(key)):
                attend[b, i, where[key[:n]]] = True
    return ChoiceTree(ids, depth, attend, source)


def attention_mask(tree: ChoiceTree, prompt_mask: torch.Tensor) -> torch.Tensor:
    """The (B, 1, N, K + N) boolean mask for the tree's forward after a
    cached prompt of K columns (prompt_mask: (B, K), 1 = a real token)."""
    seen = prompt_mask.bool()[:, None, :].expand(-1, tree.width, -1)
    return torch.cat([seen, tree.attend.to(prompt_mask.device)], dim=-1).unsqueeze(1)


def gather_scores(tree: ChoiceTree, first_logp: torch.Tensor, node_logp: torch.Tensor,
                  choices_per_row: list[list[list[int]]]) -> list[list[list[float]]]:
    """Per row, per choice: the log-prob of each of its tokens, the first
    from the prompt's next-token log-probs (B, V), the rest from the tree's
    (B, N, V)."""
    out = []
    for b, choices in enumerate(choices_per_row):
        rows = []
        for toks, nodes in zip(choices, tree.source[b]):
            lp = [first_logp[b, toks[0]]]
            if nodes:
                lp += list(node_logp[b, torch.tensor(nodes), torch.tensor(toks[1:])].unbind())
            rows.append(torch.stack(lp).tolist())
        out.append(rows)
    return out
