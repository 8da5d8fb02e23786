"""The most KV blocks one sequence held in each layer group of an engine while it ran (tests of
`engine/kv_groups.py` through `LLM`)."""

from __future__ import annotations

from fastdeploy import LLM
from fastdeploy.engine.kv_groups import GroupedBlockManager


def track_peaks(llm: LLM) -> list[int]:
    """A list, per KV-cache group, of the most blocks one sequence held there after any of its
    allocations since this call (its table's distinct blocks: entries behind a window alias one it
    holds); it fills as `llm` runs."""
    manager = llm.llm_engine.block_manager
    assert isinstance(manager, GroupedBlockManager)
    peaks = [0] * len(manager.managers)
    allocate = manager.allocate

    def tracked(seq, num_new_tokens: int) -> None:
        allocate(seq, num_new_tokens)
        tables = [seq.block_table] + [
            manager.group_table(group, seq).block_table for group in range(1, len(peaks))
        ]
        for group, table in enumerate(tables):
            peaks[group] = max(peaks[group], len(set(table)))

    manager.allocate = tracked  # type: ignore[method-assign]
    return peaks


def held_now(llm: LLM) -> list[int]:
    """Blocks each group holds now (0 everywhere once every request ended: nothing leaked)."""
    manager = llm.llm_engine.block_manager
    return [manager.held_blocks(group) for group in range(len(manager.managers))]
