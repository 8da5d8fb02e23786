"""Stand-ins for the GPU parts of the torch runtime, so the decode step's discipline is checked
on torch CPU tensors: a CUDA graph that re-runs its closure into the captured outputs, and a
runtime that counts device-to-host transfers and logs the order of copies, replays and reads."""

from __future__ import annotations

import numpy as np

from fastdeploy.backends.cuda.runtimes.base import DeviceEvent, HostBuffer
from fastdeploy.backends.cuda.runtimes.torch_runtime import TorchRuntime


class FakeGraph:
    """Capture = run and keep the outputs; replay = run again and write into the kept outputs
    (what a replay does to captured memory), so whoever reads a replay's results must read the
    captured tensors, and the closure sees only what was copied into its static inputs."""

    #: every replay of every FakeGraph, in order (for ordering checks)
    log: list[str] | None = None

    def capture(self, fn):
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self):
        if FakeGraph.log is not None:
            FakeGraph.log.append("replay")
        fresh = self.fn()
        pairs = zip(self.out, fresh, strict=True) if isinstance(self.out, tuple) else [(self.out, fresh)]
        for kept, new in pairs:
            kept.copy_(new)


class LoggedEvent(DeviceEvent):
    def __init__(self, runtime: CountingRuntime, number: int) -> None:
        self.runtime = runtime
        self.number = number

    def wait(self) -> None:
        self.runtime.log.append(f"wait event {self.number}")


class CountingRuntime(TorchRuntime):
    """torch-cpu that counts device-to-host transfers (`to_numpy`, `copy_to_host_later`: each is
    one on a GPU) and logs copies from host buffers, events and reads of pending copies."""

    @classmethod
    def install(cls, runtime: TorchRuntime) -> CountingRuntime:
        runtime.__class__ = cls
        runtime.transfers = 0
        runtime.log = []
        runtime._inside = 0
        runtime._events = 0
        return runtime

    def to_numpy(self, tensor):
        if not self._inside:
            self.transfers += 1
        return super().to_numpy(tensor)

    def copy_to_host_later(self, tensors):
        self.transfers += 1
        self._inside += 1
        try:
            copied = super().copy_to_host_later(tensors)
        finally:
            self._inside -= 1

        def wait():
            self.log.append("read tokens")
            return copied()

        return wait

    def host_buffer(self, shape, dtype) -> HostBuffer:
        buffer = super().host_buffer(shape, dtype)
        return HostBuffer(buffer.array, ("pinned", buffer.array))

    def copy_from_host_buffer(self, target, source, rows=None) -> None:
        assert isinstance(source.handle, tuple) and source.handle[0] == "pinned", "copied from pinned memory"
        self.log.append(f"copy {id(source.array)}")
        array = np.asarray(source.array if rows is None else source.array[:rows])
        (target if rows is None else target[:rows]).copy_(self.torch.from_numpy(array))

    def record_event(self) -> DeviceEvent:
        self._events += 1
        self.log.append(f"record event {self._events}")
        return LoggedEvent(self, self._events)
