"""Rebuilds a model's tokenizer from the metadata of its GGUF file.

A GGUF carries no tokenizer.json, only llama.cpp's description of one: the vocabulary
(`tokenizer.ggml.tokens`), each token's type, the BPE merges, the special ids and the name of
the pre-tokenizer. For `tokenizer.ggml.model == "gpt2"` (byte-level BPE) that is enough to build
the same `tokenizers.Tokenizer` the original checkpoint shipped:

- the BPE model from tokens and merges;
- control tokens (type 3, e.g. `<|im_end|>`) added as special tokens and user-defined tokens
  (type 4, e.g. `<think>`) as plain added tokens, so both are matched whole in text and never
  split; only control tokens are hidden by `skip_special_tokens`, as transformers and llama.cpp do;
- the normalizer/pre-tokenizer the `tokenizer.ggml.pre` name stands for (`gguf_pretokenizers`);
- a byte-level decoder.

For `"llama"` (a SentencePiece vocabulary with scores and byte-fallback pieces) see
`gguf_sentencepiece`. Other tokenizer models (WordPiece, Unigram, RWKV) raise
`UnsupportedModelError`.

Both kinds take from the metadata what llama.cpp does: BOS prepended when
`tokenizer.ggml.add_bos_token` says so (if absent: yes for SentencePiece, the pre-tokenizer's
default for BPE), EOS appended when `tokenizer.ggml.add_eos_token` is set, and generation ending
at EOS, at `eot_token_id` / `eom_token_id`, and at the turn-ending tokens llama.cpp recognises
by name (`<end_of_turn>`, `<|im_end|>`, `<|end|>`, `<|eot_id|>`, ...).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from tokenizers import AddedToken, decoders, models
from tokenizers import Tokenizer as RustTokenizer

from fastdeploy.errors import UnsupportedModelError
from fastdeploy.formats.gguf_file import read_gguf_metadata
from fastdeploy.input.gguf_pretokenizers import PreTokenizerSpec, pre_tokenizer_spec
from fastdeploy.input.gguf_sentencepiece import (
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_USER_DEFINED,
    sentencepiece_backend,
)
from fastdeploy.input.hf_tokenizer import HFTokenizer
from fastdeploy.input.tokenizer import TokenizerLoader
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: tokens that end a turn, which llama.cpp treats as end-of-generation by their text
#: (`<|endoftext|>` is left out: byte-level vocabularies use it as a document separator)
TURN_END_TOKENS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<EOT>",
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which byte-level vocabularies are spelled in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_CHARS = bytes_to_unicode()
_BYTE_ALPHABET = frozenset(_BYTE_CHARS.values())
#: text spelled in the byte alphabet only
_IN_BYTE_ALPHABET = re.compile("[" + "".join(re.escape(char) for char in sorted(_BYTE_ALPHABET)) + "]*")


def build_gguf_tokenizer(metadata: Mapping[str, Any], source: str = "GGUF metadata") -> HFTokenizer:
    """An `HFTokenizer` from GGUF key/value metadata (see `gguf_metadata.read_gguf_metadata`)."""
    model = metadata.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise UnsupportedModelError(
            f"{source}: tokenizer.ggml.model {model!r} is not supported; GGUF tokenizers are built "
            "for byte-level BPE ('gpt2') and SentencePiece ('llama') vocabularies. Pass tokenizer= "
            "the model's original directory instead"
        )
    tokens = _require_list(metadata, "tokenizer.ggml.tokens", source)
    token_types = metadata.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise UnsupportedModelError(
            f"{source}: tokenizer.ggml.token_type has {len(token_types)} entries for {len(tokens)} tokens"
        )
    if model == "llama":
        scores = _require_list(metadata, "tokenizer.ggml.scores", source)
        add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        # llama.cpp recognises Phi-3 by its name alone, as here
        name = str(metadata.get("general.name", "")).lower()
        phi3 = "phi-3" in name or "phi3" in name
        backend = sentencepiece_backend(tokens, scores, token_types, add_space_prefix, source, phi3)
        add_bos_default = True
    else:
        merges = _require_list(metadata, "tokenizer.ggml.merges", source)
        pre_name = metadata.get("tokenizer.ggml.pre")
        spec = pre_tokenizer_spec(pre_name)
        if pre_name is None:
            logger.warning(
                "%s names no pre-tokenizer (tokenizer.ggml.pre); using llama.cpp's 'default'", source
            )
        backend = _byte_level_bpe(tokens, token_types, merges, spec, source)
        add_bos_default = spec.add_bos_default

    bos_id = _token_id(metadata, "tokenizer.ggml.bos_token_id", len(tokens), source)
    eos_id = _token_id(metadata, "tokenizer.ggml.eos_token_id", len(tokens), source)
    add_bos = _flag(metadata, "tokenizer.ggml.add_bos_token", add_bos_default, bos_id, source)
    add_eos = _flag(metadata, "tokenizer.ggml.add_eos_token", False, eos_id, source)
    template = metadata.get("tokenizer.chat_template")
    return HFTokenizer(
        backend,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        unk_token_id=_token_id(metadata, "tokenizer.ggml.unknown_token_id", len(tokens), source),
        pad_token_id=_token_id(metadata, "tokenizer.ggml.padding_token_id", len(tokens), source),
        extra_eos_token_ids=_end_of_generation_ids(metadata, tokens, source),
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        chat_template=template if isinstance(template, str) else None,
        named_chat_templates=_named_templates(metadata),
        vocab_size=len(tokens),
    )


def _flag(metadata: Mapping[str, Any], key: str, default: bool, token_id: int | None, source: str) -> bool:
    """`add_bos_token` / `add_eos_token`: off, with a warning, when the file names no such token."""
    value = bool(metadata.get(key, default))
    if value and token_id is None:
        logger.warning("%s asks for %s but has no such token id; not adding one", source, key)
        return False
    return value


def _end_of_generation_ids(metadata: Mapping[str, Any], tokens: list[str], source: str) -> list[int]:
    """EOT/EOM ids from the metadata, then the turn-ending tokens found by their text."""
    ids = [
        token_id
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if (token_id := _token_id(metadata, key, len(tokens), source)) is not None
    ]
    ids += _ids_where(map(frozenset(TURN_END_TOKENS).__contains__, tokens))
    return ids


def _ids_where(flags: Iterable[bool]) -> list[int]:
    """The positions of the true flags. (One C-level pass: a comprehension over a 100k-token
    vocabulary took ~10 ms each time a start looked for some tokens.)"""
    return list(itertools.compress(itertools.count(), flags))


def _byte_level_bpe(
    tokens: list[str], token_types: list[int], merges: list[str], spec: PreTokenizerSpec, source: str
) -> RustTokenizer:
    """The `tokenizers.Tokenizer`: BPE model, the family's splitting rule, added tokens, decoder."""
    vocab = _byte_level_vocab(tokens, token_types, source)
    try:
        bpe = models.BPE(vocab=vocab, merges=_split_merges(merges, source), ignore_merges=spec.ignore_merges)
    except Exception as exc:  # tokenizers raises a bare Exception for merges naming unknown tokens
        raise UnsupportedModelError(
            f"{source}: the BPE vocabulary and merges are inconsistent: {exc}"
        ) from exc
    backend = RustTokenizer(bpe)
    backend.normalizer = spec.build_normalizer()
    backend.pre_tokenizer = spec.build_pre_tokenizer()
    backend.decoder = decoders.ByteLevel()
    control = [
        AddedToken(tokens[token_id], special=True, normalized=False)
        for token_id in _ids_where(map(TOKEN_CONTROL.__eq__, token_types))
    ]
    user_defined = [
        AddedToken(tokens[token_id], special=False, normalized=False)
        for token_id in _ids_where(map(TOKEN_USER_DEFINED.__eq__, token_types))
    ]
    backend.add_special_tokens(control)
    backend.add_tokens(user_defined)
    return backend


def _require_list(metadata: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = metadata.get(key)
    if not isinstance(value, list) or not value:
        raise UnsupportedModelError(f"{source}: {key} is missing or empty; the file has no usable tokenizer")
    return value


def _byte_level_vocab(tokens: list[str], token_types: list[int], source: str) -> dict[str, int]:
    """Token -> id, with every ordinary token spelled in the byte alphabet.

    llama.cpp writes byte-level tokens in GPT-2's alphabet already; a token that is not (some
    converters store raw UTF-8) is respelled so BPE can reach it. Control and user-defined tokens
    keep their text: they are matched whole as added tokens and decoded verbatim. The usual
    vocabulary, all in the alphabet, is checked in one pass over its joined text (~5 ms for 100k
    tokens, against ~100 ms for a check per token, a third of a cached GGUF start).
    """
    spelled = tokens
    if not _IN_BYTE_ALPHABET.fullmatch("".join(tokens)):
        spelled = [
            token
            if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED) or set(token) <= _BYTE_ALPHABET
            else "".join(_BYTE_CHARS[byte] for byte in token.encode("utf-8"))
            for token, kind in zip(tokens, token_types, strict=True)
        ]
    # built from the end, so a token listed twice keeps its first id
    vocab = dict(zip(reversed(spelled), range(len(spelled) - 1, -1, -1), strict=True))
    duplicates = len(spelled) - len(vocab)
    if duplicates:
        logger.warning(
            "%s: %d duplicate vocabulary entries; the first id of each is used", source, duplicates
        )
    return vocab


def _split_merges(merges: list[str], source: str) -> list[tuple[str, str]]:
    """Each "left right" merge as (left, right); one that is not two tokens is refused by name.
    (One comprehension and one C-level check for the ~50k-150k merges of a vocabulary: a call
    per merge cost ~0.1 s.)"""
    pairs = [tuple(merge.split(" ")) for merge in merges]
    if set(map(len, pairs)) != {2}:
        bad = next(merge for merge, pair in zip(merges, pairs, strict=True) if len(pair) != 2)
        raise UnsupportedModelError(f"{source}: BPE merge {bad!r} is not two tokens separated by a space")
    return pairs


def _token_id(metadata: Mapping[str, Any], key: str, vocab_size: int, source: str) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_size:
        logger.warning("%s: %s=%r is not a token id; ignoring it", source, key, value)
        return None
    return value


def _named_templates(metadata: Mapping[str, Any]) -> dict[str, str]:
    """Templates stored as `tokenizer.chat_template.<name>` (listed in `tokenizer.chat_templates`)."""
    prefix = "tokenizer.chat_template."
    return {
        key[len(prefix) :]: value
        for key, value in metadata.items()
        if key.startswith(prefix) and isinstance(value, str)
    }


class GGUFTokenizerLoader(TokenizerLoader):
    """Builds the tokenizer of a `.gguf` file from its metadata."""

    name = "gguf"
    priority = 10
    reads = "a .gguf file (its tokenizer metadata)"

    def can_load(self, model_path: str) -> bool:
        return model_path.lower().endswith(".gguf") and os.path.isfile(model_path)

    def load(self, model_path: str) -> HFTokenizer:
        metadata = read_gguf_metadata(model_path)
        tokenizer = build_gguf_tokenizer(metadata, source=model_path)
        logger.info(
            "built %s tokenizer (pre-tokenizer %r) from %s: %r",
            metadata.get("tokenizer.ggml.model"),
            metadata.get("tokenizer.ggml.pre"),
            os.path.basename(model_path),
            tokenizer,
        )
        return tokenizer
