"""Paged KV-cache bookkeeping: which fixed-size blocks of cache slots each sequence owns.

With prefix caching, a block whose `block_size` tokens are all computed is registered under a
key made of its tokens and the identity of the block before it, so a later sequence with the
same prefix reuses the block instead of recomputing it. A freed cached block stays reusable
until it is evicted, least recently freed first, and only when no never-cached block is free.
Keys are exact (token tuples, not hashes): the parent is named by (block id, generation), and a
block's generation changes whenever it is handed out afresh, so a key whose parent block was
since reused for other tokens can never match.

Blocks are reference-counted, so several sequences can hold one: cached prefixes, and beams
forked from one another (`fork`), which share every block of their parent. A block is written
only at a sequence's next uncomputed position; when that position falls in a block another
sequence also holds (the partial last block of a fork), `allocate` gives the writer a fresh copy
first (copy-on-write) and queues the (source, destination) pair in `pending_copies`, which the
model runner applies to the KV cache before the forward pass that writes it. Full blocks are
never written again, so they stay shared for good.

With a sliding window (`window` > 0: a model whose every layer attends only to its last `window`
positions), `allocate` releases a sequence's leading blocks once no query of it can see them
again (one block of margin, for a pass still in flight). Their table entries stay, as aliases of
the first block it still holds (attention reads no position before the window, so the entry only
keeps the table's positions in place); `_released` counts them per sequence. A block is not
released while others share it, nor before prefix caching registered the block after it.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from fastdeploy.engine.sequence import Sequence
from fastdeploy.model_executor.batch import KVGroupPart

BlockKey = tuple  # (parent block id, parent generation, tokens[, content hashes of images in the block])
_ROOT = (-1, 0)


class BlockManager:
    """Hands out KV blocks of `block_size` token slots; a sequence's blocks form its block table."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False, window: int = 0
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        #: every layer's sliding window (0: none), past which leading blocks are released
        self.window = window
        #: seq_id -> leading table entries released (aliases), for sequences with any
        self._released: dict[int, int] = {}
        self.enable_prefix_caching = enable_prefix_caching
        self._free: deque[int] = deque(range(num_blocks))  # never cached, or evicted
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unused, LRU first
        self._ref_counts = [0] * num_blocks
        self._generation = [0] * num_blocks
        self._key_of: dict[int, BlockKey] = {}
        self._cached: dict[BlockKey, int] = {}
        #: (source block, destination block) KV copies owed before the next forward pass
        self.pending_copies: list[tuple[int, int]] = []
        #: imported partial last blocks of prompts (`import_prefix`), by key, each held here until
        #: the one sequence continuing that prompt takes it (`reuse_cached_prefix`) or `drop_partial`
        self._partials: dict[BlockKey, list[int]] = {}
        self._partial_key: dict[int, BlockKey] = {}

    def empty_copy(self, enable_prefix_caching: bool) -> BlockManager:
        """A manager of the same pool and window, all blocks free."""
        return BlockManager(self.num_blocks, self.block_size, enable_prefix_caching, self.window)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

    def usage(self) -> float:
        """Fraction of blocks in use by sequences."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def identity(self, block: int) -> tuple[int, int]:
        """(block, generation): names what `block` holds now (a prefix-cache key's parent)."""
        return block, self._generation[block]

    def ref_count(self, block: int) -> int:
        """How many sequences hold `block`."""
        return self._ref_counts[block]

    def _shared_write_block(self, seq: Sequence, num_new_tokens: int) -> int | None:
        """Index in `seq`'s block table of the block its next token goes into, if others hold it too."""
        index = seq.num_computed_tokens // self.block_size
        if num_new_tokens and index < len(seq.block_table) and self._ref_counts[seq.block_table[index]] > 1:
            return index
        return None

    def extra_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks `seq` must gain to hold `num_new_tokens` more computed tokens (a shared block it
        writes into counts: it gets its own copy)."""
        computed = seq.num_computed_tokens
        table = seq.block_table
        grow = -(-(computed + num_new_tokens) // self.block_size) - len(table)
        if grow < 0:
            grow = 0
        # `_shared_write_block` inline (this runs for every sequence every step)
        index = computed // self.block_size
        if index < len(table) and self._ref_counts[table[index]] > 1 and num_new_tokens:
            return grow + 1
        return grow

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.extra_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def _take_free_block(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self._key_of.pop(block)]
        self._ref_counts[block] = 1
        self._generation[block] += 1
        return block

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow `seq`'s block table, copying a shared block it writes into; the caller checked
        `can_allocate`."""
        shared = self._shared_write_block(seq, num_new_tokens)
        if shared is not None:
            source = seq.block_table[shared]
            copy = self._take_free_block()
            self._ref_counts[source] -= 1
            seq.block_table[shared] = copy
            self.pending_copies.append((source, copy))
        if self.window:
            self._release_behind_window(seq)
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())

    def _release_behind_window(self, seq: Sequence) -> None:
        """Release the leading blocks no query of `seq` from its next position on can see."""
        table = seq.block_table
        # the next query sees positions >= computed - window + 1; keep one block more
        stop = (seq.num_computed_tokens - self.window + 1) // self.block_size - 1
        if self.enable_prefix_caching:
            stop = min(stop, seq.num_registered_blocks - 1)  # keys name the block before them
        stop = min(stop, len(table) - 1)
        done = self._released.get(seq.seq_id, 0)
        index = done
        while index < stop and self._ref_counts[table[index]] == 1:
            self._release(table[index])
            index += 1
        if index > done:
            self._released[seq.seq_id] = index
            table[:index] = [table[index]] * index

    def truncate(self, seq: Sequence) -> None:
        """Release the blocks past `seq`'s computed tokens (speculative decoding's rejected drafts)."""
        keep = self.blocks_for(seq.num_computed_tokens)
        for block in seq.block_table[keep:]:
            self._release(block)
        del seq.block_table[keep:]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Make `child` hold exactly `parent`'s blocks (releasing its own); nothing is copied now."""
        released = self._released.get(parent.seq_id, 0)
        for block in parent.block_table[released:]:
            self._ref_counts[block] += 1
        self.free(child)
        if released:
            self._released[child.seq_id] = released
        child.block_table = list(parent.block_table)
        child.num_registered_blocks = parent.num_registered_blocks

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write pairs queued since the last call (the runner applies them)."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def batch_groups(self, seqs: list[Sequence]) -> list[KVGroupPart]:
        """The sliding KV-cache groups' side of a pass of `seqs`: none, one table serves every
        layer (`engine/kv_groups.py` has several)."""
        return []

    def free(self, seq: Sequence) -> None:
        """Release all of `seq`'s blocks (finished, aborted or preempted)."""
        for block in seq.block_table[self._released.pop(seq.seq_id, 0) :]:
            self._release(block)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def _release(self, block: int) -> None:
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            if block in self._key_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    # --- prefix caching ----------------------------------------------------------------------
    def _parent(self, seq: Sequence, index: int) -> tuple[int, int]:
        if index == 0:
            return _ROOT
        parent = seq.block_table[index - 1]
        return parent, self._generation[parent]

    def _key(self, seq: Sequence, index: int) -> BlockKey:
        start = index * self.block_size
        key = (*self._parent(seq, index), tuple(seq.token_ids[start : start + self.block_size]))
        if seq.extra_inputs is not None:  # images: equal placeholder tokens, different pixels
            key += (seq.extra_inputs.block_key(start, start + self.block_size),)
        if seq.lora is not None:  # an adapter's keys and values are its own
            key += (("lora", seq.lora.lora_int_id, seq.lora.lora_path),)
        return key

    def reuse_cached_prefix(self, seq: Sequence) -> int:
        """Give a fresh sequence the cached blocks of its longest cached prefix; returns its tokens.

        At least one token is always left to compute, so the pass that continues the sequence
        produces logits to sample from.
        """
        if not self.enable_prefix_caching or seq.block_table:
            return 0
        reusable_blocks = (seq.num_tokens - 1) // self.block_size
        for index in range(reusable_blocks):
            block = self._cached.get(self._key(seq, index))
            if block is None:
                break
            if self._ref_counts[block] == 0:
                del self._evictable[block]
            self._ref_counts[block] += 1
            seq.block_table.append(block)
        seq.num_registered_blocks = len(seq.block_table)
        seq.num_computed_tokens = len(seq.block_table) * self.block_size
        if self._partials and seq.num_registered_blocks == reusable_blocks and self._take_partial(seq):
            seq.num_computed_tokens = seq.num_tokens - 1
        return seq.num_computed_tokens

    def _take_partial(self, seq: Sequence) -> bool:
        """Give `seq` the imported partial block continuing its cached prefix up to its last token,
        if one waits: the block becomes `seq`'s own (it writes its next tokens there)."""
        if seq.extra_inputs is not None or seq.lora is not None:  # imported blocks carry neither
            return False
        start = seq.num_registered_blocks * self.block_size
        key = (
            *self._parent(seq, seq.num_registered_blocks),
            tuple(seq.token_ids[start : seq.num_tokens - 1]),
        )
        waiting = self._partials.get(key)
        if not waiting:
            return False
        block = waiting.pop()
        if not waiting:
            del self._partials[key]
        del self._partial_key[block]
        seq.block_table.append(block)
        return True

    def register_full_blocks(self, seq: Sequence) -> None:
        """Make the blocks `seq` has completely computed reusable by later sequences."""
        if not self.enable_prefix_caching:
            return
        computed, known = seq.num_computed_tokens, len(seq.token_ids)
        # computed positions past its tokens (accepted drafts, appended after the pass) wait
        full = (computed if computed < known else known) // self.block_size
        for index in range(seq.num_registered_blocks, full):
            block = seq.block_table[index]
            key = self._key(seq, index)
            if key not in self._cached and block not in self._key_of:
                self._cached[key] = block
                self._key_of[block] = key
        seq.num_registered_blocks = max(seq.num_registered_blocks, full)

    # --- blocks computed elsewhere (prefill/decode disaggregation) -----------------------------
    def cached_prefix(self, token_ids: list[int]) -> list[int]:
        """The cached blocks holding the longest whole-block prefix of `token_ids` (a text
        prompt's), in order. Only reads: a decode instance's transfer thread asks it to learn
        which blocks need not be sent, and a stale answer costs only a recomputation later."""
        if not self.enable_prefix_caching:
            return []
        chain: list[int] = []
        parent = _ROOT
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            block = self._cached.get((*parent, tuple(token_ids[start : start + self.block_size])))
            if block is None:
                break
            chain.append(block)
            parent = (block, self._generation[block])
        return chain

    def import_prefix(self, token_ids: list[int]) -> tuple[list[int], list[int]] | None:
        """Hold the blocks of `token_ids` (a text prompt's tokens before its last) computed elsewhere.

        The whole blocks enter the prefix cache: the cached prefix is reused, a fresh block is
        taken for each block after it and registered as if computed. A last partial block (the
        tokens past the whole blocks) gets a fresh block kept apart, for the one sequence whose
        prompt continues exactly so (`reuse_cached_prefix` hands it over whole, so that sequence
        computes only its last prompt token). The caller writes the fresh blocks' keys and values
        before any pass reads them. Returns (the whole blocks held, once each until
        `release_blocks`; the fresh blocks to write, the partial one last, held until taken or
        `drop_partial`); None if free blocks are too few."""
        chain = self.cached_prefix(token_ids)
        count = len(token_ids) // self.block_size
        tail = token_ids[count * self.block_size :]
        for block in chain:
            if self._ref_counts[block] == 0:
                del self._evictable[block]
            self._ref_counts[block] += 1
        # counted with the chain held: it is no longer free
        if count - len(chain) + (1 if tail else 0) > self.num_free_blocks:
            self.release_blocks(chain)
            return None
        fresh = []
        parent = (chain[-1], self._generation[chain[-1]]) if chain else _ROOT
        for index in range(len(chain), count):
            block = self._take_free_block()
            start = index * self.block_size
            key = (*parent, tuple(token_ids[start : start + self.block_size]))
            self._cached[key] = block
            self._key_of[block] = key
            fresh.append(block)
            parent = (block, self._generation[block])
        held = chain + fresh
        if tail:
            block = self._take_free_block()
            key = (*parent, tuple(tail))
            self._partials.setdefault(key, []).append(block)
            self._partial_key[block] = key
            fresh.append(block)
        return held, fresh

    def release_blocks(self, blocks: list[int]) -> None:
        """Give back blocks held by `import_prefix` (cached ones stay reusable)."""
        for block in blocks:
            self._release(block)

    def drop_partial(self, block: int) -> None:
        """Give back a partial block of `import_prefix` no sequence took (none once one took it)."""
        key = self._partial_key.pop(block, None)
        if key is None:
            return
        waiting = self._partials[key]
        waiting.remove(block)
        if not waiting:
            del self._partials[key]
        self._release(block)
