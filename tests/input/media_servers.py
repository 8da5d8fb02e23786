"""HTTP servers the media-fetch tests start on addresses they own, counting every connection.

`MediaServer` answers a few paths: `/image.png` (a real PNG), `/text` (not an image), `/hopN`
(a 302 to `/hop{N-1}`, `/hop0` being the PNG), `/redirect-to/<URL>` (a 302 to URL), `/big-header` (a 10 MB response header),
`/huge-length` (a Content-Length above the cap, then nothing), `/growing` (a chunked body that
never ends). `SilentServer` accepts connections and never answers. Both count connections as they
are accepted, so "nothing reached this server" is checked on the socket, not on parsed requests.
`private_namespace` puts a counting `MediaServer` on a 10.x and a 169.254.x address inside a
network namespace the test creates (root only), the only private addresses a test may send to.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[1] / "fixtures" / "images"
PNG = (IMAGES / "chelsea_180x120.png").read_bytes()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        self.server.hosts.append(self.headers.get("Host"))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
            self._route()

    def _route(self) -> None:
        path = self.path
        if path == "/image.png":
            self._send(200, PNG, {"Content-Type": "image/png"})
        elif path == "/text":
            self._send(200, b"this is not an image", {"Content-Type": "text/plain"})
        elif path.startswith("/redirect-to/"):
            self._send(302, b"", {"Location": path[len("/redirect-to/") :]})
        elif path.startswith("/hop"):
            hops = int(path[4:])
            self._send(302, b"", {"Location": f"/hop{hops - 1}" if hops > 1 else "/image.png"})
        elif path == "/big-header":
            self.send_response(200)
            self.send_header("X-Padding", "a" * (10 * 1024 * 1024))
            self.end_headers()
        elif path == "/huge-length":
            self.send_response(200)
            self.send_header("Content-Length", str(10**12))
            self.end_headers()
            self.wfile.write(PNG[:100])
        elif path == "/growing":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"\0" * (1024 * 1024)
            for _ in range(1024):  # 1 GiB at most; the client aborts long before
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            self._send(404, b"")


class MediaServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """The media paths above, on (host, port 0); `connections` counts accepted sockets."""

    daemon_threads = True
    address_family = socket.AF_INET

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.connections = 0
        self.paths: list[str] = []
        self.hosts: list[str | None] = []
        super().__init__((host, 0), _Handler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def get_request(self) -> tuple[socket.socket, object]:
        request = super().get_request()
        self.connections += 1
        return request

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class SilentServer:
    """Accepts connections on 127.0.0.1 and never answers; `close` drops them all."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.settimeout(0.2)  # so the accepting thread sees `close`
        self.port = self._sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self._open:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)

    @property
    def connections(self) -> int:
        return len(self.accepted)

    def close(self) -> None:
        self._open = False
        self._sock.close()
        for conn in self.accepted:
            conn.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _netns_addresses() -> dict[str, str]:
    """{our end: the namespace's end} of a /30 in 10.213.0.0/16 and one in 169.254.0.0/16, picked
    by process id so parallel test workers never share one."""
    third, fourth = (os.getpid() >> 6) % 250 + 1, (os.getpid() % 60) * 4
    return {f"{net}.{third}.{fourth + 1}": f"{net}.{third}.{fourth + 2}" for net in ("10.213", "169.254")}


COUNTING_SERVER = """
import os, sys
sys.path.insert(0, sys.argv[1])
from media_servers import MediaServer
count_file = sys.argv[2]
class Counting(MediaServer):
    def get_request(self):
        request = super().get_request()
        with open(count_file + ".new", "w") as out:
            out.write(str(self.connections))
        os.replace(count_file + ".new", count_file)  # whole counts only
        return request
server = Counting("0.0.0.0")
print(server.port, flush=True)
sys.stdin.read()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def private_namespace(tmp_path: Path) -> Iterator[tuple[list[str], int, Callable[[], int]]]:
    """A network namespace holding a 10.213.x.x and a 169.254.x.x address behind a veth pair, with
    a counting media server on both; yields (those addresses, the server's port, a function
    returning how many connections it accepted).
    Skips (pytest.skip) where namespaces cannot be made: not root, no `ip`, no permission."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's `ip`")
    addresses = _netns_addresses()
    present = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=30).stdout
    if any(address in present for pair in addresses.items() for address in pair):
        pytest.skip("the namespace test's addresses are already in use on this host")
    tag = f"fdm{os.getpid() % 100000}"
    outer, inner = f"{tag}a", f"{tag}b"
    try:
        _ip("netns", "add", tag)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create a network namespace here: {exc}")
    server = None
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", tag)
        for mine, theirs in addresses.items():
            _ip("addr", "add", f"{mine}/30", "dev", outer)
            _ip("-n", tag, "addr", "add", f"{theirs}/30", "dev", inner)
        _ip("link", "set", outer, "up")
        _ip("-n", tag, "link", "set", inner, "up")
        _ip("-n", tag, "link", "set", "lo", "up")
        counts = tmp_path / "connections"
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                tag,
                sys.executable,
                "-c",
                COUNTING_SERVER,
                str(Path(__file__).parent),
                counts,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        port = int(server.stdout.readline())
        yield list(addresses.values()), port, lambda: int(counts.read_text()) if counts.exists() else 0
    finally:
        if server is not None:
            server.stdin.close()
            server.wait(30)
        subprocess.run(["ip", "link", "del", outer], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", tag], capture_output=True, timeout=30)
