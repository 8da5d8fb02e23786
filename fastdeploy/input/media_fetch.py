"""Fetching a URL a client named, without the server becoming a proxy into its own network.

Every place that fetches on a client's behalf goes through here: chat `image_url` / `video_url`
parts today; the Responses API's `input_image` URLs and any run-time adapter loading would too
(docs/serving.md, "Media URLs"). The rules:

- only `http` / `https`, no credentials in the URL, a plain host name or IP literal;
- with `allowed_domains`, only those host names (exact match, case and a trailing dot ignored);
- the host is resolved (`getaddrinfo`, so `2130706433`, `0x7f000001` and `0177.0.0.1` resolve as
  the system resolver reads them) and every address it resolves to is checked: loopback, private
  (RFC 1918, unique-local), link-local, carrier-grade NAT, site-local and other non-global
  addresses are refused unless `allow_private_networks`; multicast, unspecified and reserved IPv4
  always are; an IPv6 address embedding an IPv4 one (mapped, 6to4, Teredo, NAT64) is checked as
  that IPv4 address;
- the connection goes to the checked address itself (the URL's host is swapped for the IP; the
  Host header and TLS SNI / certificate check keep the name), so DNS rebinding cannot swap it;
- redirects are followed by hand, each hop checked like the first, at most `max_redirects`;
- a total timeout covers resolving, connecting, every hop and the body; the body is capped while
  it streams (a larger Content-Length is refused before reading); h11 caps response headers.

Fetches run on one event loop thread of their own, at most `MAX_FETCHES_IN_FLIGHT` at a time in
the process, so neither the server's event loop nor its preprocessing threads wait on a slow host.
A refusal or failure raises `FetchFailed`, whose reason is for the server log only: callers answer
clients with one uniform message (`media.FETCH_FAILED`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import re
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

#: fetches in flight at once in this process (every server request and offline call together)
MAX_FETCHES_IN_FLIGHT = 16
#: redirects followed by default (each hop checked like the first)
MAX_REDIRECTS = 3
_REDIRECTS = (301, 302, 303, 307, 308)
_HOST_NAME = re.compile(r"^[a-z0-9_-]+(\.[a-z0-9_-]+)*$")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class FetchFailed(Exception):
    """A fetch was refused or failed; the message says why, for the server log only."""


@dataclass(frozen=True)
class FetchPolicy:
    """Which URLs a client may make the server fetch, and how much of them."""

    #: host names that may be fetched (None: any host that passes the address rules)
    allowed_domains: tuple[str, ...] | None = None
    #: fetch from loopback, private, link-local and carrier-grade NAT addresses too
    allow_private_networks: bool = False
    #: redirects followed (0 refuses every redirect)
    max_redirects: int = MAX_REDIRECTS
    #: seconds for the whole fetch: resolving, connecting, every hop and the body
    timeout: float = 10.0
    #: largest body, in bytes
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.allowed_domains is not None:
            object.__setattr__(
                self, "allowed_domains", tuple(normalize_host(name) for name in self.allowed_domains)
            )


def normalize_host(name: str) -> str:
    """A host name as the allow-list compares it: lower case, no trailing dot, no IPv6 brackets,
    international names in their IDNA (punycode) form."""
    name = name.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")
    try:
        return name.encode("idna").decode("ascii") if not name.isascii() else name
    except UnicodeError:
        return name


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo client, NAT64, compatible)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_refusal(ip: IPAddress, allow_private_networks: bool = False) -> str | None:
    """Why the server must not connect to `ip` (None: it may)."""
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        reason = address_refusal(embedded, allow_private_networks)
        return f"{ip} embeds {embedded}: {reason}" if reason else None
    if ip.is_multicast or ip.is_unspecified or (ip.version == 4 and ip.is_reserved):
        return f"{ip} is a multicast, unspecified or reserved address"
    if allow_private_networks:
        return None
    private = (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip in _CGNAT
        or getattr(ip, "is_site_local", False)
        or not ip.is_global
    )
    return f"{ip} is a loopback, private, link-local or otherwise non-global address" if private else None


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str  # normalised: what the allow-list, Host header and SNI use
    port: int
    path: str  # path and query, as sent

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def _target(url: str, policy: FetchPolicy) -> _Target:
    """The URL's parts, checked before anything is resolved or sent."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise FetchFailed(f"malformed URL ({exc})") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchFailed(f"scheme {scheme!r} is not http or https")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise FetchFailed("the URL carries credentials")
    raw_host = parts.hostname or ""
    bracketed = parts.netloc.startswith("[")
    host = normalize_host(raw_host)
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise FetchFailed(f"malformed IPv6 literal {raw_host!r}") from exc
    elif not _HOST_NAME.match(host):
        raise FetchFailed(f"malformed host {raw_host!r}")
    if policy.allowed_domains is not None and host not in policy.allowed_domains:
        raise FetchFailed(f"host {host!r} is not in the allowed media domains")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    path = urllib.parse.quote(path, safe="/?#[]@!$&'()*+,;=:%~")  # spaces and non-ASCII escaped
    return _Target(scheme, host, port or (443 if scheme == "https" else 80), path)


async def _resolve(target: _Target, policy: FetchPolicy) -> IPAddress:
    """The address to connect to: every address the host resolves to must pass `address_refusal`."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchFailed(f"cannot resolve {target.host!r} ({exc})") from exc
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    if not addresses:
        raise FetchFailed(f"{target.host!r} resolves to no address")
    for address in addresses:
        reason = address_refusal(address, policy.allow_private_networks)
        if reason is not None:
            raise FetchFailed(f"{target.host!r} resolves to {reason}")
    return addresses[0]


class _FetchLoop:
    """The event loop thread every fetch runs on, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._ssl: ssl.SSLContext | None = None

    def submit(self, url: str, policy: FetchPolicy) -> concurrent.futures.Future[bytes]:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="fastdeploy-fetch", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(self._fetch(url, policy), self._loop)

    async def _fetch(self, url: str, policy: FetchPolicy) -> bytes:
        # httpx is imported by the first fetch, not with the engine: it is ~0.1 s of every start,
        # and most starts fetch nothing
        import httpx

        if self._slots is None:  # made on this loop, once
            self._slots = asyncio.Semaphore(MAX_FETCHES_IN_FLIGHT)
            self._ssl = httpx.create_ssl_context()  # certifi's CAs, or SSL_CERT_FILE / SSL_CERT_DIR
        try:
            return await asyncio.wait_for(self._limited(url, policy), policy.timeout)
        except asyncio.TimeoutError as exc:
            raise FetchFailed(f"no complete answer within {policy.timeout} s") from exc
        except FetchFailed:
            raise
        except Exception as exc:  # whatever a client's URL provokes is its failed fetch, not a 500
            raise FetchFailed(f"{type(exc).__name__}: {exc}") from exc

    async def _limited(self, url: str, policy: FetchPolicy) -> bytes:
        async with self._slots:
            hops = 0
            while True:
                target = _target(url, policy)
                address = await _resolve(target, policy)
                answer = await self._get(target, address, policy)
                if isinstance(answer, bytes):
                    return answer
                if hops == policy.max_redirects:
                    raise FetchFailed(f"more than {policy.max_redirects} redirect(s)")
                hops += 1
                url = urllib.parse.urljoin(url, answer)

    async def _get(self, target: _Target, address: IPAddress, policy: FetchPolicy) -> bytes | str:
        """The body of a 200 answer, or the Location of a redirect."""
        import httpx  # see _fetch

        pinned = httpx.URL(
            scheme=target.scheme, host=str(address), port=target.port, raw_path=target.path.encode()
        )
        headers = {"Host": target.host_header, "Accept-Encoding": "identity", "User-Agent": "fastdeploy"}
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        try:
            async with httpx.AsyncClient(
                verify=self._ssl, trust_env=False, follow_redirects=False, timeout=None
            ) as client:
                request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
                response = await client.send(request, stream=True)
                try:
                    return await _read(response, policy)
                finally:
                    await response.aclose()
        except httpx.HTTPError as exc:
            raise FetchFailed(f"{type(exc).__name__}: {exc}") from exc


async def _read(response: httpx.Response, policy: FetchPolicy) -> bytes | str:
    if response.status_code in _REDIRECTS:
        location = response.headers.get("location")
        if not location:
            raise FetchFailed(f"redirect {response.status_code} without a Location")
        if policy.max_redirects == 0:
            raise FetchFailed("redirects are refused (--media-url-no-redirects)")
        return location
    if response.status_code != 200:
        raise FetchFailed(f"answered HTTP {response.status_code}")
    length = response.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > policy.max_bytes):
        raise FetchFailed(f"Content-Length {length[:32]!r} is above the {policy.max_bytes}-byte cap")
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > policy.max_bytes:
            raise FetchFailed(f"the body grew past the {policy.max_bytes}-byte cap")
    return bytes(body)


_LOOP = _FetchLoop()


def fetch(url: str, policy: FetchPolicy) -> bytes:
    """The body `url` answers with, under `policy`; FetchFailed (reason for the log) otherwise.
    Blocks the calling thread (offline use); servers use `fetch_async`."""
    return _LOOP.submit(url, policy).result()


async def fetch_async(url: str, policy: FetchPolicy) -> bytes:
    """`fetch` awaited: the caller's event loop is never blocked (the fetch runs on its own loop)
    and cancelling the caller cancels the fetch."""
    return await asyncio.wrap_future(_LOOP.submit(url, policy))
