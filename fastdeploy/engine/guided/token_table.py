"""The bytes each token id stands for, which grammar backends need to know which tokens fit.

Tokenizers built on the `tokenizers` library (tokenizer.json checkpoints, and the byte-level
BPE rebuilt from GGUF metadata) can be handed to llguidance whole, as tokenizer.json text: it
reads their byte mapping itself. Otherwise, and for xgrammar, each id's bytes are read from its
vocabulary piece: byte-level vocabularies (a `ByteLevel` decoder) spell bytes with GPT-2's
printable alphabet; SentencePiece-style ones write `▁` for a space and `<0xNN>` for the byte NN.
Special tokens never match grammar text (only EOS, where the grammar may end). Ids past the
tokenizer's vocabulary (a padded embedding table) have no bytes and are never allowed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property

from fastdeploy.input.gguf_tokenizer import bytes_to_unicode
from fastdeploy.input.tokenizer import Tokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_BYTE_LEVEL = {char: byte for byte, char in bytes_to_unicode().items()}


@dataclass
class TokenTable:
    """What a grammar backend needs from the model's tokenizer."""

    tokenizer: Tokenizer
    #: the model's logits width (may exceed the tokenizer's vocabulary)
    vocab_size: int
    eos_token_ids: list[int]

    @cached_property
    def tokenizer_json(self) -> str | None:
        """tokenizer.json text, when the tokenizer is built on the `tokenizers` library."""
        to_str = getattr(getattr(self.tokenizer, "backend", None), "to_str", None)
        return to_str() if callable(to_str) else None

    @property
    def special_token_ids(self) -> list[int]:
        return sorted(self.tokenizer.special_token_ids)

    @cached_property
    def token_bytes(self) -> list[bytes | None]:
        """Bytes of every id; None for special tokens and ids without a piece."""
        byte_level = self._byte_level()
        specials = self.tokenizer.special_token_ids
        table: list[bytes | None] = []
        for token_id in range(self.vocab_size):
            piece = self.tokenizer.id_to_token(token_id) if token_id < self.tokenizer.vocab_size else None
            if piece is None or token_id in specials:
                table.append(None)
            elif byte_level:
                table.append(_byte_level_bytes(piece))
            else:
                table.append(_sentencepiece_bytes(piece))
        return table

    def _byte_level(self) -> bool:
        if self.tokenizer_json is None:
            return False
        decoder = json.loads(self.tokenizer_json).get("decoder") or {}
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        return any(part.get("type") == "ByteLevel" for part in parts)


def _sentencepiece_bytes(piece: str) -> bytes:
    byte = _BYTE_PIECE.fullmatch(piece)
    if byte:
        return bytes([int(byte.group(1), 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


def _byte_level_bytes(piece: str) -> bytes:
    if all(char in _BYTE_LEVEL for char in piece):
        return bytes(_BYTE_LEVEL[char] for char in piece)
    return piece.encode("utf-8")  # an added token written in plain text


def token_table(tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int]) -> TokenTable:
    """The table for `tokenizer`, for a model whose logits have `vocab_size` columns (EOS ids past
    them, which the model can never produce, are left out)."""
    return TokenTable(tokenizer, vocab_size, [token for token in eos_token_ids if token < vocab_size])
