"""LoRA adapters on the device contract (`Capability.LORA`): their data and how a pass is split.

An adapter adds `scale * (x @ A) @ B` to some linear layers' outputs. The resident adapters of a
layer's projection sit in one `LoRAStack`: slot s holds adapter s's A [in, rank] and B (its
scale folded in) [rank, out], zero-padded to the engine's largest rank (zeros add nothing). A
pass's rows each name a slot, or -1 for the base model; `segments_by_slot` groups them by slot, so
every adapter in the pass costs one shrink (x @ A) and one expand (@ B) over all its rows, as
Punica's and S-LoRA's segmented products do (SGMV: rows sorted by adapter, one product
per run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)
class LoRAStack:
    """One projection's adapters in their slots, from `Backend.lora_stack`: each slot's A [in,
    rank] and B [rank, out] in the backend's form (device arrays [slots, in, rank] and [slots,
    rank, out] on the cuda backend; one packed weight per slot on the cpu backend's kernels)."""

    a: Any
    b: Any


@dataclass(eq=False)
class LayerLoRA:
    """A decoder layer's adapter stacks by projection ("qkv", "o_proj", "gate_up", "down"; a
    projection no resident adapter targets is absent) and the pass's rows (`Backend.lora_rows`)."""

    stacks: dict[str, LoRAStack]
    rows: Any = field(default=None, repr=False)

    def add(self, ops: Any, name: str, y: Any, x: Any) -> Any:
        """`y` (the projection of `x`) plus each row's adapter delta, where one targets `name`."""
        stack = self.stacks.get(name)
        return y if stack is None else ops.add_lora(y, x, stack, self.rows)


@dataclass(frozen=True)
class LoRASegments:
    """A pass's rows with an adapter, grouped by slot: `rows` lists them (a slice when they are
    contiguous in slot order, else their indices), and each (slot, start, end) is a run of
    `rows` with one slot."""

    rows: slice | np.ndarray
    segments: tuple[tuple[int, int, int], ...]
    count: int


def segments_by_slot(token_slots: np.ndarray) -> LoRASegments:
    """The rows of `token_slots` [tokens] (-1: no adapter) grouped by slot, stably (rows of one
    sequence stay in order)."""
    rows = np.flatnonzero(token_slots >= 0)
    if not rows.size:
        return LoRASegments(slice(0, 0), (), 0)
    order = rows[np.argsort(token_slots[rows], kind="stable")]
    slots = token_slots[order]
    cuts = (np.flatnonzero(slots[1:] != slots[:-1]) + 1).tolist()
    starts, ends = [0, *cuts], [*cuts, order.size]
    runs = tuple((int(slots[start]), start, end) for start, end in zip(starts, ends, strict=True))
    first = int(order[0])
    contiguous = bool(np.array_equal(order, np.arange(first, first + order.size)))
    return LoRASegments(slice(first, first + order.size) if contiguous else order, runs, int(order.size))
