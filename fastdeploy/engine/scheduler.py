"""Continuous batching under a token budget, with chunked prefill and preemption by recompute.

Each step fills a budget of `max_num_batched_tokens`: running sequences first (decodes cost one
token, unfinished prefills continue in chunks), then waiting sequences in arrival order while
slots (`max_num_seqs`) and KV blocks last. Prefill and decode are treated alike: a sequence
simply asks for `num_tokens - num_computed_tokens` tokens. When KV blocks run out, the newest
running sequence is preempted: its blocks are freed and it waits at the head of the queue to be
recomputed later (prompt plus the tokens it already generated), so no request is ever dropped.

Two features add rows to a sequence's pass, and the scheduler asks them: speculative decoding
(`drafts`, the tokens proposed to follow a sequence, by sequence id) and prompt logprobs
(`prompt_scoring`, which prompt positions a sequence still scores). Both travel in the batch
(`ScheduledBatch.drafts` / `.scored`), not on the sequence. Sequences of steps still being
computed (pipeline parallelism) are in `in_flight`: they are neither scheduled nor preempted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import MutableMapping
from typing import Protocol

from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.prefix_cache_stats import PrefixCacheStats
from fastdeploy.engine.sequence import Sequence, SequenceStatus
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch

logger = get_logger(__name__)

#: the most prompt tokens a sequence collecting prompt logprobs computes per pass: the pass hands
#: back the logits of each of them ([tokens, vocab]), so its chunks are bounded
PROMPT_LOGPROBS_CHUNK = 512


class PromptScoring(Protocol):
    """Which prompt positions a sequence still scores (the prompt-logprobs feature)."""

    def scoring_range(self, seq: Sequence) -> tuple[int, int] | None:
        """Positions [first, last) whose logits are still to be read, or None when none are."""


class NoScoring:
    """No sequence scores its prompt."""

    @staticmethod
    def scoring_range(seq: Sequence) -> tuple[int, int] | None:
        return None


class Seats(Protocol):
    """How many of the `max_num_seqs` seats sequences take (beam search counts a search as its width)."""

    def seats_needed(self, seq: Sequence) -> int:
        """Seats a waiting sequence takes when it is admitted."""

    def seats_in_use(self, running: list[Sequence]) -> int:
        """Seats the running sequences take."""


class OneSeatEach:
    """Every sequence takes one seat."""

    @staticmethod
    def seats_needed(seq: Sequence) -> int:
        return 1

    @staticmethod
    def seats_in_use(running: list[Sequence]) -> int:
        return len(running)


class Scheduler:
    """Decides, every step, which sequences run and with how many tokens."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        seats: Seats | None = None,
        max_loras: int | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.seats: Seats = seats or OneSeatEach()
        self.prefix_cache_stats = PrefixCacheStats()
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        #: most LoRA adapters one pass may use (the resident slots); None: no adapters
        self.max_loras = max_loras
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        #: draft tokens by sequence id, owned by the speculative decoder (shortened here when the
        #: budget or the KV blocks do not fit them all)
        self.drafts: MutableMapping[int, list[int]] = {}
        self.prompt_scoring: PromptScoring = NoScoring()
        #: sequences whose pass is still being computed (pipeline parallelism)
        self.in_flight: set[Sequence] = set()

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
        self.drafts.pop(seq.seq_id, None)
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
        adapters: set[int] = set()
        in_flight = self.in_flight
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or seq in in_flight:
                continue  # preempted earlier in this loop, or still being computed
            pending = len(seq.token_ids) - seq.num_computed_tokens
            if pending == 0:
                continue  # a beam that already delivered its logits waits for its siblings
            if not self._adapter_fits(seq, adapters):
                continue  # its adapter waits for a slot: a later step runs it
            num_new = min(pending, budget)
            drafts = self.drafts.get(seq.seq_id)
            scored = None
            if drafts:
                if not self.block_manager.can_allocate(seq, pending + len(drafts)):
                    drafts.clear()  # speculation never preempts anyone
                num_new = min(pending + len(drafts), budget)
                del drafts[max(0, num_new - pending) :]
            else:
                scored = self.prompt_scoring.scoring_range(seq)
                if scored:
                    num_new = min(num_new, PROMPT_LOGPROBS_CHUNK)
            # most steps a decode fits in its last block: nothing to allocate, nobody to preempt
            if self.block_manager.extra_blocks_needed(seq, num_new):
                # rechecked after each preemption: a preempted beam sibling can unshare `seq`'s block
                while not self.block_manager.can_allocate(seq, num_new):
                    # the newest running sequence not in flight (at worst `seq` itself)
                    victim = next(other for other in reversed(self.running) if other not in in_flight)
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
                if seq.status is not SequenceStatus.RUNNING or not self._allocate(seq, num_new, batch):
                    continue
            batch.add(seq, num_new, drafts, scored)
            budget -= num_new
        seats = self.seats.seats_in_use(self.running) if self.waiting else 0
        while self.waiting and budget > 0 and not preempted:
            seq = self.waiting[0]
            needed = self.seats.seats_needed(seq)
            if seats + needed > self.max_num_seqs or not self._adapter_fits(seq, adapters):
                break
            # prompt tokens served from the cache have no logits to score them with
            scored = self.prompt_scoring.scoring_range(seq)
            cached = 0 if scored else self.block_manager.reuse_cached_prefix(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if scored:
                num_new = min(num_new, PROMPT_LOGPROBS_CHUNK)
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
            batch.add(seq, num_new, scored=scored)
            budget -= num_new
        batch.block_copies = self.block_manager.take_pending_copies()
        batch.kv_groups = self.block_manager.batch_groups(batch.seqs)
        return batch

    def _adapter_fits(self, seq: Sequence, adapters: set[int]) -> bool:
        """Whether `seq`'s LoRA adapter can join this pass's `adapters` (at most `max_loras`);
        if so it is counted in."""
        if seq.lora is None:
            return True
        key = seq.lora.lora_int_id
        if key not in adapters:
            if self.max_loras is not None and len(adapters) >= self.max_loras:
                return False
            adapters.add(key)
        return True

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
