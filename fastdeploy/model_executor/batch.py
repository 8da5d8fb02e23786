"""What one forward pass runs: its sequences and how many new tokens each computes.

The batch is the runner's input type, so it lives below the engine: the scheduler builds it, the
in-process runner and the rank processes lay it out. Its sequences are the engine's, read
through `BatchSequence` (the few attributes a layout needs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol


class BatchSequence(Protocol):
    """What the batch layout reads of a sequence (the engine's `Sequence`, a draft model's state,
    the fault isolation's probe)."""

    token_ids: list[int]
    num_computed_tokens: int
    block_table: list[int]
    #: tokens proposed to follow `token_ids` in this pass (speculative decoding), else empty
    draft_token_ids: list[int]
    #: per scored prompt token, its logprobs entry; None unless the sequence scores its prompt
    prompt_logprobs: list[Any] | None
    #: what the model needs beyond token ids (a multimodal prompt), or None
    extra_inputs: Any
    #: the LoRA adapter it runs with (a `LoRARequest`), or None
    lora: Any


@dataclass
class ScheduledBatch:
    """The sequences of one forward pass and how many new tokens each computes."""

    seqs: list[Any] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    #: sequences whose KV blocks could not be allocated, with the error (their requests fail)
    failed: list[tuple[Any, Exception]] = field(default_factory=list)
    #: (source, destination) KV block copies to make before the pass (copy-on-write of forked beams)
    block_copies: list[tuple[int, int]] = field(default_factory=list)

    def add(self, seq: BatchSequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)

    def part(self, indices: Iterable[int]) -> ScheduledBatch:
        """The sequences at `indices` with their counts, and the block copies into their blocks.

        Only those copies: a part runs as a pass of its own (fault isolation), and copying again
        into another sequence's block after that one wrote its token there would undo the write.
        """
        part = ScheduledBatch()
        for index in indices:
            part.add(self.seqs[index], self.num_new_tokens[index])
        if self.block_copies:
            owned = {block for seq in part.seqs for block in seq.block_table}
            part.block_copies = [pair for pair in self.block_copies if pair[1] in owned]
        return part

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __len__(self) -> int:
        return len(self.seqs)
