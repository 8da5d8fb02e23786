"""Continuous batching under a token budget, with chunked prefill and preemption by recompute.

Each step fills a budget of `max_num_batched_tokens`: running sequences first (decodes cost one
token, unfinished prefills continue in chunks), then waiting sequences in arrival order while
slots (`max_num_seqs`) and KV blocks last. Prefill and decode are treated alike: a sequence
simply asks for `num_tokens - num_computed_tokens` tokens. When KV blocks run out, the newest
running sequence is preempted: its blocks are freed and it waits at the head of the queue to be
recomputed later (prompt plus the tokens it already generated), so no request is ever dropped.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.prefix_cache_stats import PrefixCacheStats
from fastdeploy.engine.sequence import Sequence, SequenceStatus
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: the most prompt tokens a sequence collecting prompt logprobs computes per pass: the pass hands
#: back the logits of each of them ([tokens, vocab])
PROMPT_LOGPROBS_CHUNK = 512


def _token_cap(seq: Sequence) -> int:
    """The most tokens `seq` may compute in one pass: a sequence scoring its prompt
    (`prompt_logprobs`) needs the logits of each prompt token back, so its chunks are bounded."""
    return PROMPT_LOGPROBS_CHUNK if seq.collects_prompt_logprobs else sys.maxsize


@dataclass
class ScheduledBatch:
    """The sequences of one forward pass and how many new tokens each computes."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    #: sequences whose KV blocks could not be allocated, with the error (their requests fail)
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)
    #: (source, destination) KV block copies to make before the pass (copy-on-write of forked beams)
    block_copies: list[tuple[int, int]] = field(default_factory=list)

    def add(self, seq: Sequence, num_tokens: int) -> None:
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


class Scheduler:
    """Decides, every step, which sequences run and with how many tokens."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.block_manager = block_manager
        self.prefix_cache_stats = PrefixCacheStats()
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def add_fork(self, child: Sequence, parent: Sequence) -> None:
        """Queue a sequence forked from `parent` (a beam) beside it: running if the parent runs."""
        child.status = parent.status
        if parent.status is SequenceStatus.RUNNING:
            self.running.append(child)
        else:
            self.waiting.appendleft(child)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        logger.info(
            "preempted request %s (sample %d) for lack of KV blocks; it will be recomputed",
            seq.request_id,
            seq.sample_index,
        )

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted = False
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or seq.in_flight:
                continue  # preempted earlier in this loop, or still being computed
            pending = len(seq.token_ids) - seq.num_computed_tokens
            if pending == 0:
                continue  # a beam that already delivered its logits waits for its siblings
            num_new = min(pending, budget)
            drafts = seq.draft_token_ids
            if drafts:
                if not self.block_manager.can_allocate(seq, pending + len(drafts)):
                    drafts.clear()  # speculation never preempts anyone
                num_new = min(pending + len(drafts), budget)
                del drafts[max(0, num_new - pending) :]
            elif seq.prompt_logprobs is not None:
                num_new = min(num_new, _token_cap(seq))
            # most steps a decode fits in its last block: nothing to allocate, nobody to preempt
            if self.block_manager.extra_blocks_needed(seq, num_new):
                # rechecked after each preemption: a preempted beam sibling can unshare `seq`'s block
                while not self.block_manager.can_allocate(seq, num_new):
                    # the newest running sequence not in flight (at worst `seq` itself)
                    victim = next(other for other in reversed(self.running) if not other.in_flight)
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
                if seq.status is not SequenceStatus.RUNNING or not self._allocate(seq, num_new, batch):
                    continue
            batch.add(seq, num_new)
            budget -= num_new
        seats = self._seats_in_use() if self.waiting else 0
        while self.waiting and budget > 0 and not preempted:
            seq = self.waiting[0]
            search = seq.beam_search
            joins_running_search = search is not None and any(
                beam.status is SequenceStatus.RUNNING for beam in search.beams
            )
            needed = 0 if joins_running_search else (search.width if search is not None else 1)
            if seats + needed > self.max_num_seqs:
                break
            # prompt tokens served from the cache have no logits to score them with
            cached = 0 if seq.collects_prompt_logprobs else self.block_manager.reuse_cached_prefix(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget, _token_cap(seq))
            if not self.block_manager.can_allocate(seq, num_new):
                self.block_manager.free(seq)
                seq.num_computed_tokens = 0
                break
            if seq.first_scheduled_time is None:
                seq.num_cached_tokens = cached
                if self.block_manager.enable_prefix_caching:
                    self.prefix_cache_stats.record(seq.num_tokens, cached)
            self.waiting.popleft()
            if not self._allocate(seq, num_new, batch):
                continue
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.time()
            self.running.append(seq)
            seats += needed
            batch.add(seq, num_new)
            budget -= num_new
        batch.block_copies = self.block_manager.take_pending_copies()
        return batch

    def _allocate(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        """Allocate `seq`'s blocks; a failure is put on `batch.failed` (its request alone fails)."""
        try:
            self.block_manager.allocate(seq, num_new)
        except Exception as exc:
            batch.failed.append((seq, exc))
            return False
        return True

    def _seats_in_use(self) -> int:
        """Running sequences, a beam search counting as its width (the beams it may fork)."""
        searches = {id(seq.beam_search): seq.beam_search.width for seq in self.running if seq.beam_search}
        return sum(seq.beam_search is None for seq in self.running) + sum(searches.values())

    def finish(self, seq: Sequence) -> None:
        """Release a sequence that finished or was aborted, wherever it is."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
