"""A test-only fastdeploy plugin that injects faults: a device backend and a reasoning parser.

It is found like any plugin, through a `fastdeploy.plugins` entry point of an installed
distribution (`distribution.install` writes one), never imported by fastdeploy by name.

- Device `faulty`: the cpu backend, except that a pass whose tokens include
  - `FD_FAULT_RAISE_TOKEN` raises from the embedding op (an op that raises);
  - `FD_FAULT_NAN_TOKEN` gets NaN embeddings at those positions, so that sequence's logits are
    NaN (and only that sequence's: every op is row-wise or per sequence);
  - `FD_FAULT_DEAD_TOKEN` breaks the device: from then on every embedding raises (a lost device);
  and `FD_FAULT_KV_ALLOCATION=fail` makes allocating the KV cache raise MemoryError.
- Reasoning parser `faulty`: no reasoning part, except that it raises once the text contains
  `FD_FAULT_PARSER_TRIGGER` (a parser plugin that fails mid-stream).

Settings are read from the environment when the backend or parser is built.
"""

from __future__ import annotations

import os

import numpy as np
import pluggy

from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.reasoning.base import ReasoningParser, ReasoningSplit

hookimpl = pluggy.HookimplMarker("fastdeploy")


def _token(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


class InjectedFault(RuntimeError):
    """What the faulty backend raises."""


class FaultyBackend(CpuBackend):
    name = "faulty"
    auto_priority = -100  # never chosen by device="auto"

    def __init__(self, options) -> None:
        super().__init__(options)
        self.raise_token = _token("FD_FAULT_RAISE_TOKEN")
        self.nan_token = _token("FD_FAULT_NAN_TOKEN")
        self.dead_token = _token("FD_FAULT_DEAD_TOKEN")
        self.fail_kv_allocation = os.environ.get("FD_FAULT_KV_ALLOCATION") == "fail"
        self.dead = False

    def allocate_kv_cache(self, spec):
        if self.fail_kv_allocation:
            raise MemoryError(f"injected fault: cannot allocate {spec.num_blocks} KV blocks")
        return super().allocate_kv_cache(spec)

    def embedding(self, token_ids, table):
        ids = np.asarray(token_ids)
        if self.dead_token is not None and (ids == self.dead_token).any():
            self.dead = True
        if self.dead:
            raise InjectedFault("injected fault: the device is lost")
        if self.raise_token is not None and (ids == self.raise_token).any():
            raise InjectedFault("injected fault: embedding op raised")
        hidden = super().embedding(token_ids, table)
        if self.nan_token is not None and (ids == self.nan_token).any():
            hidden = np.array(hidden, copy=True)
            hidden[ids == self.nan_token] = np.nan
        return hidden


class FaultyParser(ReasoningParser):
    """Everything is the answer, until the text contains the trigger: then it raises."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.trigger = os.environ.get("FD_FAULT_PARSER_TRIGGER") or None

    def split(self, text, *, thinking_enabled, finished):
        if self.trigger is not None and self.trigger in text:
            raise InjectedFault(f"injected fault: the parser met {self.trigger!r}")
        return ReasoningSplit(None, text)


@hookimpl
def fastdeploy_device_backends():
    return {FaultyBackend.name: FaultyBackend}


@hookimpl
def fastdeploy_reasoning_parsers():
    return {"faulty": FaultyParser}
