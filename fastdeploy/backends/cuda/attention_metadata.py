"""Per-step attention metadata of the cuda backend's Triton kernels, built once on the host.

Every sequence of a step is either a decode (one query token: the split-KV kernel) or a prefill
chunk (several: the FlashAttention kernel, cut into query tiles). The arrays are small int32
vectors copied to the device once per step and shared by all layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.backends.base import BatchLayout


@dataclass
class HostAttentionMetadata:
    slot_mapping: np.ndarray  # [tokens] int64 (-1: padding, nothing written)
    block_tables: np.ndarray  # [seqs, max_blocks] int32
    seq_query_start: np.ndarray  # [seqs] int32: first token row of each sequence
    seq_query_len: np.ndarray  # [seqs] int32
    seq_context_len: np.ndarray  # [seqs] int32: cached positions after this step
    tile_seq: np.ndarray  # [tiles] int32: prefill tiles' sequence
    tile_offset: np.ndarray  # [tiles] int32: their first query within the sequence
    decode_token: np.ndarray  # [decodes] int32: token row of each decode
    decode_seq: np.ndarray  # [decodes] int32: its sequence
    max_context: int = 0


def build_host_metadata(layout: BatchLayout, tile_rows: int) -> HostAttentionMetadata:
    query_lens = layout.query_lens.astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(query_lens)[:-1]]).astype(np.int64)
    prefills = np.flatnonzero(query_lens > 1)
    decodes = np.flatnonzero(query_lens == 1)
    tiles_per_seq = -(-query_lens[prefills] // tile_rows)
    tile_seq = np.repeat(prefills, tiles_per_seq)
    tile_offset = np.concatenate([np.arange(n) * tile_rows for n in tiles_per_seq]) if prefills.size else []
    return HostAttentionMetadata(
        slot_mapping=layout.slot_mapping.astype(np.int64),
        block_tables=layout.block_tables.astype(np.int32),
        seq_query_start=starts.astype(np.int32),
        seq_query_len=query_lens.astype(np.int32),
        seq_context_len=layout.context_lens.astype(np.int32),
        tile_seq=tile_seq.astype(np.int32),
        tile_offset=np.asarray(tile_offset, dtype=np.int32),
        decode_token=starts[decodes].astype(np.int32),
        decode_seq=decodes.astype(np.int32),
        max_context=int(layout.context_lens.max()) if layout.context_lens.size else 0,
    )


@dataclass
class CudaBatch:
    """One step's metadata on the device (Triton kernels) or the reference kernels' split."""

    slot_mapping: Any
    block_size: int
    reference: Any = None
    block_tables: Any = None
    seq_query_start: Any = None
    seq_query_len: Any = None
    seq_context_len: Any = None
    tile_seq: Any = None
    tile_offset: Any = None
    decode_token: Any = None
    decode_seq: Any = None
    num_prefill_tiles: int = 0
    num_decodes: int = 0
    num_splits: int = 1
    #: split-KV scratch, allocated by the first layer and reused by the others
    scratch: dict[str, Any] = field(default_factory=dict)
    #: the host layout it came from (latent attention's prefill gathers by it); None in graphs
    layout: BatchLayout | None = None
