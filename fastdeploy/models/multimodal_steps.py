"""Per-forward inputs of vision-language models: 3-D rotary positions and encoder output rows.

The engine hands a multimodal model each scheduled sequence as a span (its `MultiModalPrompt`,
or None for text only; the index of its first scheduled token; how many tokens). Prompt tokens
take the positions the processor computed; generated tokens continue at `next_position` on all
three axes; placeholder tokens take their item's encoder output rows instead of an embedding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.plugins.api import MultiModalItem, MultiModalPrompt

#: one scheduled sequence of a forward pass: its multimodal prompt (None: text only), the index
#: of its first scheduled token, and how many tokens are scheduled
SequenceSpan = tuple[MultiModalPrompt | None, int, int]


@dataclass
class StepRows:
    """What a forward pass needs beyond token ids, on the host."""

    #: int64 [3, tokens] (time, height, width) rotary positions
    positions: np.ndarray
    #: True where a token is routed to vision experts (the prompt's `vision_mask`)
    vision: np.ndarray
    #: (encoder output rows, the step's token rows they replace)
    embeddings: list[tuple[Any, np.ndarray]]


def step_rows(
    positions: np.ndarray, spans: list[SequenceSpan] | None, encode: Callable[[MultiModalItem], Any]
) -> StepRows:
    """The 3-D positions, vision mask and encoder rows of one forward pass; `encode` gives an item's
    encoder output (computed once per item)."""
    tokens = positions.shape[0]
    pos3 = np.repeat(positions[None, :].astype(np.int64), 3, axis=0)
    vision = np.zeros(tokens, dtype=bool)
    embeddings: list[tuple[Any, np.ndarray]] = []
    row = 0
    for prompt, start, count in spans or ():
        if prompt is not None:
            index = np.arange(start, start + count)
            prompt_len = len(prompt.token_ids)
            inside = index < prompt_len
            rows = np.arange(row, row + count)
            pos3[:, rows[inside]] = prompt.positions[:, index[inside]]
            pos3[:, rows[~inside]] = index[~inside] - prompt_len + prompt.next_position
            vision[rows[inside]] = prompt.vision_mask[index[inside]].astype(bool)
            for item in prompt.items:
                lo, hi = max(start, item.offset), min(start + count, item.end)
                if lo < hi:
                    embeddings.append(
                        (encode(item)[lo - item.offset : hi - item.offset], np.arange(lo, hi) - start + row)
                    )
        row += count
    return StepRows(pos3, vision, embeddings)


def embed_with_encoder_rows(ops: Any, hidden: Any, embeddings: list[tuple[Any, np.ndarray]]) -> Any:
    """`hidden` [tokens, width] with the rows of `embeddings` replaced by the encoder's rows."""
    if not embeddings:
        return hidden
    tokens = hidden.shape[0]
    covered = np.zeros(tokens, dtype=bool)
    for _, rows in embeddings:
        covered[rows] = True
    rest = np.flatnonzero(~covered)
    parts = [(ops.gather_rows(hidden, ops.from_numpy(rest)), rest)] if rest.size else []
    return ops.merge_rows(parts + embeddings, tokens)
