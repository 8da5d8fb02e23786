"""The logits one forward pass returned, and which sequence each row belongs to.

A pass returns a row per sampling sequence (`sampling` order), then the extra rows of
`model_runner.extra_logits_rows` (prompt tokens to score, drafts to verify). The logits stay
where the runner left them (on the device for an in-process runner; on the host from rank
processes, read with the engine's host cpu backend) until a reader asks for rows: the sampler for
the device, the decoding features for the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.model_runner import ExtraRows, extra_logits_rows


class PassLogits:
    """Row lookup into one pass's logits."""

    def __init__(self, logits: Any, backend: Backend, batch: ScheduledBatch, sampling: list[int]) -> None:
        self.logits = logits
        self.backend = backend
        self.batch = batch
        self.sampling = sampling
        #: sampling indices whose rows a feature decides itself (beams, drafts), not the sampler
        self._claimed: set[int] = set()
        self._sampling_row: dict[int, int] | None = None  # built on first use: plain passes need none
        self._extras = {extra.index: extra for extra in extra_logits_rows(batch, len(sampling))}

    def claim(self, indices: list[int]) -> None:
        """Take these sampling indices away from the sampler (a feature decides their tokens)."""
        self._claimed.update(indices)

    @property
    def plain(self) -> list[int]:
        """The sampling indices the sampler draws one token for: those no feature claimed."""
        if not self._claimed:
            return self.sampling
        return [index for index in self.sampling if index not in self._claimed]

    def sampling_row(self, index: int) -> int:
        """The row of batch sequence `index`'s next-token logits."""
        if self._sampling_row is None:
            self._sampling_row = {index: row for row, index in enumerate(self.sampling)}
        return self._sampling_row[index]

    def extra(self, index: int) -> ExtraRows | None:
        """Batch sequence `index`'s extra rows, if it has any."""
        return self._extras.get(index)

    @property
    def extras(self) -> list[ExtraRows]:
        """Every batch sequence's extra rows, in batch order (most passes have none)."""
        return list(self._extras.values())

    def device_rows(self, rows: list[int]) -> Any:
        """The given rows, where the logits are (all of them as they are, when that is every row)."""
        if self.logits is None or rows == list(range(self.logits.shape[0])):
            return self.logits
        return self.backend.gather_rows(
            self.logits, self.backend.from_numpy(np.asarray(rows, dtype=np.int64))
        )

    def host_rows(self, rows: list[int] | np.ndarray) -> np.ndarray:
        """The given rows as a host float array [len(rows), vocab]."""
        picked = self.device_rows(list(np.asarray(rows).tolist()))
        return self.backend.to_numpy(picked)
