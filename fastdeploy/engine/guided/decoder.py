"""The engine's side of guided decoding: a matcher per sequence, masks prepared ahead, applied
to the constrained rows of each step's logits.

Timeline of one decode step `t` (engine thread | mask thread):

    schedule, forward pass t            | masks for step t (after step t-1's tokens)
    apply masks t  (waits for the thread)
    sample, append tokens, `advance`    -> starts the thread on the masks for step t+1

so a step's masks are computed while the model runs, and the engine waits only if they take
longer than the forward pass. The model's cpu kernels and llguidance both release the GIL.

A matcher follows its sequence's output tokens by count, not by event: before each mask it
consumes the tokens it has not seen, or rolls back the ones the sequence no longer has. So
preemption (recompute keeps the tokens), `n > 1` (one matcher per sample) and any future
engine step that rewinds tokens keep every matcher consistent with its sequence.

With a reasoning parser, a sequence whose request thinks is unconstrained until the
end-of-reasoning tokens appear in its output; the grammar starts right after them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.engine.guided import llguidance_backend, xgrammar_backend  # noqa: F401  (they register)
from fastdeploy.engine.guided.backend import (
    GrammarBackend,
    GrammarMatcher,
    bitmask_words,
    grammar_backend_class,
)
from fastdeploy.engine.guided.conflicts import conflict
from fastdeploy.engine.guided.params import GuidedDecodingError, GuidedDecodingParams
from fastdeploy.engine.guided.token_table import token_table
from fastdeploy.engine.sampler import BannedTokens
from fastdeploy.engine.sequence import Sequence
from fastdeploy.engine.step_feature import StepFeature
from fastdeploy.input.tokenizer import Tokenizer
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: compiled grammars kept for reuse (requests with the same schema compile once)
_CACHE_SIZE = 256


@dataclass
class _State:
    """One constrained sequence."""

    seq: Sequence
    matcher: GrammarMatcher
    #: output index where the grammar starts; None while the sequence is still reasoning
    start: int | None
    #: end-of-reasoning tokens to look for while `start` is None
    reasoning_end: list[int] = field(default_factory=list)
    #: output tokens already searched for `reasoning_end`
    searched: int = 0
    consumed: int = 0
    #: bitmask row for the position after `mask_for` consumed tokens
    mask: np.ndarray | None = None
    mask_for: int = -1
    #: why the grammar can no longer be followed (its request is then refused), or None
    failure: str | None = None

    def sync(self) -> bool:
        """Bring the matcher to the sequence's output; whether the grammar applies to the next token."""
        if self.failure is not None:
            return False
        outputs = self.seq.output_token_ids
        if self.start is None:
            self.start = _end_of(self.reasoning_end, outputs, self.searched)
            if self.start is None:
                self.searched = max(0, len(outputs) - len(self.reasoning_end) + 1)
                return False
        target = len(outputs) - self.start
        if self.consumed > target:
            self.matcher.rollback(self.consumed - target)
            self.consumed = target
        while self.consumed < target:
            token = outputs[self.start + self.consumed]
            if not self.matcher.accept_token(token):
                self.fail(f"token {token} is outside the grammar ({engine_error(self.matcher.error)})")
                return False
            self.consumed += 1
        return True

    def fail(self, why: str) -> None:
        self.failure = (
            f"guided decoding could not go on after {self.consumed} constrained tokens: {why}; the "
            "sample cannot be kept within its constraint (a grammar or choice list too complex?)"
        )
        logger.warning("request %s: %s", self.seq.request_id, self.failure)


def engine_error(error: str | None) -> str:
    """The line of a grammar engine's error that says what went wrong (llguidance's error text
    goes on with its parser state and the whole grammar, which may be megabytes)."""
    lines = (error or "unknown error").strip().splitlines()
    reason = next((line for line in lines if line.startswith("Error: ")), lines[0])
    return reason.removeprefix("Error: ")[:300]


def _end_of(marker: list[int], tokens: list[int], begin: int = 0) -> int | None:
    """Index just past the first occurrence of `marker` in `tokens[begin:]`, or None."""
    size = len(marker)
    for start in range(begin, len(tokens) - size + 1):
        if tokens[start : start + size] == marker:
            return start + size
    return None


class GuidedDecoder(StepFeature):
    """Compiles constraints (cached), tracks constrained sequences, and masks their logits.

    As a step feature: `mask` (= `apply`), `refusals` (= `conflicts`), `after_emit` (= `advance`)
    and `release` (= `discard` of each sample).

    The grammar backend is built on the first guided request (building llguidance's view of a
    50k-token vocabulary takes about half a second), so engines that never constrain pay nothing.
    """

    def __init__(
        self,
        backend_name: str,
        tokenizer: Tokenizer,
        vocab_size: int,
        eos_token_ids: list[int],
        reasoning_end: list[int] | None = None,
        disable_any_whitespace: bool = False,
    ) -> None:
        if backend_name != "off":
            grammar_backend_class(backend_name)  # an unknown name fails when the engine is built
        self.backend_name = backend_name
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.reasoning_end = reasoning_end or []
        self.disable_any_whitespace = disable_any_whitespace
        self._backend: GrammarBackend | None = None
        self._lock = threading.Lock()  # the server compiles on its event loop, the engine on its thread
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._states: dict[int, _State] = {}
        self._worker: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        #: row -> state of the rows the last `apply` masked
        self._masked: dict[int, _State] = {}
        #: row -> why, for the rows of the last `apply` whose grammar can no longer be followed
        self._failed: dict[int, str] = {}

    # --- compiling --------------------------------------------------------------------------
    @property
    def backend(self) -> GrammarBackend:
        if self._backend is None:
            table = token_table(self.tokenizer, self.vocab_size, self.eos_token_ids)
            cls = grammar_backend_class(self.backend_name)
            self._backend = cls(table, disable_any_whitespace=self.disable_any_whitespace)
            logger.info("guided decoding backend: %s", cls.name)
        return self._backend

    def compile(self, params: GuidedDecodingParams) -> Any:
        """The compiled grammar of `params`; `GuidedDecodingError` naming the field if invalid."""
        if self.backend_name == "off":
            raise GuidedDecodingError(
                params.kind,
                "guided decoding is off (guided_decoding_backend='off'); start the engine with "
                "guided_decoding_backend auto, llguidance or xgrammar",
            )
        key = params.cache_key()
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
            compiled = self.backend.compile(params)
            self._probe(params, compiled)
            self._compiled[key] = compiled
            if len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
            return compiled

    def _probe(self, params: GuidedDecodingParams, compiled: Any) -> None:
        """Refuse a constraint whose first token mask the grammar engine cannot compute (a choice
        list or regex past its limits), so the request fails with a 400 before it is queued."""
        matcher = self.backend.matcher(compiled)
        self.backend.fill_bitmasks([matcher], np.zeros((1, bitmask_words(self.vocab_size)), dtype=np.int32))
        if matcher.error is not None:
            raise GuidedDecodingError(
                params.kind, f"too complex for the grammar engine: {engine_error(matcher.error)}"
            )

    # --- sequences --------------------------------------------------------------------------
    def add(self, seq: Sequence, compiled: Any, thinking: bool) -> None:
        """Constrain `seq`; with `thinking`, only after its reasoning ends."""
        reasoning = thinking and bool(self.reasoning_end)
        self._states[seq.seq_id] = _State(
            seq,
            self.backend.matcher(compiled),
            start=None if reasoning else 0,
            reasoning_end=list(self.reasoning_end) if reasoning else [],
        )

    def discard(self, seq: Sequence) -> None:
        """Stop tracking `seq` (aborted)."""
        self._wait()
        self._states.pop(seq.seq_id, None)

    def grammar_complete(self, seq: Sequence) -> bool:
        """Whether `seq`'s grammar allows nothing but EOS now (min_tokens must not ban EOS then)."""
        state = self._states.get(seq.seq_id)
        return state is not None and state.start is not None and state.matcher.is_terminated()

    @property
    def active(self) -> bool:
        return bool(self._states)

    # --- step hooks ---------------------------------------------------------------------------
    def mask(self, backend: Any, rows: Any, seqs: list[Sequence]) -> Any:
        return self.apply(backend, rows, seqs)

    def refusals(self, bans: list[BannedTokens]) -> dict[int, str]:
        return self.conflicts(bans)

    def after_emit(self, emitted: list[Sequence], live: Mapping[str, Any]) -> list[str]:
        self.advance(emitted)
        return []

    def release(self, request_id: str, seqs: list[Sequence]) -> None:
        """Stop tracking the samples still tracked (finished ones were dropped by `advance`)."""
        for seq in seqs:
            if seq.seq_id in self._states:
                self.discard(seq)

    # --- masks ------------------------------------------------------------------------------
    def apply(self, device_backend: Any, logits: Any, seqs: list[Sequence]) -> Any:
        """Mask the rows of `logits` [len(seqs), vocab] whose sequences are constrained.

        Returns the logits (the backend may return a new array); unconstrained rows are untouched.
        """
        self._masked = {}
        self._failed = {}
        if not self._states:
            return logits
        self._wait()
        tracked = [(row, self._states.get(seq.seq_id)) for row, seq in enumerate(seqs)]
        tracked = [(row, state) for row, state in tracked if state is not None]
        synced = [(row, state) for row, state in tracked if state.sync()]
        self._fill([state for _, state in synced if state.mask_for != state.consumed])
        # a matcher may fail while syncing (a token it refuses) or while filling its mask
        self._failed = {row: state.failure for row, state in tracked if state.failure is not None}
        self._masked = {row: state for row, state in synced if state.failure is None}
        if not self._masked:
            return logits
        bitmask = np.stack([state.mask for state in self._masked.values()])
        rows = np.fromiter(self._masked, dtype=np.int64, count=len(self._masked))
        return device_backend.apply_token_bitmask(logits, bitmask, rows)

    def conflicts(self, bans: list[BannedTokens]) -> dict[int, str]:
        """Rows of the last `apply` whose grammar can no longer be followed, or whose bans leave
        none of the tokens their grammar allows (see `conflicts.py`), each with the message its
        request fails with."""
        found = dict(self._failed)
        for ban in bans:
            state = self._masked.get(ban.row)
            if state is None:
                continue
            why = conflict(state.mask, self.vocab_size, ban, len(state.seq.output_token_ids), self._spell)
            if why is not None:
                found[ban.row] = why
        return found

    def _spell(self, token: int) -> str:
        return repr(self.tokenizer.decode([token], skip_special_tokens=False))

    def advance(self, seqs: list[Sequence]) -> None:
        """After a step appended tokens: forget finished sequences and start preparing the next
        masks of the others on the mask thread."""
        if not self._states:
            return  # whatever dropped the last state waited for the mask thread first
        self._wait()
        for seq in seqs:
            if seq.is_finished or seq.finish_reason is not None:
                self._states.pop(seq.seq_id, None)
        pending = [self._states[seq.seq_id] for seq in seqs if seq.seq_id in self._states]
        if not pending:
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastdeploy-guided")
        self._pending = self._worker.submit(self._prepare, pending)

    def _prepare(self, states: list[_State]) -> None:
        self._fill([state for state in states if state.sync()])

    def _fill(self, states: list[_State]) -> None:
        if not states:
            return
        bitmask = np.zeros((len(states), bitmask_words(self.vocab_size)), dtype=np.int32)
        self.backend.fill_bitmasks([state.matcher for state in states], bitmask)
        for state, row in zip(states, bitmask, strict=True):
            state.mask, state.mask_for = row, state.consumed
            if state.matcher.error is not None:
                state.fail(f"its next-token mask failed ({engine_error(state.matcher.error)})")

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
