"""A `Tokenizer` over the `sentencepiece` library, for checkpoints that ship a `tokenizer.model`.

ERNIE-4.5 (and Llama-2-era models) ship a SentencePiece model plus Hugging Face-style JSON
files naming special and added tokens. The library encodes plain text; what it leaves to the
wrapper is what transformers' slow tokenizers (and PaddleFormers' `Ernie4_5Tokenizer`) add:

- Added and special tokens (`<|begin_of_sentence|>`, `<think>`, ...) are never split: the text
  is cut at every occurrence of one (longest first), each plain segment is encoded by
  SentencePiece on its own, and the token keeps its one id.
- Decoding restarts SentencePiece at every added or special token and writes the token's text
  literally, unless it is special and `skip_special_tokens` is set. Control pieces of the model
  (`<s>`, `</s>`) count as special.
- Incomplete UTF-8 from byte-fallback pieces decodes to U+FFFD, which the engine's incremental
  detokenizer holds back, so streamed Chinese text never shows broken characters.

`build_sentencepiece_tokenizer` reads `tokenizer.model`, `tokenizer_config.json`,
`special_tokens_map.json` and `added_tokens.json` the way transformers does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from fastdeploy.errors import InvalidArgumentError, UnsupportedModelError
from fastdeploy.input.hf_tokenizer import _chat_templates, _config_eos_ids, _read_json, _token_content
from fastdeploy.input.tokenizer import Tokenizer, require_text
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: special-token attributes of tokenizer_config.json, as transformers names them
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "cls_token",
    "sep_token",
    "mask_token",
)


@dataclass
class TokenizerFiles:
    """What a tokenizer directory's JSON files say, merged with transformers' precedence."""

    #: attribute name (bos_token, ...) -> token text
    special_tokens: dict[str, str] = field(default_factory=dict)
    additional_special_tokens: list[str] = field(default_factory=list)
    #: token text -> (id or None to look up / assign, special)
    added_tokens: dict[str, tuple[int | None, bool]] = field(default_factory=dict)
    add_bos_token: bool | None = None
    add_eos_token: bool = False
    tokenizer_class: str | None = None
    chat_template: str | None = None
    named_chat_templates: dict[str, str] = field(default_factory=dict)
    config_eos_ids: list[int] = field(default_factory=list)


def read_tokenizer_files(model_path: str, vocab_size_hint: int = 1 << 31) -> TokenizerFiles:
    """Read tokenizer_config.json, special_tokens_map.json and added_tokens.json of a directory."""
    config = _read_json(model_path, "tokenizer_config.json")
    files = TokenizerFiles()
    for name in SPECIAL_TOKEN_NAMES:
        content = _token_content(config.get(name))
        if content is not None:
            files.special_tokens[name] = content
    files.additional_special_tokens = _token_list(config.get("additional_special_tokens"))
    special_map = _read_json(model_path, "special_tokens_map.json")
    for name in SPECIAL_TOKEN_NAMES:
        content = _token_content(special_map.get(name))
        if content is not None:
            files.special_tokens[name] = content
    for token in _token_list(special_map.get("additional_special_tokens")):
        if token not in files.additional_special_tokens:
            files.additional_special_tokens.append(token)
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for key, entry in decoder.items():
            content = _token_content(entry)
            if content is None or not str(key).isdigit():
                continue
            special = bool(entry.get("special", False)) if isinstance(entry, dict) else False
            files.added_tokens[content] = (int(key), special)
    for content, token_id in _read_json(model_path, "added_tokens.json").items():
        if isinstance(token_id, int) and content not in files.added_tokens:
            files.added_tokens[content] = (token_id, False)
    add_bos = config.get("add_bos_token")
    files.add_bos_token = add_bos if isinstance(add_bos, bool) else None
    files.add_eos_token = bool(config.get("add_eos_token", False))
    tokenizer_class = config.get("tokenizer_class")
    files.tokenizer_class = tokenizer_class if isinstance(tokenizer_class, str) else None
    files.chat_template, files.named_chat_templates = _chat_templates(model_path, config)
    files.config_eos_ids = _config_eos_ids(model_path, vocab_size_hint)
    return files


def _token_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [content for item in value if (content := _token_content(item)) is not None]


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece with never-split added tokens; see the module docstring for the rules."""

    def __init__(
        self,
        model_proto: bytes,
        *,
        special_tokens: Mapping[str, str] | None = None,
        additional_special_tokens: Iterable[str] = (),
        added_tokens: Mapping[str, tuple[int | None, bool]] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: str | None = None,
        named_chat_templates: Mapping[str, str] | None = None,
        optional_added_tokens: Iterable[str] = (),
    ) -> None:
        """`optional_added_tokens` become never-split tokens only where the model has them as pieces."""
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(model_proto)
        except (RuntimeError, TypeError) as exc:
            raise UnsupportedModelError(f"not a SentencePiece model: {exc}") from exc
        self._sp_size = self._sp.GetPieceSize()
        self.special_tokens = dict(special_tokens or {})
        self._ids: dict[str, int] = {}  # never-split token text -> id
        self._texts: dict[int, str] = {}  # id -> text, for ids outside the SentencePiece model
        special_texts = set(self.special_tokens.values()) | set(additional_special_tokens)
        next_id = (
            max([self._sp_size - 1, *(i for i, _ in (added_tokens or {}).values() if i is not None)]) + 1
        )
        specials: set[int] = {i for i in range(self._sp_size) if self._sp.IsControl(i)}
        requested = dict(added_tokens or {})
        for text in sorted(special_texts - set(requested)):
            requested[text] = (None, True)
        for text in optional_added_tokens:
            if text not in requested and self._piece_id(text) is not None:
                requested[text] = (None, False)
        for text, (token_id, special) in requested.items():
            if token_id is None:
                token_id = self._piece_id(text)
            if token_id is None:
                token_id = next_id
                next_id += 1
                logger.info("added token %r is not in the SentencePiece model; it gets id %d", text, token_id)
            self._ids[text] = token_id
            if token_id >= self._sp_size or self._sp.IdToPiece(token_id) != text:
                self._texts[token_id] = text
            if special or text in special_texts:
                specials.add(token_id)
        self._vocab_size = max([self._sp_size - 1, *self._ids.values()]) + 1
        self.special_token_ids = frozenset(specials)
        self.bos_token_id = self._named_id("bos_token")
        self.eos_token_id = self._named_id("eos_token")
        self.unk_token_id = self._named_id("unk_token")
        self.pad_token_id = self._named_id("pad_token")
        end_ids = {int(i) for i in extra_eos_token_ids if 0 <= int(i) < self._vocab_size}
        if self.eos_token_id is not None:
            end_ids.add(self.eos_token_id)
        self.eos_token_ids = frozenset(end_ids)
        if add_bos_token and self.bos_token_id is None:
            raise InvalidArgumentError("add_bos_token=True needs a bos_token; the tokenizer files name none")
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token and self.eos_token_id is not None
        self.chat_template = chat_template
        self.named_chat_templates = dict(named_chat_templates or {})
        ordered = sorted(self._ids, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(t) for t in ordered) + ")") if ordered else None

    def _piece_id(self, text: str) -> int | None:
        """Id of `text` as one piece of the SentencePiece model, or None."""
        token_id = self._sp.PieceToId(text)
        if token_id == self._sp.unk_id() and text != self._sp.IdToPiece(token_id):
            return None
        return token_id

    def _named_id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return self._ids.get(text) if text is not None else None

    @classmethod
    def complete_files(cls, files: TokenizerFiles) -> None:
        """Fill in what a model family's tokenizer files leave to its tokenizer class (none here)."""

    # --- the Tokenizer interface ------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        require_text(text)
        ids: list[int] = []
        for segment in self._split.split(text) if self._split is not None else [text]:
            if not segment:
                continue
            token_id = self._ids.get(segment)
            if token_id is not None:
                ids.append(token_id)
            else:
                ids.extend(self._sp.EncodeAsIds(segment))
        if add_special_tokens:
            if self.add_bos_token:
                ids.insert(0, self.bos_token_id)
            if self.add_eos_token:
                ids.append(self.eos_token_id)
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        pieces: list[str] = []
        run: list[int] = []
        for token_id in token_ids:
            token_id = int(token_id)
            text = self._texts.get(token_id)
            if text is None and token_id in self.special_token_ids:
                text = self._sp.IdToPiece(token_id)
            if text is None:
                # ids past the model's pieces with no added token (a padded embedding table's
                # rows) have no text; a model that samples one must not stop the engine
                if 0 <= token_id < self._sp_size:
                    run.append(token_id)
                continue
            if run:
                pieces.append(self._sp.DecodeIds(run))
                run = []
            if not (skip_special_tokens and token_id in self.special_token_ids):
                pieces.append(text)
        if run:
            pieces.append(self._sp.DecodeIds(run))
        return "".join(pieces)

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < self._vocab_size:
            return None
        if token_id in self._texts:
            return self._texts[token_id]
        return self._sp.IdToPiece(token_id) if token_id < self._sp_size else None

    def token_to_id(self, token: str) -> int | None:
        """Id of an added token or a SentencePiece piece, or None."""
        return self._ids.get(token, self._piece_id(token))

    def template_special_tokens(self) -> dict[str, str]:
        return dict(self.special_tokens)

    # --- transformers-style conveniences ---------------------------------------------------
    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """{"input_ids": ...}, as transformers' and PaddleFormers' tokenizers return."""
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def tokenize(self, text: str) -> list[str]:
        """The pieces `encode` would produce (added tokens whole)."""
        return [self.id_to_token(token_id) or "" for token_id in self.encode(text, add_special_tokens=False)]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self.token_to_id(tokens)
        return [self.token_to_id(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | None | list[str | None]:
        if isinstance(ids, int):
            return self.id_to_token(ids)
        return [self.id_to_token(int(token_id)) for token_id in ids]

    @cached_property
    def _vocab(self) -> dict[str, int]:
        vocab = {self._sp.IdToPiece(i): i for i in range(self._sp_size)}
        vocab.update(self._ids)
        return vocab

    def get_vocab(self) -> dict[str, int]:
        """Piece -> id for the whole vocabulary, added tokens included."""
        return dict(self._vocab)

    def __len__(self) -> int:
        return self._vocab_size

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self._vocab_size}, bos={self.bos_token_id}, "
            f"eos={sorted(self.eos_token_ids)}, added={len(self._texts)})"
        )


def read_model_proto(model_path: str) -> bytes:
    """The bytes of `<dir>/tokenizer.model`."""
    path = os.path.join(model_path, "tokenizer.model")
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise UnsupportedModelError(f"cannot read {path}: {exc}") from exc


def build_sentencepiece_tokenizer(
    model_path: str, cls: type[SentencePieceTokenizer] = SentencePieceTokenizer
) -> Any:
    """A tokenizer of class `cls` from a directory with tokenizer.model and the JSON files."""
    files = read_tokenizer_files(model_path)
    cls.complete_files(files)
    return cls(
        read_model_proto(model_path),
        special_tokens=files.special_tokens,
        additional_special_tokens=files.additional_special_tokens,
        added_tokens=files.added_tokens,
        extra_eos_token_ids=files.config_eos_ids,
        add_bos_token=bool(files.add_bos_token),
        add_eos_token=files.add_eos_token,
        chat_template=files.chat_template,
        named_chat_templates=files.named_chat_templates,
    )
