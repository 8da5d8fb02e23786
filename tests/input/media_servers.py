"""HTTP servers the media-fetch tests start on addresses they own, counting every connection.

`MediaServer` answers a few paths: `/image.png` (a real PNG), `/text` (not an image), `/hopN`
(a 302 to `/hop{N-1}`, `/hop0` being the PNG), `/redirect-to/<URL>` (a 302 to URL), `/big-header` (a 10 MB response header),
`/huge-length` (a Content-Length above the cap, then nothing), `/growing` (a chunked body that
never ends). `SilentServer` accepts connections and never answers. Both count connections as they
are accepted, so "nothing reached this server" is checked on the socket, not on parsed requests.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import socketserver
import threading
from pathlib import Path

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
