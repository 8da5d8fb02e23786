"""The media URL rules (fastdeploy.input.media_fetch and the uniform error of multimodal.media),
against servers these tests start on addresses they own, counting every connection they accept.

Traffic rule: nothing is sent to an address the test does not own. Private and link-local
addresses are checked by the address policy without connecting (the HTTP client is replaced by
one that fails the test if called), and, when the test may create network namespaces (root and
`ip`), against a counting server inside a namespace of its own reached through a veth pair.
"""

from __future__ import annotations

import ipaddress
import socket
import time

import httpx
import pytest
from media_servers import PNG, MediaServer, SilentServer, closed_port, private_namespace

from fastdeploy.config import EngineConfig
from fastdeploy.entrypoints.openai.api_server import _engine_options
from fastdeploy.entrypoints.openai.cli_args import build_parser
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.media_fetch import FetchFailed, FetchPolicy, address_refusal, fetch
from fastdeploy.input.multimodal.errors import MediaError
from fastdeploy.input.multimodal.media import MediaPolicy, load_image, load_video
from fastdeploy.input.multimodal.options import media_policy

pytest.importorskip("PIL")

PRIVATE_OK = FetchPolicy(allow_private_networks=True, timeout=20)
UNIFORM = "message 0 content part 0: could not fetch the media URL"


@pytest.fixture
def server():
    media = MediaServer()
    yield media
    media.close()


def teredo(client: str) -> str:
    """A Teredo address whose (obfuscated) client is `client` (RFC 4380)."""
    obfuscated = int(ipaddress.IPv4Address(client)) ^ 0xFFFFFFFF
    server = int(ipaddress.IPv4Address("192.0.2.1"))
    return str(ipaddress.IPv6Address((0x20010000 << 96) | (server << 64) | obfuscated))


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.255.0.9", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
        "100.64.0.1", "100.127.255.254", "::1", "fe80::1", "fc00::1", "fd12:3456::1", "fec0::1",
        "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "2002:a00:1::1",
        "2002:7f00:1::", "64:ff9b::a00:1", "::10.0.0.1", teredo("10.0.0.1"), "192.0.2.1", "198.18.0.1",
    ],
)  # fmt: skip
def test_private_addresses_are_refused_unless_allowed(address):
    ip = ipaddress.ip_address(address)
    assert address_refusal(ip) is not None
    assert address_refusal(ip, allow_private_networks=True) is None


@pytest.mark.parametrize(
    "address", ["0.0.0.0", "::", "224.0.0.1", "239.1.2.3", "ff02::1", "255.255.255.255", "240.0.0.1"]
)
def test_multicast_unspecified_and_reserved_are_always_refused(address):
    assert address_refusal(ipaddress.ip_address(address), allow_private_networks=True) is not None


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1"]
)
def test_public_addresses_pass(address):
    assert address_refusal(ipaddress.ip_address(address)) is None


@pytest.fixture
def no_connections(monkeypatch):
    """Fails the test if the fetcher ever sends a request (private addresses must be refused first)."""

    async def refuse(*args, **kwargs):
        raise AssertionError("the fetcher sent a request it should have refused")

    monkeypatch.setattr(httpx.AsyncClient, "send", refuse)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3/image.png", "http://10.0.0.1:8080/x", "http://169.254.169.254/latest/meta-data/",
        "https://169.254.1.1/x", "http://100.64.0.7/x", "http://[fd00::1]/x", "http://[fe80::1]/x",
        "http://[::ffff:10.0.0.1]/x", "http://0xa000001/x", "http://167772161/x", "http://012.0.0.1/x",
    ],
)  # fmt: skip
def test_private_urls_are_refused_without_connecting(no_connections, url):
    with pytest.raises(FetchFailed, match="resolves to"):
        fetch(url, FetchPolicy())


def _spellings(port: int) -> list[str]:
    return [
        f"http://127.0.0.1:{port}/image.png",
        f"http://2130706433:{port}/image.png",
        f"http://0x7f000001:{port}/image.png",
        f"http://0177.0.0.1:{port}/image.png",
        f"http://[::ffff:127.0.0.1]:{port}/image.png",
        f"http://localhost:{port}/image.png",
        f"http://LOCALHOST.:{port}/image.png",
        f"http://127.1:{port}/image.png",
    ]


def test_loopback_in_every_spelling_is_refused_by_default(server):
    for url in _spellings(server.port):
        with pytest.raises(FetchFailed):
            fetch(url, FetchPolicy())
    assert server.connections == 0
    # the same URLs are fetchable when private networks are allowed: the refusals above were the policy
    for url in _spellings(server.port):
        assert fetch(url, PRIVATE_OK) == PNG
    assert server.connections == len(_spellings(server.port))


def test_redirects_are_followed_up_to_three_hops_each_checked(server):
    assert fetch(f"http://127.0.0.1:{server.port}/hop3", PRIVATE_OK) == PNG
    assert server.paths == ["/hop3", "/hop2", "/hop1", "/image.png"]
    server.paths.clear()
    with pytest.raises(FetchFailed, match="more than 3 redirect"):
        fetch(f"http://127.0.0.1:{server.port}/hop4", PRIVATE_OK)
    assert server.paths == ["/hop4", "/hop3", "/hop2", "/hop1"]  # the 4th redirect is not followed
    server.paths.clear()
    no_redirects = FetchPolicy(allow_private_networks=True, max_redirects=0)
    with pytest.raises(FetchFailed, match="redirects are refused"):
        fetch(f"http://127.0.0.1:{server.port}/hop1", no_redirects)
    assert server.paths == ["/hop1"]


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("http://127.0.0.1:{port}/image.png", "not in the allowed"),  # an address the allow-list lacks
        ("ftp://localhost:{port}/image.png", "scheme 'ftp'"),
        ("http://u:p@localhost:{port}/image.png", "credentials"),
    ],
)
def test_every_redirect_hop_is_checked_like_the_first(server, location, reason):
    policy = FetchPolicy(allowed_domains=("localhost",), allow_private_networks=True)
    with pytest.raises(FetchFailed, match=reason):
        fetch(f"http://localhost:{server.port}/redirect-to/" + location.format(port=server.port), policy)
    assert server.connections == 1  # the first hop only


def test_the_connection_goes_to_the_checked_address(server, monkeypatch):
    """DNS rebinding: the name resolves to the checked address once; a second resolution (which
    would answer an unchecked address) never happens, and the Host header keeps the name."""
    answers = iter(["127.0.0.1", "10.9.9.9"])
    real = socket.getaddrinfo
    calls = []

    def rebinding(host, port, *args, **kwargs):
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        calls.append(host)
        return real(next(answers), port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    assert fetch(f"http://rebind.test:{server.port}/image.png", PRIVATE_OK) == PNG
    assert calls == ["rebind.test"]
    assert server.hosts == [f"rebind.test:{server.port}"]


def test_allowed_domains_are_exact_host_names_and_private_rule_still_applies(server):
    localhost_only = FetchPolicy(allowed_domains=("localhost",))
    with pytest.raises(FetchFailed, match="not in the allowed"):
        fetch(f"http://127.0.0.1:{server.port}/image.png", localhost_only)
    with pytest.raises(FetchFailed, match="resolves to"):  # localhost is loopback: still refused
        fetch(f"http://localhost:{server.port}/image.png", localhost_only)
    assert server.connections == 0
    both = FetchPolicy(allowed_domains=("LocalHost.",), allow_private_networks=True)
    assert fetch(f"http://localhost:{server.port}/image.png", both) == PNG
    with pytest.raises(FetchFailed, match="not in the allowed"):
        fetch(f"http://127.0.0.1:{server.port}/image.png", both)
    assert server.connections == 1


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/big-header", "RemoteProtocolError|LocalProtocolError|header"),
        ("/huge-length", "Content-Length"),
        ("/growing", "grew past"),
        ("/text", None),
        ("/missing", "HTTP 404"),
    ],
)
def test_oversized_answers_fail_fast(server, path, reason):
    policy = FetchPolicy(allow_private_networks=True, max_bytes=4 * 1024 * 1024, timeout=20)
    url = f"http://127.0.0.1:{server.port}{path}"
    if reason is None:
        assert fetch(url, policy) == b"this is not an image"
        return
    started = time.monotonic()
    with pytest.raises(FetchFailed, match=reason):
        fetch(url, policy)
    assert time.monotonic() - started < 10  # refused by the rule, not by the 20 s timeout


def test_a_host_that_never_answers_times_out():
    silent = SilentServer()
    try:
        with pytest.raises(FetchFailed, match="within 0.5 s"):
            fetch(f"http://127.0.0.1:{silent.port}/x", FetchPolicy(allow_private_networks=True, timeout=0.5))
        assert silent.connections == 1
    finally:
        silent.close()


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pass@{host}/image.png", "http://user@{host}/image.png", "http://evil.com\\@{host}/image.png",
        "ftp://{host}/image.png", "gopher://{host}/_GET", "http://[{host}/x",
        "http://{host}\\.evil.com/image.png", "http:///image.png", "http://{host}:99999/image.png",
    ],
)  # fmt: skip
def test_bad_urls_are_refused_with_the_uniform_message_and_reach_nothing(server, url):
    url = url.format(host=f"127.0.0.1:{server.port}")
    policy = MediaPolicy(allow_local=False, fetch=FetchPolicy(allow_private_networks=True))
    with pytest.raises(MediaError) as info:
        load_image(url, "message 0 content part 0", policy)
    assert str(info.value) == UNIFORM
    assert server.connections == 0


def test_every_fetch_failure_reads_the_same(server):
    """Open port (not an image), closed port, silent host, private address, oversize, 404, bad
    scheme: one message, byte for byte, so errors cannot map the server's network."""
    silent = SilentServer()
    cases = {
        "open port, not an image": (f"http://127.0.0.1:{server.port}/text", True),
        "closed port": (f"http://127.0.0.1:{closed_port()}/image.png", True),
        "silent host": (f"http://127.0.0.1:{silent.port}/image.png", True),
        "refused address": (f"http://127.0.0.1:{server.port}/image.png", False),
        "too large": (f"http://127.0.0.1:{server.port}/huge-length", True),
        "missing": (f"http://127.0.0.1:{server.port}/nothing", True),
        "scheme": ("gopher://127.0.0.1/x", True),
    }
    messages = {}
    try:
        for name, (url, allow_private) in cases.items():
            fetch_policy = FetchPolicy(allow_private_networks=allow_private, timeout=1)
            for load in (load_image, load_video):
                with pytest.raises(MediaError) as info:
                    load(url, "message 0 content part 0", MediaPolicy(fetch=fetch_policy))
                messages[name, load.__name__] = str(info.value)
    finally:
        silent.close()
    assert set(messages.values()) == {UNIFORM}, messages


def test_a_fetched_png_decodes_and_turned_off_fetching_says_so(server):
    url = f"http://127.0.0.1:{server.port}/image.png"
    assert load_image(url, "image 0", MediaPolicy(fetch=PRIVATE_OK)).size == (180, 120)
    with pytest.raises(MediaError, match="turned off"):
        load_image(url, "image 0", MediaPolicy(allow_fetch=False, fetch=PRIVATE_OK))
    assert server.connections == 1


def test_engine_options_and_server_flags_build_the_policy():
    args = build_parser("test").parse_args(
        [
            "--allowed-media-domains",
            "A.com",
            "b.org.",
            "--media-allow-private-networks",
            "--media-url-no-redirects",
        ]
    )
    kwargs = _engine_options(args)
    assert kwargs["allowed_media_domains"] == ["A.com", "b.org."]
    config = EngineConfig(
        model="unused",
        allowed_media_domains=kwargs["allowed_media_domains"],
        media_allow_private_networks=kwargs["media_allow_private_networks"],
        media_url_no_redirects=kwargs["media_url_no_redirects"],
    )
    policy = media_policy(config).fetch
    assert policy.allowed_domains == ("a.com", "b.org")
    assert policy.allow_private_networks and policy.max_redirects == 0
    defaults = media_policy(EngineConfig(model="unused")).fetch
    assert defaults == FetchPolicy() and not defaults.allow_private_networks and defaults.max_redirects == 3
    with pytest.raises(InvalidArgumentError, match="allowed_media_domains"):
        media_policy(EngineConfig(model="unused", allowed_media_domains="a.com"))


# --- private and link-local addresses of a network namespace this test creates ----------------


@pytest.fixture
def namespace(tmp_path):
    with private_namespace(tmp_path) as served:
        yield served


def test_private_and_link_local_servers_of_our_namespace_are_refused(namespace):
    addresses, port, connections = namespace
    policy = MediaPolicy(fetch=FetchPolicy(timeout=5))
    for address in addresses:
        with pytest.raises(MediaError) as info:
            load_image(f"http://{address}:{port}/image.png", "message 0 content part 0", policy)
        assert str(info.value) == UNIFORM
    assert connections() == 0
    # the servers are there: with private networks allowed, both addresses answer
    allowed = MediaPolicy(fetch=FetchPolicy(allow_private_networks=True, timeout=5))
    for address in addresses:
        assert load_image(f"http://{address}:{port}/image.png", "image 0", allowed).size == (180, 120)
    assert connections() == len(addresses)
