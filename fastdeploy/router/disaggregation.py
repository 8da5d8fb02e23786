"""Prefill/decode disaggregation in the router: each request goes to a prefill worker, then to a
decode worker.

Per request: a decode worker is chosen (policy), then a prefill worker; the prefill worker gets
the request with `max_tokens` 1, not streaming, and `kv_transfer_params` naming the decode
worker's KV address (its host, and the port its /v1/disaggregation reports). It computes the
prompt, sends the KV blocks and answers once they arrived; the request then goes to the decode
worker unchanged, which finds the prompt in its prefix cache and generates (streams are relayed
as by the plain router). A prefill worker that fails before answering is left out and another
takes the request; one that answers an error (the client's 4xx, or a KV transfer that failed or
stalled, 504) ends that request alone with that answer. A decode worker that fails before
sending anything is replaced by another (with a new prefill); one that fails mid-stream ends the
stream with an error event and `[DONE]`, and is left out of routing until healthy again.

At start-up the workers must play their listed roles and agree on the KV layout (model, block
size, ...): `check_pairing` refuses otherwise, naming the flags.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
from starlette.types import Receive, Scope, Send

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.kv_layout import KVLayout
from fastdeploy.logger import get_logger
from fastdeploy.router.metrics import RouterMetrics
from fastdeploy.router.policies import Policy
from fastdeploy.router.proxy import (
    WORKER_ERRORS,
    Answer,
    Proxy,
    WorkerFailed,
    answer_headers,
    describe,
    error_answer,
    json_or_none,
    serve,
)
from fastdeploy.router.workers import ROLE_FLAGS, Worker, WorkerSet

logger = get_logger(__name__)

FLAGS = "--prefill-workers/--decode-workers"
#: fields of a request the prefill worker gets with other values (it computes the prompt only)
_PREFILL_ONLY = {"max_tokens": 1, "stream": False, "n": 1, "min_tokens": 0}
_DROPPED = ("stream_options", "best_of")


class PairedProxy:
    """Sends each request through a prefill worker to a decode worker."""

    def __init__(
        self,
        workers: WorkerSet,
        policies: tuple[Policy, Policy],
        clients: tuple[httpx.AsyncClient, aiohttp.ClientSession],
        metrics: RouterMetrics,
        info_timeout: float,
        layout: tuple[str, KVLayout] | None = None,
    ) -> None:
        """`clients`: the router's own requests (/v1/disaggregation) go over the first, the
        forwarded ones over the second."""
        self.workers = workers
        self.prefill_policy, self.decode_policy = policies
        self.client, self.session = clients
        self.metrics = metrics
        self.info_timeout = info_timeout
        #: the KV layout every paired worker must have, and the worker it was first seen on
        self.layout: tuple[str, KVLayout] | None = layout
        self.decode = Proxy(workers, self.decode_policy, self.session, metrics)

    def _available(self, role: str, tried: set[Worker]) -> list[Worker]:
        return [w for w in self.workers.available(role) if w not in tried]

    async def admit(self, worker: Worker) -> str | None:
        """Why `worker`, about to become healthy (added by a workers file, or back after a
        failure), may not be paired: it plays another role than listed, or its KV layout differs
        from the others'. None if it may."""
        try:
            info = await worker_info(self.client, worker, self.info_timeout)
        except (httpx.HTTPError, ValueError) as exc:
            return f"/v1/disaggregation failed: {type(exc).__name__} {exc}".strip()
        layout, problem = _role_and_layout(worker, info)
        if problem is not None:
            return problem
        if self.layout is None:
            self.layout = (worker.url, layout)
            return None
        return _layout_mismatch(worker, layout, *self.layout)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI handler of a forwarded path."""
        await serve(scope, receive, send, self.forward)

    async def forward(self, send: Send, path: str, body: bytes, headers: list[tuple[str, str]]) -> None:
        """Send the client the decode worker's answer once a prefill worker sent it the prompt's
        KV blocks; a refusal or failed transfer as the prefill worker answered it; else a 503."""
        parsed = json_or_none(body)
        if not isinstance(parsed, dict):  # the decode worker answers what is wrong with it
            return await self.decode.forward(send, path, body, headers)
        tried_prefill: set[Worker] = set()
        tried_decode: set[Worker] = set()
        reasons: list[str] = []
        while candidates := self._available("decode", tried_decode):
            decode = self.decode_policy.choose(candidates, parsed)
            tried_decode.add(decode)
            address = await self._kv_address(decode, reasons)
            if address is None:
                continue
            prefilled = await self._prefill(parsed, path, headers, address, tried_prefill, reasons)
            if isinstance(prefilled, Answer):
                return await prefilled.send(send)
            if prefilled is None:
                break  # no prefill worker could take it
            try:
                return await self.decode.attempt(send, decode, path, body, headers, len(candidates) > 1)
            except WorkerFailed as exc:
                reasons.append(f"{decode.url}: {exc}")
                self.metrics.retries.labels(decode.url).inc()
        self.metrics.unserved.inc()
        detail = "; ".join(reasons) if reasons else "no prefill and decode worker pair is healthy"
        await error_answer(503, f"no worker pair could serve the request ({detail})").send(send)

    async def _kv_address(self, decode: Worker, reasons: list[str]) -> str | None:
        """`host:port` where `decode` receives KV blocks (None, and the worker left out, if it
        does not say)."""
        try:
            info = await worker_info(self.client, decode, self.info_timeout)
            port = info["kv_port"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            reason = f"/v1/disaggregation failed: {type(exc).__name__} {exc}".strip()
            self.workers.mark_failed(decode, reason)
            reasons.append(f"{decode.url}: {reason}")
            return None
        return f"{urlsplit(decode.url).hostname}:{port}"

    async def _prefill(
        self,
        parsed: dict,
        path: str,
        headers: list[tuple[str, str]],
        address: str,
        tried: set[Worker],
        reasons: list[str],
    ) -> dict | Answer | None:
        """The prefill worker's transfer summary once the blocks are at `address`; its answer if
        it refused the request or the transfer failed; None if no prefill worker could take it."""
        body = {key: value for key, value in parsed.items() if key not in _DROPPED}
        body.update(_PREFILL_ONLY, kv_transfer_params={"decode_address": address})
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = 1
        while candidates := self._available("prefill", tried):
            prefill = self.prefill_policy.choose(candidates, parsed)
            tried.add(prefill)
            prefill.outstanding += 1
            try:
                async with self.session.post(prefill.url + path, json=body, headers=headers) as answer:
                    content = await answer.read()
            except WORKER_ERRORS as exc:
                reason = describe(exc)
                self.workers.mark_failed(prefill, reason)
                reasons.append(f"{prefill.url}: {reason}")
                self.metrics.retries.labels(prefill.url).inc()
                logger.warning("prefill worker %s failed (%s); trying another", prefill.url, reason)
                continue
            finally:
                prefill.outstanding -= 1
            if answer.status == 503 and len(candidates) > 1:
                reasons.append(f"{prefill.url}: it answered 503")
                continue
            outcome = "ok" if answer.status == 200 else "http_error"
            self.metrics.requests.labels(prefill.url, outcome).inc()
            if answer.status != 200:
                return Answer(answer.status, content, answer_headers(answer))
            summary = json_or_none(content)
            return (summary.get("kv_transfer_params") if isinstance(summary, dict) else None) or {}
        return None


async def worker_info(client: httpx.AsyncClient, worker: Worker, timeout: float) -> dict[str, Any]:
    """A worker's /v1/disaggregation answer."""
    answer = await client.get(worker.url + "/v1/disaggregation", timeout=timeout)
    answer.raise_for_status()
    info = answer.json()
    if not isinstance(info, dict):
        raise ValueError("/v1/disaggregation did not answer a JSON object")
    return info


async def check_pairing(
    client: httpx.AsyncClient, workers: WorkerSet, timeout: float
) -> tuple[str, KVLayout] | None:
    """Refuse, naming the flags, workers that do not play their listed role or whose KV layouts
    differ (model, element type, block size, shapes). Returns the layout they share, and the
    worker it was read from."""
    healthy = workers.available()
    answers = await asyncio.gather(
        *(worker_info(client, w, timeout) for w in healthy), return_exceptions=True
    )
    reference: tuple[str, KVLayout] | None = None
    for worker, info in zip(healthy, answers, strict=True):
        flag = ROLE_FLAGS[worker.role][0]
        if isinstance(info, BaseException):
            raise InvalidArgumentError(f"{flag}: {worker.url} did not answer /v1/disaggregation ({info})")
        layout, problem = _role_and_layout(worker, info)
        if problem is not None:
            raise InvalidArgumentError(f"{flag}: {problem}")
        if reference is None:
            reference = (worker.url, layout)
            continue
        problem = _layout_mismatch(worker, layout, *reference)
        if problem is not None:
            raise InvalidArgumentError(f"{FLAGS}: {problem}")
    return reference


def _role_and_layout(worker: Worker, info: dict[str, Any]) -> tuple[KVLayout | None, str | None]:
    """The KV layout `worker` reports, or why it cannot play its listed role."""
    if info.get("role") != worker.role:
        return None, (
            f"{worker.url} is a {info.get('role')} instance; start it with "
            f"`fastdeploy serve --splitwise-role {worker.role}`"
        )
    try:
        return KVLayout.from_dict(info.get("kv_layout")), None
    except InvalidArgumentError as exc:
        return None, f"{worker.url}: {exc}"


def _layout_mismatch(worker: Worker, layout: KVLayout, reference_url: str, reference: KVLayout) -> str | None:
    why = reference.mismatch(layout)
    if why is None:
        return None
    return (
        f"{worker.url} cannot be paired with {reference_url}: its KV {why} "
        "(paired instances need the same model, --block-size and --kv-cache-dtype)"
    )
