"""A SentencePiece-style GGUF vocabulary (`tokenizer.ggml.model == "llama"`) as a `tokenizers.Tokenizer`.

llama.cpp's converter writes a SentencePiece model as three parallel lists: the pieces
(`tokenizer.ggml.tokens`, spaces spelled "▁"), a score per piece (`tokenizer.ggml.scores`) and
a type per piece (`tokenizer.ggml.token_type`: normal, unknown, control, user-defined, unused,
byte). llama.cpp tokenizes such a vocabulary (its "SPM" tokenizer) like this:

- control, unknown and user-defined tokens written in the text are cut out first and kept whole
  (for Phi-3, whose `general.name` says so, they also swallow the whitespace after them, except
  `<unk>`, `<s>` and `<|endoftext|>`: the `rstrip` its Hugging Face tokenizer sets on them);
- each remaining stretch of text gets a leading space if `tokenizer.ggml.add_space_prefix`
  (default on; Gemma's files turn it off), then every space becomes "▁";
- the stretch starts as single characters, and the adjacent pair whose concatenation is a piece
  with the highest score is merged, again and again (ties: the leftmost pair);
- a character left that is not a piece becomes its UTF-8 bytes' `<0xNN>` pieces (byte fallback).

That is byte-pair encoding whose merge list is every (left, right) split of every piece, ranked
by the merged piece's score, so `tokenizers`' BPE model (with `byte_fallback`) runs it
unchanged, as transformers' own conversion of a `tokenizer.model` does; the rank tie-break
(piece id, then the shorter left part) is transformers' too. Decoding turns "▁" back into
spaces, joins byte pieces into UTF-8, and drops the one leading space the prefix rule added.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as RustTokenizer

from fastdeploy.errors import UnsupportedModelError
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

# llama.cpp's token types (gguf.TokenType), shared by both kinds of GGUF vocabulary.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

#: how SentencePiece spells a space inside pieces
SPACE = "\u2581"
#: the special tokens that keep the whitespace after them when the others strip it (Phi-3)
_NEVER_RSTRIP = frozenset({"<unk>", "<s>", "<|endoftext|>"})


def sentencepiece_backend(
    tokens: Sequence[str],
    scores: Sequence[float],
    token_types: Sequence[int],
    add_space_prefix: bool,
    source: str,
    rstrip_special: bool = False,
) -> RustTokenizer:
    """The `tokenizers.Tokenizer` that splits text as llama.cpp's SPM tokenizer does
    (`rstrip_special`: special tokens swallow the whitespace after them, as for Phi-3)."""
    if len(scores) != len(tokens):
        raise UnsupportedModelError(
            f"{source}: tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens"
        )
    try:
        ranking = -np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"{source}: tokenizer.ggml.scores must be numbers: {exc}") from exc
    vocab = _first_ids(tokens, source)
    unknown = next((tokens[i] for i, kind in enumerate(token_types) if kind == TOKEN_UNKNOWN), None)
    if not any(kind == TOKEN_BYTE for kind in token_types):
        logger.warning(
            "%s: the vocabulary has no <0xNN> byte pieces; characters outside it become %r",
            source,
            unknown,
        )
    bpe = models.BPE(
        vocab=vocab,
        merges=_merges(tokens, ranking, vocab),
        unk_token=unknown,
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = RustTokenizer(bpe)
    escape = normalizers.Replace(" ", SPACE)
    backend.normalizer = (
        normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if add_space_prefix else escape
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)

    # matched in the raw text before the prefix rule runs, so each stretch after one of them
    # gets its own leading space, as llama.cpp does
    def added(token: str, special: bool) -> AddedToken:
        strip = rstrip_special and token not in _NEVER_RSTRIP
        return AddedToken(token, special=special, normalized=False, rstrip=strip)

    kinds = list(zip(tokens, token_types, strict=True))
    backend.add_special_tokens(
        [added(token, True) for token, kind in kinds if kind in (TOKEN_CONTROL, TOKEN_UNKNOWN)]
    )
    backend.add_tokens([added(token, False) for token, kind in kinds if kind == TOKEN_USER_DEFINED])
    return backend


def _first_ids(tokens: Sequence[str], source: str) -> dict[str, int]:
    """Piece -> id; a piece listed twice keeps its first id (llama.cpp's lookup keeps the last,
    but converters only repeat unused padding pieces)."""
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)
    duplicates = len(tokens) - len(vocab)
    if duplicates:
        logger.warning(
            "%s: %d duplicate vocabulary entries; the first id of each is used", source, duplicates
        )
    return vocab


def _merges(tokens: Sequence[str], ranking: np.ndarray, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of every piece into two pieces, best-scored merged piece first.

    A merge's rank stands for llama.cpp's score of the merged piece: pieces are visited from the
    highest score down (ties: lower id first), each piece's splits from the shortest left part,
    as transformers orders them, so the list comes out ranked without sorting the merges.
    """
    order = np.argsort(ranking, kind="stable")  # ranking = -score
    merges: list[tuple[str, str]] = []
    for token_id in order.tolist():
        piece = tokens[token_id]
        if len(piece) < 2 or vocab[piece] != token_id:
            continue
        for cut in range(1, len(piece)):
            left = piece[:cut]
            if left in vocab:
                right = piece[cut:]
                if right in vocab:
                    merges.append((left, right))
    return merges
