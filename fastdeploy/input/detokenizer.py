"""Streams generated token ids out as text deltas without ever emitting half a character.

A byte-level BPE token can hold part of a UTF-8 character (an emoji or a CJK character is often
split over two or three tokens), so decoding each new token alone would print U+FFFD. Decoding
the whole sequence every step fixes that but costs O(n) per token. We keep vLLM's two offsets
instead: text is emitted from a small window `ids[prefix_offset:]`, minus the text of
`ids[prefix_offset:read_offset]` (already emitted, kept as context so decoders that strip a
leading space or merge pieces see the same neighbourhood they would in a full decode). While the
window's text ends in U+FFFD the tail is an incomplete character and is held back (when several
ids arrive at once, the text up to the last token boundary where it is whole still goes out);
once it decodes cleanly the delta is emitted and both offsets move forward. Each step decodes
only a few tokens, and the concatenated deltas equal `tokenizer.decode(all_ids)`.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastdeploy.input.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
#: a UTF-8 character has at most 4 bytes, so at most 4 byte-tokens end inside one.
_MAX_CHAR_TOKENS = 4


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas for one sequence.

    `max_pending_tokens` bounds the held-back window: a model that keeps emitting bytes that
    never form a character (or a run of tokens that each straddle two characters) would
    otherwise make every step decode a longer window. Past the bound the U+FFFD is emitted as
    it is; then, and only then, the deltas can differ from a full decode.
    """

    def __init__(
        self, tokenizer: Tokenizer, skip_special_tokens: bool = True, max_pending_tokens: int = 32
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._max_pending = max(4, max_pending_tokens)
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text = ""  # decode(ids[prefix_offset:read_offset]), kept to avoid decoding it twice
        self._pieces: list[str] = []

    @property
    def token_ids(self) -> list[int]:
        """All ids added so far (a copy)."""
        return list(self._ids)

    @property
    def num_token_ids(self) -> int:
        """How many ids were added so far."""
        return len(self._ids)

    @property
    def text(self) -> str:
        """All text emitted so far (the concatenation of every delta)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def add(self, token_ids: Sequence[int]) -> str:
        """Append newly generated ids; return the text they complete (possibly "")."""
        if not token_ids:
            return ""
        self._ids.extend(int(token_id) for token_id in token_ids)
        end = len(self._ids)
        window = self._decode(self._ids[self._prefix_offset :])
        if not window.endswith(_REPLACEMENT):
            return self._advance(window, end)
        # The last character is incomplete. Among the ids just added there may still be a token
        # boundary where the text is whole (a chunk "...한", "<first byte of 국>"): emit up to it, so
        # the held-back tail stays a few tokens long however the ids arrive.
        earliest = max(self._read_offset, end - len(token_ids), end - 1 - _MAX_CHAR_TOKENS)
        for boundary in range(end - 1, earliest, -1):
            text = self._decode(self._ids[self._prefix_offset : boundary])
            if not text.endswith(_REPLACEMENT):
                return self._advance(text, boundary)
        if end - self._read_offset > self._max_pending:
            return self._advance(window, end)
        return ""

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character at the end, as U+FFFD).

        Call when the sequence finishes; afterwards `text` equals `tokenizer.decode(all_ids)`.
        """
        if self._read_offset == len(self._ids):
            return ""
        return self._advance(self._decode(self._ids[self._prefix_offset :]), len(self._ids))

    def _advance(self, window: str, end: int) -> str:
        """Emit `window` (the text of ids[prefix_offset:end]) past the prefix; move both offsets."""
        delta = window[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = end
        self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        if delta:
            self._pieces.append(delta)
        return delta

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)
