"""Accepting drafts so that the output keeps the target model's distribution.

Standard speculative sampling (Leviathan et al., 2023; Chen et al., 2023): draft token x_i, drawn
from the proposer's distribution q_i, is accepted with probability min(1, p_i(x_i) / q_i(x_i)),
p_i being the target's distribution at that position; at the first rejection a token is drawn
from the residual max(0, p_i - q_i) (normalised) and the rest is dropped; when every draft is
accepted one more token is drawn from p_{k+1}. Each emitted token is then distributed exactly as
p (so greedy requests, whose p is one-hot, emit exactly the target's argmax tokens).

Prompt lookup drafts are deterministic: q_i is one-hot on x_i, acceptance is p_i(x_i), and the
residual is p_i without x_i. Drawing y ~ p_i with the sequence's own generator and accepting x_i
iff y == x_i (emitting y either way) is that same rule; it draws one uniform per emitted token,
as decoding without speculation does, so a seeded request emits the same tokens with and
without speculation (`accept_matching`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def accept_matching(draft_token_ids: list[int], target_token: Callable[[int], int]) -> list[int]:
    """Tokens emitted for one-hot drafts: `target_token(i)` is the target's token at position i
    (its argmax, or a sample from p_i); drafts are accepted while they equal it."""
    emitted = []
    for position in range(len(draft_token_ids) + 1):
        token = target_token(position)
        emitted.append(token)
        if position == len(draft_token_ids) or token != draft_token_ids[position]:
            break
    return emitted


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Index drawn from `probs` (weights, not necessarily normalised) with one uniform of `rng`."""
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, probs.size - 1)


def rejection_sample(
    target_probs: np.ndarray, draft_probs: np.ndarray, draft_token_ids: list[int], rng: np.random.Generator
) -> list[int]:
    """Tokens emitted for drafts sampled from `draft_probs` [k, vocab]; `target_probs` is
    [k + 1, vocab]. Every row is a probability vector over the whole vocabulary."""
    for position, token in enumerate(draft_token_ids):
        p, q = target_probs[position], draft_probs[position]
        if rng.random() * q[token] < p[token]:
            continue
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        return [*draft_token_ids[:position], draw(residual / total if total > 0 else p, rng)]
    return [*draft_token_ids, draw(target_probs[len(draft_token_ids)], rng)]
