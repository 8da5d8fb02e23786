"""KV blocks per layer group: one pool and one block table per sequence for each group of layers
that attend over the same span (`CausalLM.kv_cache_groups`).

Where only some layers slide (Gemma 3's five sliding layers to one global, GPT-OSS's one to one),
a single table would keep every layer's blocks for the whole context. Here each group has its own
`BlockManager`: the whole-context group's (the first) keeps its table on the sequence as before,
and each sliding group's manager, created with the group's window, frees the blocks behind it as
it does where every layer slides. A sliding group's tables live on a `GroupTable` per sequence,
which shows the manager the sequence's tokens and progress beside the group's own table.

Every operation runs on every group; a sequence can grow only if every group has the blocks. A
prefix-cache hit is the whole-context group's, cut back where a sliding group no longer has the
blocks within its window of the cut (`SlidingGroupManager` keys its blocks by the whole-context
group's, so it needs nothing behind the window).
"""

from __future__ import annotations

from typing import Any

from fastdeploy.engine.block_manager import BlockKey, BlockManager
from fastdeploy.engine.sequence import Sequence
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.batch import KVGroupPart


class GroupTable:
    """A sequence as one sliding group's `BlockManager` sees it: the sequence's tokens and
    progress (read through), the group's own block table and registered-block count."""

    __slots__ = ("seq", "block_table", "num_registered_blocks", "num_computed_tokens")

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.block_table: list[int] = []
        self.num_registered_blocks = 0
        #: the sequence's, copied in before each call (the managers read and set it)
        self.num_computed_tokens = seq.num_computed_tokens

    @property
    def seq_id(self) -> int:
        return self.seq.seq_id

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.seq.token_ids)

    @property
    def extra_inputs(self) -> Any:
        return self.seq.extra_inputs

    @property
    def lora(self) -> Any:
        return self.seq.lora


#: a sliding group's prefix-cache key: the whole-context group's block at the same index
_SAME_AS = "whole-context block"


class SlidingGroupManager(BlockManager):
    """A sliding group's blocks (tables on `GroupTable`s). Its prefix-cache keys name the
    whole-context group's block at the same index (block id and generation, as a `BlockManager`
    key names its parent: that block's own key names every token up to its end), not the group's
    previous block. So a prefix hit needs here only the blocks within the window of where the
    sequence continues; the ones behind it may long have been evicted."""

    def __init__(
        self,
        primary: BlockManager,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        window: int,
    ) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching, window)
        self.primary = primary

    def _key(self, seq: Any, index: int) -> BlockKey:
        return (_SAME_AS, *self.primary.identity(seq.seq.block_table[index]))

    def cached_window(self, primary_blocks: list[int]) -> tuple[int, int, list[int]]:
        """(count, first, blocks): the longest prefix of `primary_blocks` (the whole-context
        group's hit) whose window is cached here, as its block count, the first block a sequence
        continuing after it reads, and the cached blocks from that one on. Only reads."""
        count = len(primary_blocks)
        while count:
            # as `_release_behind_window` leaves a table continuing at `count` blocks
            first = max(0, (count * self.block_size - self.window + 1) // self.block_size - 1)
            found = [
                self._cached.get((_SAME_AS, *self.primary.identity(b))) for b in primary_blocks[first:count]
            ]
            missing = [i for i, block in enumerate(found) if block is None]
            if not missing:
                return count, first, found  # type: ignore[return-value]
            count = first + missing[-1]
        return 0, 0, []

    def hold_window(self, view: GroupTable, first: int, blocks: list[int]) -> None:
        """Give a fresh sequence's table `blocks` (a `cached_window` answer) from index `first`
        on; the entries before alias the first, as released ones do."""
        for block in blocks:
            if self._ref_counts[block] == 0:
                del self._evictable[block]
            self._ref_counts[block] += 1
        view.block_table = [blocks[0]] * first + blocks if blocks else []
        if first:
            self._released[view.seq_id] = first
        view.num_registered_blocks = first + len(blocks)


class GroupedBlockManager:
    """The engine's block manager where layers keep KV in several groups (same interface as
    `BlockManager`; its counts are the first, whole-context group's)."""

    def __init__(
        self, counts: list[int], windows: list[int], block_size: int, enable_prefix_caching: bool = False
    ) -> None:
        if windows[0] or len(set(windows)) != len(windows):
            raise InvalidArgumentError(
                f"KV-cache groups need one whole-context group first and distinct windows, got windows {windows}"
            )
        self.primary = BlockManager(counts[0], block_size, enable_prefix_caching)
        #: one per group, the whole-context group first; the others' tables are `GroupTable`s
        self.managers: list[BlockManager] = [self.primary] + [
            SlidingGroupManager(self.primary, count, block_size, enable_prefix_caching, window)
            for count, window in zip(counts[1:], windows[1:], strict=True)
        ]
        self.block_size = self.primary.block_size
        self.enable_prefix_caching = self.primary.enable_prefix_caching
        #: per sliding group: seq_id -> its table there
        self._tables: list[dict[int, GroupTable]] = [{} for _ in windows[1:]]
        #: per sliding group: the copy-on-write pairs queued since the last call
        self.pending_group_copies: list[list[tuple[int, int]]] = [[] for _ in windows[1:]]

    @property
    def num_blocks(self) -> int:
        return self.primary.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.primary.num_free_blocks

    def usage(self) -> float:
        """The fullest group's fraction of blocks in use."""
        return max(manager.usage() for manager in self.managers)

    def blocks_for(self, num_tokens: int) -> int:
        return self.primary.blocks_for(num_tokens)

    def ref_count(self, block: int) -> int:
        return self.primary.ref_count(block)

    def group_table(self, group: int, seq: Sequence) -> GroupTable:
        """`seq`'s table in sliding group `group` (1-based, as in `managers`), synced to it."""
        tables = self._tables[group - 1]
        table = tables.get(seq.seq_id)
        if table is None or table.seq is not seq:
            table = tables[seq.seq_id] = GroupTable(seq)
        table.num_computed_tokens = seq.num_computed_tokens
        return table

    def _each(self, seq: Sequence) -> list[tuple[BlockManager, Any]]:
        """(manager, what it sees of `seq`) for every group."""
        return [(self.primary, seq)] + [
            (manager, self.group_table(group, seq)) for group, manager in enumerate(self.managers[1:], 1)
        ]

    def extra_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """The most blocks any one group needs (0: none needs any)."""
        return max(manager.extra_blocks_needed(view, num_new_tokens) for manager, view in self._each(seq))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return all(manager.can_allocate(view, num_new_tokens) for manager, view in self._each(seq))

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        for manager, view in self._each(seq):
            manager.allocate(view, num_new_tokens)
        for group, manager in enumerate(self.managers[1:]):
            self.pending_group_copies[group].extend(manager.take_pending_copies())

    def truncate(self, seq: Sequence) -> None:
        for manager, view in self._each(seq):
            manager.truncate(view)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for (manager, parent_view), (_, child_view) in zip(
            self._each(parent), self._each(child), strict=True
        ):
            manager.fork(parent_view, child_view)

    def take_pending_copies(self) -> list[tuple[int, int]]:
        return self.primary.take_pending_copies()

    def take_group_copies(self) -> list[list[tuple[int, int]]]:
        """Per sliding group, its copy-on-write pairs queued since the last call."""
        copies = self.pending_group_copies
        self.pending_group_copies = [[] for _ in self.managers[1:]]
        return copies

    def batch_groups(self, seqs: list[Sequence]) -> list[KVGroupPart]:
        """Each sliding group's tables of `seqs` (in their order) and the copies queued for it."""
        copies = self.take_group_copies()
        return [
            KVGroupPart([self.group_table(group, seq) for seq in seqs], copies[group - 1])
            for group in range(1, len(self.managers))
        ]

    def free(self, seq: Sequence) -> None:
        for manager, view in self._each(seq):
            manager.free(view)
        for tables in self._tables:
            tables.pop(seq.seq_id, None)

    def reuse_cached_prefix(self, seq: Sequence) -> int:
        """The whole-context group's cached prefix, cut back to the longest whose window every
        sliding group also has cached; 0 without caching."""
        if not self.enable_prefix_caching or seq.block_table:
            return 0
        count = self.primary.reuse_cached_prefix(seq) // self.block_size
        sliding: list[SlidingGroupManager] = self.managers[1:]  # type: ignore[assignment]
        windows: list[tuple[int, int, list[int]]] = []
        while len(windows) < len(sliding):  # until every group takes the same count
            windows = []
            for manager in sliding:
                found = manager.cached_window(seq.block_table[:count])
                if found[0] < count:
                    count = found[0]
                    break
                windows.append(found)
        if count < len(seq.block_table):
            self.primary.release_blocks(seq.block_table[count:])
            del seq.block_table[count:]
            seq.num_registered_blocks = count
        for group, (manager, (_, first, blocks)) in enumerate(zip(sliding, windows, strict=True), 1):
            manager.hold_window(self.group_table(group, seq), first, blocks)
        seq.num_computed_tokens = count * self.block_size
        return seq.num_computed_tokens

    def register_full_blocks(self, seq: Sequence) -> None:
        for manager, view in self._each(seq):
            manager.register_full_blocks(view)

    def held_blocks(self, group: int) -> int:
        """Blocks of group `group` (0: the whole-context one) in use."""
        manager = self.managers[group]
        return manager.num_blocks - manager.num_free_blocks

    def empty_copy(self, enable_prefix_caching: bool) -> GroupedBlockManager:
        """A manager of the same pools, all blocks free."""
        return GroupedBlockManager(
            [manager.num_blocks for manager in self.managers],
            [manager.window for manager in self.managers],
            self.block_size,
            enable_prefix_caching,
        )
