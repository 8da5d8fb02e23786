"""Static device buffers that captured steps read, filled from double-buffered host memory.

A captured graph reads its inputs from fixed device addresses, so every step copies its host
values there. With async scheduling the host prepares step N+1 while the device still runs N, and
N's copies may still be queued behind N-1: a blocking copy would wait for them and undo the
overlap, and rewriting the host memory N's copies read from would corrupt N's inputs. So:

- the host memory is the runtime's `host_buffer` (pinned on a GPU), and the copies are queued with
  `copy_from_host_buffer`, which does not wait for the device;
- there are two sets of host buffers, used in turn; after a set's copies are queued an event is
  recorded, and before the host writes that set again (two steps later) it waits for the event.
  By then the copies have long run (the host has read step N-1's tokens, which come after them),
  so the wait returns at once; it is there so that the order never rests on timing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastdeploy.backends.cuda.runtimes.base import DeviceEvent, HostBuffer, TensorRuntime

#: host buffer sets used in turn (one being copied while the next is written)
HOST_SETS = 2


class StagedBuffers:
    """Named device tensors and `HOST_SETS` sets of host buffers of the same shapes."""

    def __init__(self, rt: TensorRuntime, specs: dict[str, tuple[Sequence[int], str]]) -> None:
        self.rt = rt
        self.device: dict[str, Any] = {name: rt.zeros(shape, dtype) for name, (shape, dtype) in specs.items()}
        self._host: list[dict[str, HostBuffer]] = [
            {name: rt.host_buffer(shape, dtype) for name, (shape, dtype) in specs.items()}
            for _ in range(HOST_SETS)
        ]
        self._copied: list[DeviceEvent | None] = [None] * HOST_SETS
        self._next = 0

    def host_arrays(self) -> dict[str, np.ndarray]:
        """The next set's host arrays to write, once the copies that last read them are done."""
        event = self._copied[self._next]
        if event is not None:
            event.wait()
            self._copied[self._next] = None
        return {name: buffer.array for name, buffer in self._host[self._next].items()}

    def upload(self, rows: dict[str, int] | None = None) -> None:
        """Queue the copies of the set just written (only the first `rows[name]` rows of the named
        buffers) and move on to the other set."""
        rows = rows or {}
        host = self._host[self._next]
        for name, target in self.device.items():
            self.rt.copy_from_host_buffer(target, host[name], rows.get(name))
        self._copied[self._next] = self.rt.record_event()
        self._next = (self._next + 1) % HOST_SETS
