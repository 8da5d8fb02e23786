"""The grammar-backend interface: compile a constraint once, track each sequence with a matcher,
and write token bitmasks.

A bitmask row has one bit per token id of the model's logits, packed little-endian into int32
words (`bitmask_words(vocab)` of them): bit `t % 32` of word `t // 32` is 1 when token `t` may
come next. EOS bits are set only where the grammar may end. Backends are chosen by name
(`auto`, `llguidance`, `xgrammar`); `auto` is llguidance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from fastdeploy.engine.guided.params import GuidedDecodingParams
from fastdeploy.engine.guided.token_table import TokenTable
from fastdeploy.errors import InvalidArgumentError


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


def allowed_tokens(row: np.ndarray, vocab_size: int) -> np.ndarray:
    """Boolean [vocab_size] array of the tokens a bitmask row allows."""
    bits = np.unpackbits(np.ascontiguousarray(row, dtype=np.int32).view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


class GrammarMatcher(ABC):
    """One sequence's position in its grammar."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and the matcher is then in error) if the grammar forbids it."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar is complete and allows nothing but EOS."""

    @property
    @abstractmethod
    def error(self) -> str | None:
        """Why the matcher stopped matching (a forbidden token), or None."""


class GrammarBackend(ABC):
    """Compiles constraints against one model's tokenizer; built once per engine, on first use."""

    name: ClassVar[str]

    def __init__(self, table: TokenTable, disable_any_whitespace: bool = False) -> None:
        self.vocab_size = table.vocab_size
        self.disable_any_whitespace = disable_any_whitespace

    @abstractmethod
    def compile(self, params: GuidedDecodingParams) -> Any:
        """The backend's compiled form of `params`; `GuidedDecodingError` naming the field if it is
        invalid (bad schema, unsupported keyword, bad regex, grammar syntax error)."""

    @abstractmethod
    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of `compiled`."""

    @abstractmethod
    def fill_bitmasks(self, matchers: Sequence[GrammarMatcher], bitmask: np.ndarray) -> None:
        """Write the next-token bitmask of `matchers[i]` into `bitmask[i]` (int32, C-contiguous).

        Called from a worker thread while the model runs; implementations release the GIL.
        """


#: guided_decoding_backend name -> backend class; the backend modules register themselves
#: (`register_grammar_backend`), and `guided/decoder.py` imports them
GRAMMAR_BACKENDS: dict[str, type[GrammarBackend]] = {}


def register_grammar_backend(*names: str) -> Callable[[type[GrammarBackend]], type[GrammarBackend]]:
    """Class decorator: choose the backend with `guided_decoding_backend=` any of `names`."""

    def register(cls: type[GrammarBackend]) -> type[GrammarBackend]:
        for name in names:
            GRAMMAR_BACKENDS[name] = cls
        return cls

    return register


def grammar_backend_class(name: str) -> type[GrammarBackend]:
    """The backend class for `guided_decoding_backend=name` (auto, llguidance, xgrammar)."""
    if name not in GRAMMAR_BACKENDS:
        raise InvalidArgumentError(
            f"guided_decoding_backend must be one of auto, llguidance, xgrammar, off; got {name!r}"
        )
    return GRAMMAR_BACKENDS[name]
