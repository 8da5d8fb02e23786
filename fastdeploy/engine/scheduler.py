"""Continuous batching under a token budget, with chunked prefill and preemption by recompute.

Each step fills a budget of `max_num_batched_tokens`: running sequences first (decodes cost one
token, unfinished prefills continue in chunks), then waiting sequences in arrival order while
slots (`max_num_seqs`) and KV blocks last. Prefill and decode are treated alike: a sequence
simply asks for `num_tokens - num_computed_tokens` tokens. When KV blocks run out, the newest
running sequence is preempted: its blocks are freed and it waits at the head of the queue to be
recomputed later (prompt plus the tokens it already generated), so no request is ever dropped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.prefix_cache_stats import PrefixCacheStats
from fastdeploy.engine.sequence import Sequence, SequenceStatus
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


@dataclass
class ScheduledBatch:
    """The sequences of one forward pass and how many new tokens each computes."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    #: sequences whose KV blocks could not be allocated, with the error (their requests fail)
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)

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

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
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
            num_new = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
            # most steps a decode fits in its last block: nothing to allocate, nobody to preempt
            extra_blocks = self.block_manager.extra_blocks_needed(seq, num_new)
            if extra_blocks:
                # preempting others never changes what `seq` needs; preempting `seq` ends the loop
                while extra_blocks > self.block_manager.num_free_blocks:
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
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            cached = self.block_manager.reuse_cached_prefix(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
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
            batch.add(seq, num_new)
            budget -= num_new
        return batch

    def _allocate(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        """Allocate `seq`'s blocks; a failure is put on `batch.failed` (its request alone fails)."""
        try:
            self.block_manager.allocate(seq, num_new)
        except Exception as exc:
            batch.failed.append((seq, exc))
            return False
        return True

    def finish(self, seq: Sequence) -> None:
        """Release a sequence that finished or was aborted, wherever it is."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
