"""The router's workers: where they are, which of them are healthy, and the file that lists them.

Workers come from `--workers` (fixed) and `--workers-file` (one URL a line, re-read when it
changes); with disaggregation, from `--prefill-workers` / `--prefill-workers-file` and
`--decode-workers` / `--decode-workers-file` alike. A worker is healthy while its /health answers 200; one that fails the check, or whose
connection fails under a request, is left out of routing until a later check succeeds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


#: the flags that list each role's workers: addresses, and a file of addresses
ROLE_FLAGS = {
    "mixed": ("--workers", "--workers-file"),
    "prefill": ("--prefill-workers", "--prefill-workers-file"),
    "decode": ("--decode-workers", "--decode-workers-file"),
}


@dataclass(eq=False)
class Worker:
    """One `fastdeploy serve` process. Compared by identity, so a policy may remember it."""

    url: str
    #: "mixed" (a plain worker), or "prefill" / "decode" with disaggregation
    role: str = "mixed"
    healthy: bool = False
    #: requests sent to it and not yet finished (streams count until their last byte)
    outstanding: int = 0
    #: why it was last taken out of routing
    last_error: str = field(default="", repr=False)


@dataclass
class WorkerList:
    """The workers of one role: addresses given on the command line, and a file listing more."""

    role: str = "mixed"
    urls: list[str] = field(default_factory=list)
    file: str | None = None

    @property
    def flag(self) -> str:
        """The flag(s) these workers came from, for error messages."""
        urls_flag, file_flag = ROLE_FLAGS[self.role]
        if self.urls and self.file:
            return f"{urls_flag}/{file_flag}"
        return file_flag if self.file else urls_flag


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


def read_workers_file(path: str, flag: str = "--workers-file") -> list[str]:
    """The worker URLs listed in `path`: one a line; blank lines and `#` comments are skipped.
    `flag` names the file's flag in errors."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidArgumentError(f"{flag}: cannot read {path!r}: {reason}") from None
    urls = []
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if text:
            urls.append(parse_worker_url(text, f"{flag} {path!r} line {number}"))
    return urls


class WorkerSet:
    """The workers now known, each list's in the order given (its addresses first, then its
    file's). Files are re-read when they change, so workers (of any role) come and go."""

    def __init__(self, *lists: WorkerList) -> None:
        self.lists = lists
        self._stamps: dict[str, tuple[int, int] | None] = {}
        #: each file's addresses as last read successfully
        self._file_urls: dict[str, list[str]] = {}
        self._workers: dict[str, Worker] = {}
        for listed in lists:
            if listed.file:
                self._read(listed)
        self._set_urls(self._wanted())

    @property
    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def available(self, role: str | None = None) -> list[Worker]:
        """The healthy workers (of `role`, if given), which requests may go to."""
        return [
            worker
            for worker in self._workers.values()
            if worker.healthy and (role is None or worker.role == role)
        ]

    def mark_failed(self, worker: Worker, reason: str) -> None:
        """Leave `worker` out of routing until its health check passes again."""
        if worker.healthy:
            logger.warning("worker %s taken out: %s", worker.url, reason)
        elif reason != worker.last_error:
            logger.warning("worker %s left out: %s", worker.url, reason)
        worker.healthy = False
        worker.last_error = reason

    async def check(
        self,
        client: httpx.AsyncClient,
        timeout: float,
        admit: Callable[[Worker], Awaitable[str | None]] | None = None,
    ) -> None:
        """Ask every worker's /health at once and mark each healthy or not. `admit`, if given, is
        asked about each worker about to become healthy: a reason it may not (else None)."""
        await asyncio.gather(*(self._check_one(client, worker, timeout, admit) for worker in self.all))

    async def _check_one(
        self,
        client: httpx.AsyncClient,
        worker: Worker,
        timeout: float,
        admit: Callable[[Worker], Awaitable[str | None]] | None,
    ) -> None:
        try:
            response = await client.get(worker.url + "/health", timeout=timeout)
            reason = "" if response.status_code == 200 else f"/health answered {response.status_code}"
        except httpx.HTTPError as exc:
            reason = f"/health failed: {type(exc).__name__} {exc}".strip()
        if not reason and not worker.healthy and admit is not None:
            reason = await admit(worker) or ""
        if not reason:
            if not worker.healthy:
                logger.info("worker %s is healthy", worker.url)
            worker.healthy = True
        else:
            self.mark_failed(worker, reason)

    def reload_file(self) -> None:
        """Re-read the workers files that changed; a file that became unreadable or invalid keeps
        the workers it listed before (a file being rewritten must not empty the router)."""
        changed = False
        for listed in self.lists:
            if not listed.file or self._stamp(listed.file) == self._stamps.get(listed.file):
                continue
            try:
                self._read(listed)
            except InvalidArgumentError as exc:
                logger.warning("keeping the previous workers: %s", exc)
                continue
            changed = True
        if not changed:
            return
        try:
            self._set_urls(self._wanted())
        except InvalidArgumentError as exc:
            logger.warning("keeping the previous workers: %s", exc)

    async def watch(
        self,
        client: httpx.AsyncClient,
        interval: float,
        timeout: float,
        admit: Callable[[Worker], Awaitable[str | None]] | None = None,
    ) -> None:
        """Every `interval` seconds: re-read the workers files that changed, then check health."""
        while True:
            await asyncio.sleep(interval)
            self.reload_file()
            await self.check(client, timeout, admit)

    @staticmethod
    def _stamp(path: str) -> tuple[int, int] | None:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def _read(self, listed: WorkerList) -> None:
        stamp = self._stamp(listed.file)
        self._file_urls[listed.file] = read_workers_file(listed.file, ROLE_FLAGS[listed.role][1])
        self._stamps[listed.file] = stamp

    def _wanted(self) -> dict[str, tuple[str, str]]:
        """URL -> (role, flag) over every list; a URL given two roles is refused."""
        wanted: dict[str, tuple[str, str]] = {}
        for listed in self.lists:
            file_urls = self._file_urls.get(listed.file, []) if listed.file else []
            for url in [parse_worker_url(url, ROLE_FLAGS[listed.role][0]) for url in listed.urls] + file_urls:
                role, flag = wanted.setdefault(url, (listed.role, listed.flag))
                if role != listed.role:
                    raise InvalidArgumentError(
                        f"{listed.flag}: {url} is also listed by {flag}; a worker has one role"
                    )
        return wanted

    def _set_urls(self, wanted: dict[str, tuple[str, str]]) -> None:
        known = self._workers
        for url, (role, _) in wanted.items():
            if url not in known:
                logger.info("worker %s added", url)
            elif known[url].role != role:
                logger.info("worker %s is now a %s worker", url, role)
        for url in known:
            if url not in wanted:
                logger.info("worker %s removed (its requests in flight finish)", url)
        self._workers = {
            url: known[url] if url in known and known[url].role == role else Worker(url, role)
            for url, (role, _) in wanted.items()
        }
