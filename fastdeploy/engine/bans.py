"""Tokens a sequence may not take next (`min_tokens`, `bad_words`), with the setting behind each."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fastdeploy.engine.output_processor import banned_bad_word_tokens
from fastdeploy.engine.sampler import BannedTokens
from fastdeploy.engine.sequence import EngineRequest, Sequence


class Bans:
    """Computes the bans of a pass's sampling rows.

    `grammar_complete(seq)` says whether the sequence's grammar allows nothing but EOS (then
    `min_tokens` must not ban EOS); `requests` are the engine's (their bad-word ids).
    """

    def __init__(
        self,
        eos_token_ids: frozenset[int],
        grammar_complete: Callable[[Sequence], bool],
        requests: Mapping[str, EngineRequest],
    ) -> None:
        self.eos = sorted(eos_token_ids)
        self.grammar_complete = grammar_complete
        self.requests = requests

    def __call__(self, seqs: list[Sequence], sampling: list[int]) -> list[BannedTokens]:
        bans = []
        for row, index in enumerate(sampling):
            reasons = self.reasons(seqs[index])
            if reasons:
                bans.append(BannedTokens(row, [token for ids in reasons.values() for token in ids], reasons))
        return bans

    def reasons(self, seq: Sequence) -> dict[str, list[int]]:
        """The tokens `seq` may not take next, under the setting (as users write it) that bans them."""
        params = seq.params
        reasons: dict[str, list[int]] = {}
        if params.min_tokens and seq.num_output_tokens < params.min_tokens:
            if not params.ignore_eos and not self.grammar_complete(seq):
                reasons[f"min_tokens={params.min_tokens} (no EOS before that)"] = list(self.eos)
            if params.stop_token_ids:
                before = f"before min_tokens={params.min_tokens}"
                reasons[f"stop_token_ids {params.stop_token_ids} ({before})"] = params.stop_token_ids
        bad_words_ids = self.requests[seq.request_id].bad_words_ids
        if bad_words_ids:
            words = banned_bad_word_tokens(seq, bad_words_ids)
            if words:
                reasons[f"bad_words {params.bad_words}"] = words
        return reasons
