"""Constrained rows whose bans leave no token: found before sampling, so that request fails alone.

A request's bans (EOS and `stop_token_ids` before `min_tokens`, the last token of a `bad_words`
entry) apply on top of its grammar's mask. If they cover every token the grammar allows, nothing
can be sampled: the host sampler would find no finite logit (and fail the whole batch), and a
greedy argmax would pick a token outside the grammar. The engine asks first, and fails only that
request, with a message that says which settings and which tokens collide.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fastdeploy.engine.guided.backend import allowed_tokens
from fastdeploy.engine.sampler import BannedTokens

#: allowed tokens spelled out in the message; the rest are counted
_SHOWN_TOKENS = 8


def conflict(
    bitmask_row: np.ndarray,
    vocab_size: int,
    ban: BannedTokens,
    num_output_tokens: int,
    spell: Callable[[int], str],
) -> str | None:
    """Why no token can follow (the grammar's tokens all banned), or None when one can.

    `bitmask_row` is the row's grammar mask (int32 words); `ban.reasons` says which setting banned
    which tokens; `spell(token)` shows one token in the message.
    """
    allowed = allowed_tokens(bitmask_row, vocab_size)
    banned = np.zeros(vocab_size, dtype=bool)
    banned[[token for token in ban.token_ids if 0 <= token < vocab_size]] = True
    if (allowed & ~banned).any():
        return None
    tokens = np.flatnonzero(allowed)
    if tokens.size == 0:
        return None  # the grammar itself allows nothing: not a ban's doing (the sampler handles it)
    culprits = [
        source
        for source, ids in ban.reasons.items()
        if allowed[[token for token in ids if 0 <= token < vocab_size]].any()
    ]
    shown = ", ".join(f"{spell(int(token))} (id {int(token)})" for token in tokens[:_SHOWN_TOKENS])
    if tokens.size > _SHOWN_TOKENS:
        shown += f" and {tokens.size - _SHOWN_TOKENS} more"
    verb = "ban" if len(culprits) > 1 else "bans"
    return (
        f"after {num_output_tokens} output token{'' if num_output_tokens == 1 else 's'} the guided_decoding constraint allows only {shown}, "
        f"and {' and '.join(culprits)} {verb} {'it' if tokens.size == 1 else 'all of them'}: no token "
        "can be generated; change these settings or the constraint"
    )
