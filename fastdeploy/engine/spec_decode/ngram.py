"""Prompt lookup ("ngram") drafts: continue the sequence the way it continued before.

The last `n` tokens (n from `max_ngram_size` down to `min_ngram_size`) are looked up earlier in
the prompt and output; at the most recent earlier occurrence of the longest suffix that occurs (the most recent one
followed by a whole draft, if any), the tokens that followed it are the draft. Summaries, edits and code changes copy long spans of
their input, so drafts there are often right; open-ended text rarely repeats and gets no draft.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from fastdeploy.engine.sequence import Sequence
from fastdeploy.engine.spec_decode.proposal import Proposal, ProposerContext, register_proposer
from fastdeploy.speculative_config import SpeculativeConfig


def propose_ngram(token_ids: list[int], max_tokens: int, min_size: int, max_size: int) -> list[int]:
    """Up to `max_tokens` draft tokens for the sequence `token_ids`, or [] without a match."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    length = tokens.size
    for size in range(min(max_size, length - 1), min_size - 1, -1):
        suffix = tokens[length - size :]
        # windows starting before the suffix itself: the match must have a continuation
        windows = sliding_window_view(tokens[: length - 1], size)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            # the latest occurrence followed by a whole draft, else the latest one
            whole = hits[hits + size + max_tokens <= length]
            start = int(whole[-1] if whole.size else hits[-1]) + size
            return tokens[start : start + max_tokens].tolist()
    return []


class NgramProposer:
    """Prompt lookup over each sequence's own tokens; it keeps no state."""

    def __init__(self, min_size: int, max_size: int) -> None:
        self.min_size = min_size
        self.max_size = max_size

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> list[Proposal]:
        return [
            Proposal(propose_ngram(seq.token_ids, length, self.min_size, self.max_size))
            for seq, length in zip(seqs, lengths, strict=True)
        ]

    def forget_except(self, live: set[int]) -> None:
        return None


@register_proposer("ngram")
def build_ngram_proposer(config: SpeculativeConfig, context: ProposerContext) -> NgramProposer:
    return NgramProposer(config.min_ngram_size, config.max_ngram_size)
