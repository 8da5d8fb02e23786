"""`AsyncLLMEngine`: one `LLMEngine` stepped by a background thread, used from asyncio code.

The server handles many connections on one event loop, but `LLMEngine` is not thread-safe and
its `step()` blocks for a whole forward pass. So one engine thread owns the engine: requests and
aborts reach it through a lock-protected inbox that it drains between steps, and it sleeps on a
condition variable when there is nothing to do (no busy loop). Every request from every
connection is added to the same engine, so they are batched together (continuous batching across
clients).

Outputs travel back with `loop.call_soon_threadsafe`. A request keeps only its latest output (the
engine's outputs are cumulative), so a slow reader skips intermediate steps instead of queueing
them. After each step the thread also reports `StepStats` to observers (the server's Prometheus
metrics): queue lengths, KV-cache usage, token counts and per-token latencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.prefix_cache_stats import PrefixCacheStats
from fastdeploy.engine.request import OK, RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.spec_decode.decoder import SpecDecodeStats
from fastdeploy.errors import EngineDeadError, EngineStoppedError, FastDeployError, InvalidArgumentError
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


#: how often an idle engine thread checks that the engine's rank processes are alive
_HEALTH_CHECK_SECONDS = 1.0


class EngineOverloadedError(FastDeployError, RuntimeError):
    """Too many requests are already waiting; the client should retry later."""


class GenerationError(FastDeployError, RuntimeError):
    """The engine failed a request while generating it.

    `code` is its error_code (an HTTP status); `kind` says what failed: a `fault_isolation`
    kind such as "forward_error" or "nonfinite_logits", `ENGINE_DEAD`, or "internal_error".
    """

    def __init__(self, message: str, code: int, kind: str = "internal_error") -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind


#: `GenerationError.kind` of every request in flight when the engine stops for good
ENGINE_DEAD = "engine_dead"


@dataclass
class StepStats:
    """What one pass of the engine thread did, for metrics."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_free_blocks: int
    num_total_blocks: int
    #: requests that received tokens in this step (0 when the pass only handled the inbox)
    requests_in_step: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    #: arrival-to-first-token seconds of requests whose first token came in this step
    first_token_latencies: list[float] = field(default_factory=list)
    #: seconds since the previous token, one entry per later token
    inter_token_latencies: list[float] = field(default_factory=list)
    finished: list[RequestOutput] = field(default_factory=list)
    #: prefix-cache totals since the engine started
    prefix_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    #: speculative decoding totals since the engine started (None when it does not speculate)
    spec_decode: SpecDecodeStats | None = None


StepObserver = Callable[[StepStats], None]


class _Stream:
    """The loop-side end of one request: its latest output or error, and an event to wait on."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()
        self.latest: RequestOutput | None = None
        self.error: BaseException | None = None

    def put(self, item: RequestOutput | BaseException) -> None:
        """Called on the loop thread."""
        if isinstance(item, BaseException):
            self.error = item
        else:
            self.latest = item
        self.event.set()


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None
    arrival_time: float
    thinking_enabled: bool
    stream: _Stream
    multimodal: Any = None
    lora_request: Any = None


@dataclass
class _Abort:
    request_id: str


@dataclass
class _AbortAll:
    """Abort every request in flight; each ends with a final output (finish_reason "abort")."""


@dataclass
class _Progress:
    """Engine-thread bookkeeping of one request, for latency metrics."""

    stream: _Stream
    arrival_time: float
    num_tokens: int = 0
    last_token_time: float | None = None


_Command = _Add | _Abort | _AbortAll


class AsyncLLMEngine:
    """Runs `engine.step()` on a background thread; `generate()` is an async iterator of outputs.

    `max_waiting` bounds the requests queued beyond the `max_num_seqs` that can run at once;
    past it `generate` raises `EngineOverloadedError` (the server answers 503).
    """

    def __init__(self, engine: LLMEngine, max_waiting: int | None = None) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._inbox: list[_Command] = []
        self._accepting = True
        self._stopping = False
        self._stopped = False
        self._observers: list[StepObserver] = []
        self._fatal_callbacks: list[Callable[[BaseException], None]] = []
        self._fatal: BaseException | None = None  # what killed the engine thread, if anything did
        self._in_flight = 0  # requests added and not yet finished; touched on the loop thread only
        self._progress: dict[str, _Progress] = {}  # engine thread only
        self._taken: list[_Command] = []  # the inbox commands being applied (engine thread only)
        self._thread = threading.Thread(target=self._run, name="fastdeploy-engine", daemon=True)
        self._started = False

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Abort whatever still runs, stop the thread and wait for it (up to `timeout` seconds)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._started:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.error("engine thread did not stop within %.1f s", timeout or 0.0)

    def stop_accepting(self) -> None:
        """Refuse new requests (`EngineStoppedError`) while those in flight go on: the drain."""
        self._accepting = False

    def abort_all(self) -> None:
        """Abort every request in flight (the drain's deadline); their streams get a final output."""
        self._submit(_AbortAll())

    def add_observer(self, observer: StepObserver) -> None:
        """Call `observer(StepStats)` on the engine thread after every pass (must not block)."""
        self._observers.append(observer)

    def on_fatal(self, callback: Callable[[BaseException], None]) -> None:
        """Call `callback(exc)` on the engine thread if the engine dies (e.g. its rank processes failed)."""
        self._fatal_callbacks.append(callback)

    @property
    def fatal_error(self) -> BaseException | None:
        """What stopped the engine for good (its device or a rank died, or a bug); None while it works."""
        return self._fatal

    @property
    def is_running(self) -> bool:
        return self._started and self._thread.is_alive() and not self._stopping

    @property
    def is_accepting(self) -> bool:
        """False once `stop_accepting` was called (the server is draining)."""
        return self._accepting

    @property
    def num_in_flight(self) -> int:
        """Requests accepted and not finished yet."""
        return self._in_flight

    # --- requests ---------------------------------------------------------------------------
    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        thinking_enabled: bool = True,
        arrival_time: float | None = None,
        multimodal: Any = None,
        lora_request: Any = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's cumulative output after each step that adds tokens, the last one finished.

        Leaving the iteration early (the client went away, the task was cancelled) aborts the
        request and frees its KV blocks. Raises `InvalidArgumentError` if the engine rejects the
        request, `GenerationError` if it fails while generating.
        """
        self.check_capacity()
        stream = _Stream(asyncio.get_running_loop())
        add = _Add(
            request_id,
            list(prompt_token_ids),
            params,
            prompt,
            time.time() if arrival_time is None else arrival_time,
            thinking_enabled,
            stream,
            multimodal,
            lora_request,
        )
        self._in_flight += 1
        finished = False
        try:
            self._submit(add)
            while True:
                await stream.event.wait()
                stream.event.clear()
                if stream.error is not None:
                    finished = True
                    raise stream.error
                output = stream.latest
                if output is None:
                    continue
                if output.error_code != OK:
                    finished = True
                    raise GenerationError(output.error_msg or "generation failed", output.error_code)
                yield output
                if output.finished:
                    finished = True
                    return
        finally:
            self._in_flight -= 1
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread (no-op if it has finished)."""
        self._submit(_Abort(request_id))

    def check_capacity(self, count: int = 1) -> None:
        """Raise `EngineStoppedError` / `EngineOverloadedError` unless `count` more requests fit now
        (`InvalidArgumentError` if they could never fit)."""
        if self._fatal is not None:
            raise EngineStoppedError(f"the engine is unavailable: {self._fatal}")
        if not self.is_running or not self._accepting:
            raise EngineStoppedError("the server is shutting down and takes no new requests")
        if self.max_waiting is None:
            return
        limit = self.engine.config.max_num_seqs + self.max_waiting
        if count > limit:  # would never fit: a 503 would have the client retry for ever
            raise InvalidArgumentError(
                f"{count} prompts in one request are more than this server takes at once: "
                f"{self.engine.config.max_num_seqs} running (--max-num-seqs) plus {self.max_waiting} "
                "waiting (--max-waiting-requests); split the request"
            )
        if self._in_flight + count > limit:
            raise EngineOverloadedError(
                f"the server is overloaded: {self._in_flight} requests are in flight and at most "
                f"{self.max_waiting} may wait beyond the {self.engine.config.max_num_seqs} that run at "
                "once (--max-waiting-requests); retry later"
            )

    def _submit(self, command: _Command) -> None:
        with self._cond:
            if self._stopped and isinstance(command, _Add):
                raise EngineStoppedError("the engine has stopped")
            self._inbox.append(command)
            self._cond.notify()

    # --- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a dead device or a bug here must not leave every client waiting
            logger.exception("engine stopped for good; failing every request in flight")
            with self._cond:
                self._stopping = self._stopped = True
                pending, self._inbox = self._inbox, []
            self._fatal = exc
            if isinstance(exc, EngineDeadError):  # the device or a rank is gone: unavailable, not a bug
                error = GenerationError(f"the engine is unavailable: {exc}", 503, ENGINE_DEAD)
            else:
                error = GenerationError(
                    f"internal error: the engine stopped ({type(exc).__name__}: {exc})", 500, ENGINE_DEAD
                )
            for callback in self._fatal_callbacks:  # first, so /health says so before clients hear
                try:
                    callback(exc)
                except Exception:
                    logger.exception("fatal callback %r failed", callback)
            for command in [*self._taken, *pending]:
                if isinstance(command, _Add):
                    self._deliver(command.stream, error)
            for progress in self._progress.values():
                self._deliver(progress.stream, error)
            self._progress.clear()

    def _loop(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not self._inbox and not self._stopping and not engine.has_unfinished_requests():
                    if not self._cond.wait(timeout=_HEALTH_CHECK_SECONDS):
                        engine.check_health()  # a rank process may die while nothing runs
                commands, self._inbox = self._inbox, []
                self._taken = commands
                stopping = self._stopping
                if stopping:
                    self._stopped = True
            stats = self._stats()
            for command in commands:
                self._apply(command, stats)
            if stopping:
                self._abort_all(stats)
                self._report(self._stats())
                logger.info("engine thread stopped")
                return
            if engine.has_unfinished_requests():
                self._step(stats)
            self._report(stats)

    def _apply(self, command: _Command, stats: StepStats) -> None:
        if isinstance(command, _AbortAll):
            for request_id in list(self._progress):
                self._abort(request_id, stats)
            return
        if isinstance(command, _Abort):
            self._abort(command.request_id, stats)
            return
        try:
            self.engine.add_request(
                command.request_id,
                command.prompt_token_ids,
                command.params,
                prompt=command.prompt,
                arrival_time=command.arrival_time,
                stream=True,
                thinking_enabled=command.thinking_enabled,
                multimodal=command.multimodal,
                lora_request=command.lora_request,
            )
        except Exception as exc:  # the engine validates; the caller gets the reason
            self._deliver(command.stream, exc)
            return
        self._progress[command.request_id] = _Progress(command.stream, command.arrival_time)

    def _abort(self, request_id: str, stats: StepStats) -> None:
        progress = self._progress.pop(request_id, None)
        output = self.engine.abort_request(request_id)
        if output is not None:
            logger.info("request %s aborted", request_id)
            stats.finished.append(output)
            if progress is not None:
                self._deliver(progress.stream, output)

    def _step(self, stats: StepStats) -> None:
        try:
            outputs = self.engine.step()
        except EngineDeadError:
            raise  # fatal: the thread stops and fails every request (see _run)
        except Exception as exc:  # never let one bad step kill the thread every client waits on
            logger.exception("engine step failed; failing every request in flight")
            for request_id in list(self._progress):
                progress = self._progress.pop(request_id)
                self.engine.abort_request(request_id)
                self._deliver(progress.stream, GenerationError(f"internal error: {exc}", 500))
            return
        now = time.time()
        stats.requests_in_step = len(outputs)
        kinds = {fault.request_id: fault.kind for fault in self.engine.fault_isolation.faults_in_step}
        for output in outputs:
            progress = self._progress.get(output.request_id)
            if progress is None:
                continue
            self._account(progress, output, now, stats)
            if output.finished:
                del self._progress[output.request_id]
                stats.finished.append(output)
            if output.error_code != OK:
                kind = kinds.get(output.request_id, "internal_error")
                self._deliver(
                    progress.stream, GenerationError(output.error_msg or kind, output.error_code, kind)
                )
            else:
                self._deliver(progress.stream, output)

    @staticmethod
    def _account(progress: _Progress, output: RequestOutput, now: float, stats: StepStats) -> None:
        num_tokens = sum(len(sample.token_ids) for sample in output.outputs)
        new = num_tokens - progress.num_tokens
        if new <= 0:
            return
        if progress.last_token_time is None:
            stats.prompt_tokens += len(output.prompt_token_ids)
            stats.first_token_latencies.append(now - progress.arrival_time)
            new_after_first = new - 1
        else:
            new_after_first = new
        if progress.last_token_time is not None and new_after_first:
            gap = (now - progress.last_token_time) / new_after_first
            stats.inter_token_latencies.extend([gap] * new_after_first)
        stats.generation_tokens += new
        progress.num_tokens = num_tokens
        progress.last_token_time = now

    def _abort_all(self, stats: StepStats) -> None:
        for request_id in list(self._progress):
            progress = self._progress.pop(request_id)
            self.engine.abort_request(request_id)
            self._deliver(
                progress.stream, EngineStoppedError("the server shut down before the request finished")
            )

    def _stats(self) -> StepStats:
        engine = self.engine
        running = {seq.request_id for seq in engine.scheduler.running}
        blocks = engine.block_manager
        return StepStats(
            num_running=len(running),
            num_waiting=len(engine.requests) - len(running),
            kv_cache_usage=blocks.usage(),
            num_free_blocks=blocks.num_free_blocks,
            num_total_blocks=blocks.num_blocks,
        )

    def _report(self, stats: StepStats) -> None:
        current = self._stats()
        stats.num_running, stats.num_waiting = current.num_running, current.num_waiting
        stats.kv_cache_usage, stats.num_free_blocks = current.kv_cache_usage, current.num_free_blocks
        stats.prefix_cache = replace(self.engine.scheduler.prefix_cache_stats)
        decoder = getattr(self.engine, "spec_decoder", None)  # engines without speculation lack it
        if decoder is not None:
            stats.spec_decode = replace(decoder.stats)
        for observer in self._observers:
            try:
                observer(stats)
            except Exception:  # metrics must never stop generation
                logger.exception("step observer %r failed", observer)

    @staticmethod
    def _deliver(stream: _Stream, item: RequestOutput | BaseException) -> None:
        # RuntimeError: the event loop has closed, so nobody is listening any more
        with contextlib.suppress(RuntimeError):
            stream.loop.call_soon_threadsafe(stream.put, item)
