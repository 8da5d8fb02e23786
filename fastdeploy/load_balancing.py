"""Choosing one of several interchangeable backends for a request.

Shared by the server's in-process replica router (backends are engines, prompts are token ids)
and `fastdeploy router` (backends are HTTP workers, prompts are text): both send a request to the
least-loaded backend, and with prefix affinity to the backend that served a request starting the
same way, whose prefix cache likely still holds that prefix, unless it is busier than the least
loaded by more than `slack` requests. Backends are any hashable objects; load is asked for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

Backend = TypeVar("Backend", bound=Hashable)


class LeastLoaded:
    """Fewest requests in flight; ties go round-robin so idle backends share the work."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, backends: Sequence[Backend], load: Callable[[Backend], int]) -> Backend:
        count = len(backends)
        order = [(self._next + offset) % count for offset in range(count)]
        index = min(order, key=lambda i: load(backends[i]))
        self._next = (index + 1) % count
        return backends[index]


class RoundRobin:
    """Each backend in turn, whatever its load."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, backends: Sequence[Backend], load: Callable[[Backend], int]) -> Backend:
        index = self._next % len(backends)
        self._next = index + 1
        return backends[index]


class PrefixAffinity(Generic[Backend]):
    """Remembers which backend served each prompt prefix (whole blocks of `block` items, at most
    `max_blocks` of them, the `memory` most recent prefixes) and sends a prompt back there."""

    def __init__(self, block: int, slack: int = 2, max_blocks: int = 8, memory: int = 4096) -> None:
        if block < 1:
            raise ValueError(f"a prefix block must hold at least one item, got {block}")
        self.block = block
        self.slack = slack
        self.max_blocks = max_blocks
        self.memory = memory
        self._owners: OrderedDict[Hashable, Backend] = OrderedDict()

    def choose(
        self,
        prompt: Sequence,
        backends: Sequence[Backend],
        load: Callable[[Backend], int],
        least: Backend,
    ) -> Backend:
        """The backend that served `prompt`'s longest known prefix, if it is among `backends` and
        within `slack` of `least`'s load; else `least`. Either way it now owns the prefixes."""
        keys = self._prefix_keys(prompt)
        for key in reversed(keys):  # longest known prefix first
            owner = self._owners.get(key)
            if owner is not None and owner in backends and load(owner) <= load(least) + self.slack:
                self._remember(keys, owner)
                return owner
        self._remember(keys, least)
        return least

    def _prefix_keys(self, prompt: Sequence) -> list[Hashable]:
        """The prompt's whole-block prefixes, shortest first (a prefix cache works in blocks)."""
        whole = min(len(prompt) // self.block, self.max_blocks)
        prefixes = [prompt[: n * self.block] for n in range(1, whole + 1)]
        return prefixes if isinstance(prompt, str) else [tuple(prefix) for prefix in prefixes]

    def _remember(self, keys: list[Hashable], backend: Backend) -> None:
        for key in keys:
            self._owners[key] = backend
            self._owners.move_to_end(key)
        while len(self._owners) > self.memory:
            self._owners.popitem(last=False)
