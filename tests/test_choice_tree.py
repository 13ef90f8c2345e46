"""The token tree of a prompt's forced choices (engine/choice_tree.py)."""
from __future__ import annotations

import torch

from lora_triplay.engine import choice_tree


def test_shared_prefixes_are_one_node_and_tokens_see_only_their_ancestors():
    # two rows: three labels sharing [5, 6], and one two-token choice
    per_row = [[[5, 6, 7, 0], [5, 6, 8, 0], [5, 9, 0]], [[4, 0]]]
    tree = choice_tree.build(per_row, pad_id=-1)
    # fed nodes of row 0: 5, 56, 567, 568, 59 (a choice's last token is only predicted)
    assert tree.width == 5 and tree.ids[0].tolist() == [5, 6, 7, 8, 9]
    assert tree.depth[0].tolist() == [0, 1, 2, 2, 1]
    assert tree.attend[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 0, 0, 0, 1],
    ]
    assert tree.source[0] == [[0, 1, 2], [0, 1, 3], [0, 4]]
    # row 1 has one node; its padding nodes see only themselves
    assert tree.ids[1].tolist() == [4, -1, -1, -1, -1]
    assert tree.attend[1].int().tolist() == torch.eye(5, dtype=torch.int).tolist()
    mask = choice_tree.attention_mask(tree, torch.tensor([[0, 1, 1], [1, 1, 1]]))
    assert mask.shape == (2, 1, 5, 8) and mask[0, 0, 2].int().tolist() == [0, 1, 1, 1, 1, 1, 0, 0]


def test_scores_come_from_the_prompt_then_the_parent_node():
    per_row = [[[1, 2, 0], [3]]]
    tree = choice_tree.build(per_row, pad_id=0)
    first = torch.arange(4.0).unsqueeze(0)  # log-prob of token t after the prompt: t
    nodes = torch.arange(tree.width * 4, dtype=torch.float).reshape(1, tree.width, 4) * 10
    got = choice_tree.gather_scores(tree, first, nodes, per_row)
    # choice [1, 2, 0]: 1 after the prompt, 2 after node [1], 0 after node [1, 2]
    assert got == [[[1.0, 20.0, 40.0], [3.0]]]
