"""Prefill/decode disaggregation in the engine: a prefill instance sends the KV blocks of each
prompt it computed (`KVExport`), a decode instance takes them into its prefix cache (`KVImport`).

The keys and values of the prompt's tokens before its last travel: its whole blocks, and the
partial block after them if any. The decode instance computes only the last prompt token (as
any prefix-cache hit leaves the last token to compute, for the logits to sample from), so it
serves the request as an ordinary one whose prefix is cached, no prefill chunk slows the
sequences it decodes, and its greedy output is what one mixed instance gives. Both are step
features:

- `KVExport.after_pass`: once a pass has computed a prompt that a transfer was expected for
  (`expect`, by the server), its blocks are read out (`Backend.read_kv_blocks`) on the engine
  thread, while the request still holds them, and sent by a sender thread; the request then
  ends and frees its blocks as usual. The transfer's outcome is the future `expect` returned.
- `KVImport` is the transport's `KVReceiver`: it answers which prefix blocks the instance holds
  already (those are not sent) and queues what arrives; `before_schedule` writes it into fresh
  blocks registered in the prefix cache (`BlockManager.import_prefix`), held until a pass of a
  sequence holding them too (`after_pass`) or `hold_seconds` later, then left to the cache; the
  partial block is the taking sequence's own, or freed if none came within `hold_seconds`.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.sequence import Sequence
from fastdeploy.engine.step_feature import StepFeature
from fastdeploy.kv_layout import KVLayout
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.parallel.kv_transfer import KVOffer, KVTransport, TransferError, TransferResult

logger = get_logger(__name__)

#: transfers one prefill instance runs at once (each waits mostly on its peer)
SENDER_THREADS = 4


@dataclass
class _Export:
    address: str
    future: Future = field(default_factory=Future)
    started: bool = False


class KVExport(StepFeature):
    """The prefill side: sends each expected request's prompt blocks once they are computed."""

    def __init__(self, backend: Backend, kv_caches: list[Any], layout: KVLayout, timeout: float) -> None:
        self.backend = backend
        self.kv_caches = kv_caches
        self.layout = layout
        self.timeout = timeout
        self.transport: KVTransport | None = None
        self._expected: dict[str, _Export] = {}
        self._sender = ThreadPoolExecutor(SENDER_THREADS, thread_name_prefix="fastdeploy-kv-send")

    def expect(self, request_id: str, address: str) -> Future:
        """Send request `request_id`'s prompt blocks to the decode instance at `address` once they
        are computed (call before the request is added); the future holds the `TransferResult`
        or the `TransferError`."""
        export = _Export(address)
        self._expected[request_id] = export
        return export.future

    def forget(self, request_id: str) -> None:
        """Drop an expected transfer whose request never ran (refused before the engine took it)."""
        export = self._expected.get(request_id)
        if export is not None and not export.started:
            del self._expected[request_id]
            export.future.cancel()

    @property
    def in_flight(self) -> int:
        """Transfers expected or running."""
        return len(self._expected)

    def after_pass(self, batch: ScheduledBatch) -> None:
        if not self._expected:
            return
        for seq in batch.seqs:
            export = self._expected.get(seq.request_id)
            if export is not None and not export.started and seq.num_computed_tokens >= seq.num_prompt_tokens:
                export.started = True
                self._start(seq, export)

    def _start(self, seq: Sequence, export: _Export) -> None:
        size = self.layout.block_size
        # images key their blocks by pixels too: such prompts are computed by the decode side
        computed = 0 if seq.extra_inputs is not None else seq.num_prompt_tokens - 1
        count = -(-computed // size)
        arrays = (
            self.backend.read_kv_blocks(self.kv_caches, np.asarray(seq.block_table[:count], np.int64), size)
            if count
            else []
        )
        offer = KVOffer(seq.request_id, self.layout, seq.prompt_token_ids[:computed], count)
        self._sender.submit(self._send, export, offer, arrays)

    def _send(self, export: _Export, offer: KVOffer, arrays: list[np.ndarray]) -> None:
        try:
            if not offer.num_blocks:
                result = TransferResult(0, 0, 0)
            elif self.transport is None:
                raise TransferError("this prefill instance has no KV transport")
            else:
                result = self.transport.send(export.address, offer, arrays, self.timeout)
        except Exception as exc:
            logger.warning(
                "KV transfer of request %s to %s failed: %s", offer.transfer_id, export.address, exc
            )
            export.future.set_exception(exc if isinstance(exc, TransferError) else TransferError(str(exc)))
        else:
            export.future.set_result(result)
        finally:
            self._expected.pop(offer.transfer_id, None)

    def release(self, request_id: str, seqs: list[Sequence]) -> None:
        export = self._expected.get(request_id)
        if export is not None and not export.started:
            del self._expected[request_id]
            export.future.set_exception(TransferError("the request ended before its prompt was computed"))

    def close(self) -> None:
        self._sender.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Received:
    offer: KVOffer
    first: int
    arrays: list[np.ndarray]
    arrival: float


@dataclass(eq=False)
class _Held:
    blocks: list[int]
    until: float
    #: the imported partial block, the block manager's until a sequence takes it
    partial: int | None = None

    @property
    def mark(self) -> int | None:
        """The block whose presence in a sequence's table shows that sequence took these."""
        return self.blocks[-1] if self.blocks else self.partial


class KVImport(StepFeature):
    """The decode side: the transport's receiver, and the blocks it imported into the cache."""

    def __init__(
        self,
        backend: Backend,
        kv_caches: list[Any],
        block_manager: BlockManager,
        layout: KVLayout,
        hold_seconds: float,
    ) -> None:
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_manager = block_manager
        self.layout = layout
        self.hold_seconds = hold_seconds
        self._received: queue.SimpleQueue[_Received] = queue.SimpleQueue()
        self._held: list[_Held] = []
        self._lock = threading.Lock()
        self.blocks_received = 0

    # --- the transport's thread -----------------------------------------------------------
    def _check(self, offer: KVOffer) -> None:
        why = self.layout.mismatch(offer.layout)
        if why is not None:
            raise TransferError(f"the KV layout differs from this decode instance's: {why}")

    def held_blocks(self, offer: KVOffer) -> int:
        self._check(offer)
        return len(self.block_manager.cached_prefix(offer.token_ids))

    def accept(self, offer: KVOffer, first: int, arrays: list[np.ndarray]) -> None:
        self._check(offer)
        with self._lock:
            self.blocks_received += offer.num_blocks - first
        self._received.put(_Received(offer, first, arrays, time.monotonic()))

    # --- the engine thread ------------------------------------------------------------------
    @property
    def held(self) -> int:
        """Blocks held for requests that have not taken them yet."""
        return sum(len(held.blocks) + (held.partial is not None) for held in self._held)

    def before_schedule(self, running: list[Sequence]) -> None:
        now = time.monotonic()
        while True:
            try:
                received = self._received.get_nowait()
            except queue.Empty:
                break
            if now - received.arrival < self.hold_seconds:
                self._import(received, now)
        if self._held:  # those no request came for in time
            self._let_go([held for held in self._held if now >= held.until])

    def after_pass(self, batch: ScheduledBatch) -> None:
        """Held blocks a sequence of this pass holds too are its own now: let go of them."""
        if not self._held:
            return
        last = {held.mark: held for held in self._held if held.mark is not None}
        taken = [last[block] for seq in batch.seqs for block in seq.block_table if block in last]
        self._let_go(taken + [held for held in self._held if held.mark is None])

    def _import(self, received: _Received, now: float) -> None:
        offer = received.offer
        held = self.block_manager.import_prefix(offer.token_ids)
        if held is None:
            logger.warning(
                "no free KV blocks for transfer %s: its prompt will be computed here", offer.transfer_id
            )
            return
        blocks, fresh = held
        partial = fresh[-1] if len(offer.token_ids) % self.layout.block_size else None
        # whole blocks cached since the offer was answered
        skip = len(blocks) - (len(fresh) - (partial is not None)) - received.first
        if skip < 0:  # blocks the sender left out were evicted meanwhile: the chain has a gap
            self.block_manager.release_blocks(blocks)
            if partial is not None:
                self.block_manager.drop_partial(partial)
            logger.warning(
                "cached prefix of transfer %s was evicted: its prompt is computed here", offer.transfer_id
            )
            return
        if fresh:
            data = [array[skip:] for array in received.arrays]
            self.backend.write_kv_blocks(
                self.kv_caches, np.asarray(fresh, np.int64), data, self.layout.block_size
            )
        self._held.append(_Held(blocks, now + self.hold_seconds, partial))

    def _let_go(self, done: list[_Held]) -> None:
        for held in done:
            if held in self._held:
                self._held.remove(held)
                self.block_manager.release_blocks(held.blocks)
                if held.partial is not None:  # freed unless a sequence took it
                    self.block_manager.drop_partial(held.partial)
