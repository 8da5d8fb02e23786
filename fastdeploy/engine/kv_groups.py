"""KV blocks per layer group: one pool and one block table per sequence for each group of layers
that attend over the same span (`CausalLM.kv_cache_groups`).

Where only some layers slide (Gemma 3's five sliding layers to one global, GPT-OSS's one to one),
a single table would keep every layer's blocks for the whole context. Here each group has its own
`BlockManager`: the whole-context group's (the first) keeps its table on the sequence as before,
and each sliding group's manager, created with the group's window, frees the blocks behind it as
it does where every layer slides. A sliding group's tables live on a `GroupTable` per sequence,
which shows the manager the sequence's tokens and progress beside the group's own table.

Every operation runs on every group; a sequence can grow only if every group has the blocks. A
prefix-cache hit is the shortest of the groups' hits (each group's chain of cached blocks is its
own, and a small sliding pool evicts sooner), the longer ones are cut back to it.
"""

from __future__ import annotations

from typing import Any

from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.sequence import Sequence
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


class GroupedBlockManager:
    """The engine's block manager where layers keep KV in several groups (same interface as
    `BlockManager`; its counts are the first, whole-context group's)."""

    def __init__(self, managers: list[BlockManager]) -> None:
        #: one per group, the whole-context group first; the others' tables are `GroupTable`s
        self.managers = managers
        self.primary = managers[0]
        self.block_size = self.primary.block_size
        self.enable_prefix_caching = self.primary.enable_prefix_caching
        #: per sliding group: seq_id -> its table there
        self._tables: list[dict[int, GroupTable]] = [{} for _ in managers[1:]]
        #: per sliding group: the copy-on-write pairs queued since the last call
        self.pending_group_copies: list[list[tuple[int, int]]] = [[] for _ in managers[1:]]

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
        """The shortest of the groups' cached prefixes (every group holds it); 0 without caching."""
        if not self.enable_prefix_caching or seq.block_table:
            return 0
        views = self._each(seq)
        hits = [manager.reuse_cached_prefix(view) for manager, view in views]
        shortest = min(hits)
        keep = shortest // self.block_size
        for (manager, view), hit in zip(views, hits, strict=True):
            if hit > shortest:
                manager.release_blocks(view.block_table[keep:])
                del view.block_table[keep:]
                view.num_registered_blocks = keep
        seq.num_computed_tokens = shortest
        return shortest

    def register_full_blocks(self, seq: Sequence) -> None:
        for manager, view in self._each(seq):
            manager.register_full_blocks(view)

    def held_blocks(self, group: int) -> int:
        """Blocks of group `group` (0: the whole-context one) in use."""
        manager = self.managers[group]
        return manager.num_blocks - manager.num_free_blocks

    def empty_copy(self, enable_prefix_caching: bool) -> GroupedBlockManager:
        """A manager of the same pools, all blocks free."""
        return GroupedBlockManager([manager.empty_copy(enable_prefix_caching) for manager in self.managers])
