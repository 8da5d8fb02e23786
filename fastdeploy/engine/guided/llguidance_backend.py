"""The default grammar backend: llguidance (Rust, CPU, no torch), as vLLM and SGLang use it.

llguidance compiles JSON schemas, regexes and Lark grammars (llama.cpp's GBNF is converted to
Lark) lazily against the tokenizer's token trie, so a new schema costs milliseconds, and it
computes a token bitmask in tens of microseconds per sequence with the GIL released. Invalid
input is reported by `validate_grammar_with_warnings` with the library's own message (for Lark,
with line and column), which we pass on under the request's field name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np

from fastdeploy.engine.guided.backend import GrammarBackend, GrammarMatcher, register_grammar_backend
from fastdeploy.engine.guided.params import GuidedDecodingError, GuidedDecodingParams
from fastdeploy.engine.guided.token_table import TokenTable
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: JSON whitespace between tokens: any, but at most 24 characters in a row. Unbounded whitespace
#: lets a small model loop on newlines until max_tokens (seen with SmolLM2 on array schemas);
#: 24 still fits pretty-printing several levels deep.
BOUNDED_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,24}"

#: what each constraint is called in error messages
_WHAT = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "structural_tag": "structural_tag",
}


#: how llguidance marks a special token in a byte table: a leading 0xFF (never valid UTF-8)
_SPECIAL_PREFIX = b"\xff"


class _Tokens:
    """The duck-typed tokenizer `llguidance.TokenizerWrapper` reads: token bytes and an encoder.

    llguidance encodes the bytes a grammar forces with it, so the ids must spell exactly the
    text. SentencePiece prepends a space to what it encodes ("-" becomes "▁-"); then the text is
    spelled greedily with the longest pieces instead.
    """

    def __init__(self, table: TokenTable) -> None:
        tokenizer = table.tokenizer
        self.tokens = [
            data if data is not None else _SPECIAL_PREFIX + (tokenizer.id_to_token(token_id) or "").encode()
            for token_id, data in enumerate(table.token_bytes)
        ]
        self.eos_token_id = table.eos_token_ids[0] if table.eos_token_ids else None
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = table.special_token_ids
        self._tokenizer = tokenizer
        self._ids = {data: token_id for token_id, data in enumerate(table.token_bytes) if data}
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: str) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        data = text.encode("utf-8")
        if b"".join(self.tokens[i] for i in ids if 0 <= i < len(self.tokens)) == data:
            return ids
        return self._greedy(data)

    def _greedy(self, data: bytes) -> list[int]:
        ids, pos = [], 0
        while pos < len(data):
            for size in range(min(self._longest, len(data) - pos), 0, -1):
                token_id = self._ids.get(data[pos : pos + size])
                if token_id is not None:
                    ids.append(token_id)
                    pos += size
                    break
            else:
                raise ValueError(f"no token spells byte {data[pos]:#04x}")
        return ids


def build_lltokenizer(table: TokenTable) -> llguidance.LLTokenizer:
    """llguidance's view of the model's tokenizer (about 0.5 s for a 50k vocabulary)."""
    eos = table.eos_token_ids or None
    if table.tokenizer_json is not None:
        return llguidance.LLTokenizer(table.tokenizer_json, n_vocab=table.vocab_size, eos_token=eos)
    wrapper = llguidance.TokenizerWrapper(_Tokens(table))
    return llguidance.LLTokenizer(wrapper, n_vocab=table.vocab_size, eos_token=eos)


class LLGuidanceMatcher(GrammarMatcher):
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.consume_token(int(token_id))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None


@register_grammar_backend("auto", "llguidance", "guidance")
class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"

    def __init__(self, table: TokenTable, disable_any_whitespace: bool = False) -> None:
        super().__init__(table, disable_any_whitespace)
        self.tokenizer = build_lltokenizer(table)
        #: one worker: the engine's mask thread is the only caller, and the model's kernels need the cores
        self.executor = llguidance.LLExecutor(num_threads=1)

    def _grammar(self, params: GuidedDecodingParams) -> str:
        kind = params.kind
        if kind in ("json", "json_object"):
            schema = params.schema if kind == "json" else {"type": "object"}
            flexible = not (params.disable_any_whitespace or self.disable_any_whitespace)
            options: dict[str, Any] = {"whitespace_flexible": flexible}
            if params.whitespace_pattern is not None or flexible:
                options["whitespace_pattern"] = params.whitespace_pattern or BOUNDED_WHITESPACE
            try:
                return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
            except ValueError as exc:
                raise GuidedDecodingError(kind, f"invalid JSON schema: {exc}") from exc
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(params.regex)
        if kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(item) for item in params.choice)
            )
        if kind == "grammar":
            try:
                return llguidance.grammar_from("grammar", params.grammar)
            except ValueError as exc:
                raise GuidedDecodingError(kind, f"grammar syntax error: {exc}") from exc
        return _structural_tag_grammar(params.structural_tag)

    def compile(self, params: GuidedDecodingParams) -> str:
        grammar = self._grammar(params)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise GuidedDecodingError(params.kind, f"invalid {_WHAT[params.kind]}: {messages[0].strip()}")
        for message in messages:
            logger.warning("guided decoding (%s): %s", params.kind, message)
        return grammar

    def matcher(self, compiled: str) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(llguidance.LLMatcher(self.tokenizer, compiled, log_level=0))

    def fill_bitmasks(self, matchers: Sequence[GrammarMatcher], bitmask: np.ndarray) -> None:
        pairs = [(matcher.matcher, index) for index, matcher in enumerate(matchers)]  # type: ignore[attr-defined]
        llguidance.numpy.fill_next_token_bitmask_par(self.executor, pairs, bitmask)


def _structural_tag_grammar(tag: dict[str, Any]) -> str:
    """Free text in which each structure's `begin` (opened by one of the triggers) is followed by
    JSON matching its `schema`, then its `end`."""
    tags = []
    for item in tag["structures"]:
        trigger = next(t for t in tag["triggers"] if item["begin"].startswith(t))
        tags.append(
            llguidance.StructTag(
                trigger=trigger,
                begin=item["begin"],
                grammar=item.get("schema") or {},
                end=item.get("end", ""),
            )
        )
    return llguidance.StructTag.to_grammar(tags)
