"""What a model needs to know about its place in a tensor x pipeline grid, and the collectives it calls.

A model built for one process gets `ModelParallel.single()`: every size is 1 and every collective
is the identity, so the one-process code path is unchanged. Worker processes build one from
their rank, the `ParallelLayout` and a `Communicator`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.parallel.communicator import Communicator
from fastdeploy.parallel.sharding import pad_rows, take_rows
from fastdeploy.parallel.topology import ParallelLayout, split_evenly

#: intermediate features are split in multiples of this (a GGUF block), where the size allows,
#: so a row-parallel GGUF matrix keeps its blocks
FEATURE_ALIGNMENT = 32


@dataclass
class ModelParallel:
    """This rank's coordinates and the groups its collectives run over."""

    layout: ParallelLayout = field(default_factory=ParallelLayout)
    rank: int = 0
    communicator: Communicator | None = None
    #: opaque group handle of this rank's tensor-parallel group
    tp_group: Any = None

    @classmethod
    def single(cls) -> ModelParallel:
        return cls()

    def connect(self, communicator: Communicator) -> None:
        """Use `communicator` from now on, creating every tensor-parallel group (a collective call
        on all ranks, in the same order) and keeping this rank's.

        Separate from construction so a rank can load its shard while its runtime starts.
        """
        for stage in range(self.layout.pipeline_parallel_size):
            group = communicator.new_group(self.layout.tp_group(stage))
            if stage == self.pp_rank:
                self.tp_group = group
        self.communicator = communicator

    # --- coordinates ----------------------------------------------------------------------
    @property
    def tp_size(self) -> int:
        return self.layout.tensor_parallel_size

    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank(self.rank)

    @property
    def pp_size(self) -> int:
        return self.layout.pipeline_parallel_size

    @property
    def pp_rank(self) -> int:
        return self.layout.pp_rank(self.rank)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def stage_layers(self, num_layers: int) -> range:
        return self.layout.stage_layers(num_layers, self.pp_rank)

    def feature_shard(self, size: int) -> range:
        """This rank's intermediate features, in whole GGUF blocks where `size` allows."""
        align = FEATURE_ALIGNMENT if size % (FEATURE_ALIGNMENT * self.tp_size) == 0 else 1
        units = self.shard_of(size // align)
        return range(units.start * align, units.stop * align)

    def shard_of(self, size: int) -> range:
        """This rank's part of `size` items split as evenly as possible."""
        return split_evenly(size, self.tp_size, self.tp_rank)

    def head_shard(self, num_heads: int) -> range:
        """The heads this rank computes; with fewer heads than ranks (KV heads), each head is
        replicated on `tp_size / num_heads` consecutive ranks."""
        if self.tp_size <= num_heads:
            return self.shard_of(num_heads)
        head = self.tp_rank // (self.tp_size // num_heads)
        return range(head, head + 1)

    # --- the vocabulary-parallel embedding and LM head ----------------------------------------
    def vocab_shard_size(self, vocab_size: int) -> int:
        """Rows of every rank's vocabulary shard (the last one is padded with zero rows)."""
        return -(-vocab_size // self.tp_size)

    def vocab_rows_of(self, tensor: Any) -> Any:
        """This rank's vocabulary rows of an embedding-shaped tensor (LM head, its bias), padded."""
        if self.tp_size == 1:
            return tensor
        size = self.vocab_shard_size(tensor.shape[0])
        first = min(self.tp_rank * size, tensor.shape[0])
        return pad_rows(take_rows(tensor, range(first, min(first + size, tensor.shape[0]))), size)

    def vocab_embedding_table(self, backend: Backend, table: Any) -> Any:
        """The device embedding table of this rank: its rows plus one zero row that ids of other
        ranks' shards look up."""
        if self.tp_size == 1:
            return backend.from_numpy(table)
        rows = self.vocab_rows_of(table)
        return backend.from_numpy(pad_rows(rows, rows.shape[0] + 1))

    def vocab_embedding(self, backend: Backend, token_ids: Any, table: Any) -> Any:
        """Embedding rows of `token_ids`: each rank looks up the ids of its shard (zero rows for
        the others) and the group's sum is the full embedding."""
        if self.tp_size == 1:
            return backend.embedding(token_ids, table)
        size = table.shape[0] - 1
        local = np.asarray(backend.to_numpy(token_ids), dtype=np.int64) - self.tp_rank * size
        local[(local < 0) | (local >= size)] = size
        return self.all_reduce(backend.embedding(backend.from_numpy(local), table))

    def gather_vocab(self, logits: Any, vocab_size: int) -> Any:
        """Full logits [rows, vocab] from every rank's shard [rows, shard size]."""
        if self.tp_size == 1:
            return logits
        return self.all_gather(logits)[:, :vocab_size]

    # --- collectives (identity in one process) ----------------------------------------------
    def all_reduce(self, x: Any) -> Any:
        """Sum of the tensor-parallel group's partial results (row-parallel layers)."""
        if self.tp_size == 1:
            return x
        return self.communicator.all_reduce(x, self.tp_group)

    def all_gather(self, x: Any) -> Any:
        """The group's column shards side by side (vocabulary-parallel logits)."""
        if self.tp_size == 1:
            return x
        return self.communicator.all_gather(x, self.tp_group)

    def send_to_next_stage(self, x: Any) -> None:
        """Hand activations to the same tensor-parallel rank of the next pipeline stage."""
        self.communicator.send(x, self.rank + self.tp_size)

    def recv_from_previous_stage(self, backend: Backend, shape: tuple[int, ...]) -> Any:
        """Activations of `shape` from the same tensor-parallel rank of the previous pipeline stage."""
        buffer = backend.from_numpy(np.zeros(shape, dtype=np.float32))
        return self.communicator.recv(buffer, self.rank - self.tp_size)
