"""What one forward pass runs: its sequences, how many new tokens each computes, and the rows
features add to it (drafts to verify, prompt positions to score).

The batch is the runner's input type, so it lives below the engine: the scheduler builds it, the
in-process runner and the rank processes lay it out. Its sequences are the engine's, read
through `BatchSequence` (the few attributes a layout needs); what a feature adds for one pass
travels in the batch, keyed by the sequence's index, so the sequence carries no feature state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fastdeploy.backends.types import SamplingRows


class BatchSequence(Protocol):
    """What the batch layout reads of a sequence (the engine's `Sequence`, a draft model's state,
    the fault isolation's probe)."""

    token_ids: list[int]
    num_computed_tokens: int
    block_table: list[int]
    #: what the model needs beyond token ids (a multimodal prompt), or None
    extra_inputs: Any
    #: the LoRA adapter it runs with (a `LoRARequest`), or None
    lora: Any


@dataclass
class KVGroupPart:
    """A sliding KV-cache group's side of one pass (`engine/kv_groups.py`): each sequence's block
    table there, in batch order (objects with a `block_table`), and the copy-on-write pairs of
    the group's pool."""

    tables: list[Any]
    copies: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class PassSampling:
    """How a pass may sample its rows itself (a runner with captured decode steps then reads one
    copy of token ids instead of the logits' reductions), set by the engine when every sequence
    needs only the argmax or temperature / top-k / top-p.

    Per batch sequence: `temperature` (0: greedy), `top_k` (0: off), `top_p`; `draw(indices)`
    draws one uniform for each given batch sequence from its own generator, as the engine's
    sampler would. The runner calls `rows` (which draws) only if it samples, and sets `tokens`
    (`PendingTokens`) when it did; otherwise the engine samples as usual.
    """

    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    draw: Callable[[list[int]], np.ndarray]
    tokens: Any = None
    #: what `rows` gave (the host needs the uniforms again for a row the device could not sample)
    drawn: SamplingRows | None = None

    def rows(self, indices: list[int]) -> SamplingRows:
        """The sampling rows of the batch sequences `indices` (in row order), uniforms drawn."""
        picked = np.asarray(indices, dtype=np.int64)
        temperature = self.temperature[picked]
        greedy = temperature == 0
        uniform = np.zeros(picked.size, np.float32)
        drawing = np.flatnonzero(~greedy)
        if drawing.size:
            uniform[drawing] = self.draw([indices[row] for row in drawing.tolist()])
        self.drawn = SamplingRows(greedy, temperature, self.top_k[picked], self.top_p[picked], uniform)
        return self.drawn


@dataclass
class ScheduledBatch:
    """The sequences of one forward pass and how many new tokens each computes."""

    seqs: list[Any] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    #: sequences whose KV blocks could not be allocated, with the error (their requests fail)
    failed: list[tuple[Any, Exception]] = field(default_factory=list)
    #: (source, destination) KV block copies to make before the pass (copy-on-write of forked beams)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    #: by index into `seqs`: tokens proposed to follow the sequence's tokens, verified by this pass
    #: (speculative decoding); they are part of its `num_new_tokens`
    drafts: dict[int, list[int]] = field(default_factory=dict)
    #: by index into `seqs`: the prompt positions [first, last) still to be scored (prompt
    #: logprobs); the pass returns the logits of those it computes, each scoring the next token
    scored: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: per sliding KV-cache group, its tables and copies (empty where every layer shares one table)
    kv_groups: list[KVGroupPart] = field(default_factory=list)
    #: the pass samples its rows itself, when the engine allows it (a part never does)
    sampling: PassSampling | None = None

    def add(
        self,
        seq: BatchSequence,
        num_tokens: int,
        drafts: list[int] | None = None,
        scored: tuple[int, int] | None = None,
    ) -> None:
        if drafts:
            self.drafts[len(self.seqs)] = drafts
        if scored is not None:
            self.scored[len(self.seqs)] = scored
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)

    def part(self, indices: Iterable[int]) -> ScheduledBatch:
        """The sequences at `indices` with their counts, and the block copies into their blocks.

        Only those copies: a part runs as a pass of its own (fault isolation), and copying again
        into another sequence's block after that one wrote its token there would undo the write.
        """
        part, indices = ScheduledBatch(), list(indices)
        for index in indices:
            part.add(
                self.seqs[index], self.num_new_tokens[index], self.drafts.get(index), self.scored.get(index)
            )
        part.block_copies = _owned_copies(self.block_copies, part.seqs)
        for group in self.kv_groups:
            tables = [group.tables[index] for index in indices]
            part.kv_groups.append(KVGroupPart(tables, _owned_copies(group.copies, tables)))
        return part

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __len__(self) -> int:
        return len(self.seqs)


def _owned_copies(copies: list[tuple[int, int]], tables: list[Any]) -> list[tuple[int, int]]:
    """The copies into blocks of `tables`."""
    if not copies:
        return []
    owned = {block for table in tables for block in table.block_table}
    return [pair for pair in copies if pair[1] in owned]
