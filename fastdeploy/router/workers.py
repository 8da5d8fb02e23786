"""The router's workers: where they are, which of them are healthy, and the file that lists them.

Workers come from `--workers` (fixed) and `--workers-file` (one URL a line, re-read when it
changes). A worker is healthy while its /health answers 200; one that fails the check, or whose
connection fails under a request, is left out of routing until a later check succeeds.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


@dataclass(eq=False)
class Worker:
    """One `fastdeploy serve` process. Compared by identity, so a policy may remember it."""

    url: str
    healthy: bool = False
    #: requests sent to it and not yet finished (streams count until their last byte)
    outstanding: int = 0
    #: why it was last taken out of routing
    last_error: str = field(default="", repr=False)


def parse_worker_url(text: str, flag: str) -> str:
    """`text` as `http://host:port` without a trailing slash; `flag` names where it came from."""
    address = text.strip().rstrip("/")
    parts = urlsplit(address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.path:
        raise InvalidArgumentError(f"{flag}: {text!r} is not a worker address (expected http://host:port)")
    return address


def read_workers_file(path: str) -> list[str]:
    """The worker URLs listed in `path`: one a line; blank lines and `#` comments are skipped."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidArgumentError(f"--workers-file: cannot read {path!r}: {reason}") from None
    urls = []
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if text:
            urls.append(parse_worker_url(text, f"--workers-file {path!r} line {number}"))
    return urls


class WorkerSet:
    """The workers now known, in the order given (`--workers` first, then the file's)."""

    def __init__(self, urls: list[str], workers_file: str | None = None) -> None:
        self.fixed_urls = list(dict.fromkeys(parse_worker_url(url, "--workers") for url in urls))
        self.workers_file = workers_file
        self._file_stamp: tuple[int, int] | None = None
        file_urls = self._read_file() if workers_file else []
        self._workers: dict[str, Worker] = {}
        self._set_urls(file_urls)

    @property
    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def available(self) -> list[Worker]:
        """The healthy workers, which requests may go to."""
        return [worker for worker in self._workers.values() if worker.healthy]

    def mark_failed(self, worker: Worker, reason: str) -> None:
        """Leave `worker` out of routing until its health check passes again."""
        if worker.healthy:
            logger.warning("worker %s taken out: %s", worker.url, reason)
        worker.healthy = False
        worker.last_error = reason

    async def check(self, client: httpx.AsyncClient, timeout: float) -> None:
        """Ask every worker's /health at once and mark each healthy or not."""
        await asyncio.gather(*(self._check_one(client, worker, timeout) for worker in self.all))

    async def _check_one(self, client: httpx.AsyncClient, worker: Worker, timeout: float) -> None:
        try:
            response = await client.get(worker.url + "/health", timeout=timeout)
            reason = "" if response.status_code == 200 else f"/health answered {response.status_code}"
        except httpx.HTTPError as exc:
            reason = f"/health failed: {type(exc).__name__} {exc}".strip()
        if not reason:
            if not worker.healthy:
                logger.info("worker %s is healthy", worker.url)
            worker.healthy = True
        else:
            self.mark_failed(worker, reason)

    def reload_file(self) -> None:
        """Re-read `--workers-file` if it changed; a file that became unreadable or invalid keeps
        the workers it listed before (a file being rewritten must not empty the router)."""
        if not self.workers_file or self._stamp() == self._file_stamp:
            return
        try:
            urls = self._read_file()
        except InvalidArgumentError as exc:
            logger.warning("keeping the previous workers: %s", exc)
            return
        self._set_urls(urls)

    async def watch(self, client: httpx.AsyncClient, interval: float, timeout: float) -> None:
        """Every `interval` seconds: re-read the workers file if it changed, then check health."""
        while True:
            await asyncio.sleep(interval)
            self.reload_file()
            await self.check(client, timeout)

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.workers_file)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def _read_file(self) -> list[str]:
        stamp = self._stamp()
        urls = read_workers_file(self.workers_file)
        self._file_stamp = stamp
        return urls

    def _set_urls(self, file_urls: list[str]) -> None:
        urls = list(dict.fromkeys(self.fixed_urls + file_urls))
        known = self._workers
        for url in urls:
            if url not in known:
                logger.info("worker %s added", url)
        for url in known:
            if url not in urls:
                logger.info("worker %s removed (its requests in flight finish)", url)
        self._workers = {url: known.get(url) or Worker(url) for url in urls}
