"""The router's HTTP app (the OpenAI API of its workers, /health, /metrics) and its start-up.

Start-up refuses to run without a reachable worker; after that, workers come and go (health
checks, the workers file) while the router keeps serving with whichever are healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.kv_layout import KVLayout
from fastdeploy.logger import get_logger
from fastdeploy.router.disaggregation import FLAGS, PairedProxy, check_pairing
from fastdeploy.router.metrics import RouterMetrics, merge_worker_metrics
from fastdeploy.router.policies import Policy, make_policy
from fastdeploy.router.proxy import Proxy, forwarded_headers, new_session
from fastdeploy.router.workers import Worker, WorkerList, WorkerSet

logger = get_logger(__name__)

#: the OpenAI routes forwarded to workers
FORWARDED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


@dataclass
class RouterSettings:
    """What `fastdeploy router`'s flags set (see fastdeploy/cli/router.py for each one's meaning)."""

    workers: list[str] = field(default_factory=list)
    workers_file: str | None = None
    policy: str = "least-outstanding"
    prefix_block_chars: int = 128
    prefix_slack: int = 2
    health_interval: float = 2.0
    health_timeout: float = 2.0
    connect_timeout: float = 5.0
    startup_timeout: float = 30.0
    #: prefill/decode disaggregation: the prefill and the decode workers (instead of `workers`),
    #: given as addresses and/or files re-read when they change
    prefill_workers: list[str] = field(default_factory=list)
    decode_workers: list[str] = field(default_factory=list)
    prefill_workers_file: str | None = None
    decode_workers_file: str | None = None

    def worker_lists(self) -> list[WorkerList]:
        """Where the workers come from: one list, or with disaggregation a prefill and a decode list."""
        if not self.disaggregated:
            return [WorkerList("mixed", self.workers, self.workers_file)]
        return [
            WorkerList("prefill", self.prefill_workers, self.prefill_workers_file),
            WorkerList("decode", self.decode_workers, self.decode_workers_file),
        ]

    @property
    def workers_flag(self) -> str:
        """The flag(s) the workers came from, for error messages."""
        return FLAGS if self.disaggregated else self.worker_lists()[0].flag

    @property
    def disaggregated(self) -> bool:
        return bool(
            self.prefill_workers
            or self.decode_workers
            or self.prefill_workers_file
            or self.decode_workers_file
        )

    def check_roles(self) -> None:
        """Disaggregation needs both kinds of worker, and no plain ones beside them."""
        if not self.disaggregated:
            return
        if self.workers or self.workers_file:
            raise InvalidArgumentError(
                "--workers/--workers-file cannot be combined with --prefill-workers/--decode-workers "
                "(run a second router for mixed workers)"
            )
        if not self.prefill_workers and not self.prefill_workers_file:
            raise InvalidArgumentError(
                "--prefill-workers: the decode workers need a prefill peer; none given"
            )
        if not self.decode_workers and not self.decode_workers_file:
            raise InvalidArgumentError("--decode-workers: the prefill workers need a decode peer; none given")


class RouterApp:
    """The router's ASGI app: the forwarded paths go straight to the proxy (a plain ASGI handler:
    FastAPI's middleware and parameter handling would be work for nothing on every request);
    everything else, start-up and shutdown included, to `api`."""

    def __init__(self, api: FastAPI) -> None:
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in FORWARDED_PATHS and scope["method"] == "POST":
            await self.api.state.proxy.handle(scope, receive, send)
        else:
            await self.api(scope, receive, send)


def build_app(
    settings: RouterSettings, workers: WorkerSet, layout: tuple[str, KVLayout] | None = None
) -> RouterApp:
    """The router's app over `workers`; health checks and file reloads run while it serves.
    With disaggregation, workers joining later must have `layout` (the KV layout checked at
    start-up, and the worker it was read from).
    Requests go on over a pooled aiohttp session; the router's own few requests (health checks,
    /v1/models, /metrics, /v1/disaggregation) over an httpx client."""
    metrics = RouterMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with new_client(settings) as client, new_session(settings.connect_timeout) as session:
            app.state.client = client
            app.state.proxy = proxy = make_proxy(settings, workers, client, session, metrics, layout)
            admit = proxy.admit if isinstance(proxy, PairedProxy) else None
            await workers.check(client, settings.health_timeout, admit)
            watcher = asyncio.create_task(
                workers.watch(client, settings.health_interval, settings.health_timeout, admit)
            )
            try:
                yield
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    app = FastAPI(title="fastdeploy router", lifespan=lifespan)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await merged_models(
            app.state.client, workers.available(), forwarded_headers(request), settings.health_timeout
        )

    @app.get("/health")
    async def health() -> Response:
        states = {worker.url: "healthy" if worker.healthy else "unhealthy" for worker in workers.all}
        status = 200 if workers.available() else 503
        return JSONResponse(
            {"status": "ok" if status == 200 else "no healthy worker", "workers": states}, status
        )

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        texts = await worker_metrics(app.state.client, workers.available(), settings.health_timeout)
        return PlainTextResponse(
            metrics.render(workers.all) + merge_worker_metrics(texts),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    return RouterApp(app)


def make_proxy(
    settings: RouterSettings,
    workers: WorkerSet,
    client: httpx.AsyncClient,
    session: aiohttp.ClientSession,
    metrics: RouterMetrics,
    layout: tuple[str, KVLayout] | None = None,
) -> Proxy | PairedProxy:
    """The plain proxy, or with prefill and decode workers the proxy that pairs them."""

    def policy() -> Policy:
        return make_policy(settings.policy, settings.prefix_block_chars, settings.prefix_slack)

    if not settings.disaggregated:
        return Proxy(workers, policy(), session, metrics)
    return PairedProxy(
        workers,
        (policy(), policy()),
        (client, session),
        metrics,
        settings.health_timeout,
        layout,
    )


def new_client(settings: RouterSettings) -> httpx.AsyncClient:
    """The client for the router's own requests to its workers (health, models, metrics)."""
    timeout = httpx.Timeout(None, connect=settings.connect_timeout)
    return httpx.AsyncClient(timeout=timeout, headers={"accept-encoding": "identity"})


async def merged_models(
    client: httpx.AsyncClient, workers: list[Worker], headers: dict[str, str], timeout: float
) -> Response:
    """Every healthy worker's models, each id once; if none answers 200, the first answer as is."""
    answers = await asyncio.gather(
        *(client.get(worker.url + "/v1/models", headers=headers, timeout=timeout) for worker in workers),
        return_exceptions=True,
    )
    models: dict[str, dict] = {}
    refusal: httpx.Response | None = None
    for answer in answers:
        if isinstance(answer, httpx.Response) and answer.status_code == 200:
            for model in _listed_models(answer):
                models.setdefault(model["id"], model)
        elif isinstance(answer, httpx.Response) and refusal is None:
            refusal = answer
    if not models and refusal is not None:
        return Response(refusal.content, refusal.status_code, media_type=refusal.headers.get("content-type"))
    if not models and not workers:
        return JSONResponse(
            {"error": {"message": "no worker is healthy", "type": "service_unavailable"}}, 503
        )
    return JSONResponse({"object": "list", "data": list(models.values())})


def _listed_models(answer: httpx.Response) -> list[dict]:
    """The models in a worker's /v1/models answer (none if it is not a model list)."""
    try:
        data = answer.json().get("data")
    except (ValueError, AttributeError):
        return []
    return (
        [model for model in data if isinstance(model, dict) and "id" in model]
        if isinstance(data, list)
        else []
    )


async def worker_metrics(client: httpx.AsyncClient, workers: list[Worker], timeout: float) -> dict[str, str]:
    """Each healthy worker's /metrics text, leaving out those that do not answer in time."""
    answers = await asyncio.gather(
        *(client.get(worker.url + "/metrics", timeout=timeout) for worker in workers), return_exceptions=True
    )
    return {
        worker.url: answer.text
        for worker, answer in zip(workers, answers, strict=True)
        if isinstance(answer, httpx.Response) and answer.status_code == 200
    }


async def wait_for_workers(settings: RouterSettings, workers: WorkerSet) -> tuple[str, KVLayout] | None:
    """Return once a worker (with disaggregation: a prefill and a decode worker) is healthy;
    raise naming the flag if none is within the start-up timeout. Paired workers must then
    agree on their roles and KV layouts: the layout they share is returned (and the worker it
    was read from)."""
    lists = {listed.role: listed.flag for listed in settings.worker_lists()}

    def missing() -> list[str]:
        return [role for role in lists if not workers.available(role)]

    deadline = time.monotonic() + settings.startup_timeout
    async with new_client(settings) as client:
        while True:
            await workers.check(client, settings.health_timeout)
            if not missing() or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.5, settings.health_interval))
        if missing():
            role = missing()[0]
            reasons = "; ".join(f"{w.url}: {w.last_error}" for w in workers.all if w.role == role)
            raise InvalidArgumentError(
                f"{lists[role]}: no reachable worker within {settings.startup_timeout:g} s ({reasons})"
            )
        return (
            await check_pairing(client, workers, settings.health_timeout) if settings.disaggregated else None
        )


def run_router(
    settings: RouterSettings, host: str, port: int, log_level: str, shutdown_timeout: float
) -> int:
    """Check the workers, then serve until SIGTERM / Ctrl+C."""
    settings.check_roles()
    workers = WorkerSet(*settings.worker_lists())
    if not workers.all:
        raise InvalidArgumentError(
            f"{settings.workers_flag}: no worker address given (expected http://host:port)"
        )
    make_policy(settings.policy)  # an unknown policy is refused before any worker is asked
    layout = asyncio.run(wait_for_workers(settings, workers))
    logger.info("routing to %s", ", ".join(worker.url for worker in workers.available()))
    config = uvicorn.Config(
        build_app(settings, workers, layout),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        proxy_headers=False,  # the router reads no client address
        http="httptools",  # uvicorn's C parser: a fraction of h11's time per request
        timeout_graceful_shutdown=shutdown_timeout,
    )
    _QuietExitServer(config).run()
    return 0


class _QuietExitServer(uvicorn.Server):
    """uvicorn, except that after a SIGTERM/SIGINT shutdown it exits 0 instead of re-raising the
    signal (which would kill the process with it): stopping the router is not a failure."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
