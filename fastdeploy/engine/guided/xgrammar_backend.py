"""The optional grammar backend: xgrammar (`pip install xgrammar`; it needs torch and transformers).

Chosen with `guided_decoding_backend="xgrammar"`. It compiles JSON schemas, regexes, Lark
grammars (xgrammar's `compile_lark`; llama.cpp GBNF with `root ::=` goes to its EBNF compiler)
and structural tags against a raw byte vocabulary built from our tokenizer, and fills the same
int32 bitmasks as llguidance (xgrammar's own layout is identical).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastdeploy.engine.guided.backend import GrammarBackend, GrammarMatcher, register_grammar_backend
from fastdeploy.engine.guided.params import GuidedDecodingError, GuidedDecodingParams
from fastdeploy.engine.guided.token_table import TokenTable
from fastdeploy.errors import BackendUnavailableError

#: the same whitespace bound as the llguidance backend's (runs of at most 24 characters)
MAX_WHITESPACE = 24


def _import_xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:
        raise BackendUnavailableError(
            f"guided_decoding_backend='xgrammar' needs the xgrammar package (pip install xgrammar): {exc}"
        ) from exc
    return xgrammar


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self._error: str | None = None

    def accept_token(self, token_id: int) -> bool:
        accepted = self.matcher.accept_token(int(token_id))
        if not accepted:
            self._error = f"token {token_id} is not allowed here"
        return accepted

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    @property
    def error(self) -> str | None:
        return self._error


@register_grammar_backend("xgrammar")
class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, table: TokenTable, disable_any_whitespace: bool = False) -> None:
        super().__init__(table, disable_any_whitespace)
        xgr = self.xgr = _import_xgrammar()
        vocab = [data if data is not None else b"" for data in table.token_bytes]
        info = xgr.TokenizerInfo(
            vocab, xgr.VocabType.RAW, vocab_size=table.vocab_size, stop_token_ids=table.eos_token_ids
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.batch = xgr.BatchGrammarMatcher()

    def _compile(self, params: GuidedDecodingParams) -> Any:
        kind, compiler = params.kind, self.compiler
        if kind == "json":
            flexible = not (params.disable_any_whitespace or self.disable_any_whitespace)
            return compiler.compile_json_schema(
                json.dumps(params.schema),
                any_whitespace=flexible,
                max_whitespace_cnt=MAX_WHITESPACE if flexible else None,
                strict_mode=False,
            )
        if kind == "json_object":
            return compiler.compile_json_schema('{"type": "object"}', max_whitespace_cnt=MAX_WHITESPACE)
        if kind == "regex":
            return compiler.compile_regex(params.regex)
        if kind == "choice":
            return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in params.choice))
        if kind == "grammar":
            if "::=" in params.grammar:
                return compiler.compile_grammar(params.grammar)
            return compiler.compile_lark(params.grammar)
        tag = params.structural_tag
        items = [
            self.xgr.StructuralTagItem(
                begin=item["begin"], schema=json.dumps(item.get("schema") or {}), end=item.get("end", "")
            )
            for item in tag["structures"]
        ]
        return compiler.compile_structural_tag(items, tag["triggers"])

    def compile(self, params: GuidedDecodingParams) -> Any:
        try:
            return self._compile(params)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GuidedDecodingError(params.kind, f"invalid {params.kind} for xgrammar: {exc}") from exc

    def matcher(self, compiled: Any) -> XGrammarMatcher:
        return XGrammarMatcher(self.xgr.GrammarMatcher(compiled))

    def fill_bitmasks(self, matchers: Sequence[GrammarMatcher], bitmask: np.ndarray) -> None:
        self.batch.batch_fill_next_token_bitmask([m.matcher for m in matchers], bitmask)  # type: ignore[attr-defined]
