"""A Hugging Face Hub on loopback, speaking what `huggingface_hub` asks of the real one.

Two HTTP servers on 127.0.0.1: the hub (HF_ENDPOINT) and, on another port, the "CDN" its large
files redirect to, as huggingface.co redirects LFS files to its storage host:

- `GET /api/models/ORG/NAME[/revision/REV]`: the model's info (`sha`, `siblings`);
- `GET /api/models/ORG/NAME/tree/REV?recursive=...`: the file listing (`lfs` for large files);
- `HEAD|GET /ORG/NAME/resolve/REV/PATH`: small files redirect (307, relative) to
  `/api/resolve-cache/models/ORG/NAME/COMMIT/PATH`, which serves them with `ETag`,
  `X-Repo-Commit` and `Content-Length`; large files (safetensors, GGUF) redirect (302) to the CDN
  with `X-Linked-Etag` (their sha256) and `X-Linked-Size`;
- the CDN serves bytes, honours `Range: bytes=N-` (206 + `Content-Range`), and can cut a
  response after half its body (`drop_once`) or answer 500 (`fail_once`), once per file.

Errors carry `X-Error-Code` as the hub's do: `RepoNotFound`, `RevisionNotFound`, `EntryNotFound`
(404) and `GatedRepo` (401 unless `Authorization: Bearer <token>`). Every request is logged.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlsplit

LARGE_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pth")


@dataclass
class Repo:
    files: dict[str, bytes]
    #: branch or tag -> commit; "main" is added
    revisions: dict[str, str] = field(default_factory=dict)
    gated: bool = False

    def __post_init__(self) -> None:
        self.commit = hashlib.sha1(json.dumps(sorted(self.files)).encode()).hexdigest()
        self.revisions.setdefault("main", self.commit)

    def commit_of(self, revision: str) -> str | None:
        if revision in self.revisions:
            return self.revisions[revision]
        return revision if revision in self.revisions.values() else None


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """The two servers; `endpoint` goes in HF_ENDPOINT. Use as a context manager."""

    def __init__(self, repos: dict[str, Repo], token: str = "hf_loopback_token") -> None:
        self.repos = repos
        self.token = token
        self.requests: list[Request] = []
        self.drop_once: set[str] = set()  # repository paths whose next CDN response is cut short
        self.fail_once: set[str] = set()  # repository paths whose next CDN response is a 500
        self._lock = threading.Lock()
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=False))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=True))
        self.endpoint = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn = f"http://127.0.0.1:{self._cdn.server_address[1]}"
        self._threads = [
            threading.Thread(target=s.serve_forever, daemon=True) for s in (self._hub, self._cdn)
        ]

    def __enter__(self) -> FakeHub:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def take(self, paths: set[str], path: str) -> bool:
        with self._lock:
            if path in paths:
                paths.discard(path)
                return True
            return False

    def cdn_gets(self) -> list[Request]:
        """The CDN's GET requests (each a download of a large file, or a resumption of one)."""
        return [r for r in self.requests if r.method == "GET" and r.path.startswith("/cdn/")]

    def downloaded(self) -> set[str]:
        """Repository paths whose bytes were requested (from the CDN or the resolve cache)."""
        found = set()
        for request in self.requests:
            if request.method != "GET":
                continue
            if request.path.startswith("/cdn/"):
                found.add(unquote(request.path.split("/", 3)[3]))
            elif request.path.startswith("/api/resolve-cache/"):
                found.add(unquote(request.path.split("/", 7)[7]))
        return found

    def cdn_path(self, repo_id: str, path: str) -> str:
        return f"/cdn/{repo_id.replace('/', '--')}/{quote(path)}"


def _handler(hub: FakeHub, cdn: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = urlsplit(self.path).path
            hub.log(Request(self.command, path, self.headers.get("Range"), self.headers.get("Authorization")))
            if cdn:
                self._cdn(path, body)
            elif path.startswith("/api/models/"):
                self._api(path[len("/api/models/") :])
            elif path.startswith("/api/resolve-cache/models/"):
                org, name, commit, file = path[len("/api/resolve-cache/models/") :].split("/", 3)
                self._resolve(f"{org}/{name}", commit, unquote(file), body, cached=True)
            else:
                parts = path.lstrip("/").split("/", 4)
                if len(parts) < 5 or parts[2] != "resolve":
                    return self._reply(404, b"{}")
                self._resolve(f"{parts[0]}/{parts[1]}", unquote(parts[3]), unquote(parts[4]), body)

        def _reply(self, status: int, data: bytes = b"", headers: dict[str, str] | None = None, body=True):
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body and data and self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None):
            headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
            self._reply(status, json.dumps({"error": message}).encode(), {**headers, **(extra or {})})

        def _repo(self, repo_id: str, revision: str) -> tuple[Repo, str] | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            commit = repo.commit_of(revision)
            if commit is None:
                self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
                return None
            return repo, commit

        def _api(self, rest: str) -> None:
            org, name, kind, revision = (rest.split("/", 3) + ["revision", "main"])[:4]  # no revision: main
            found = self._repo(f"{org}/{name}", unquote(revision))
            if found is None:
                return
            repo, commit = found
            if kind == "revision":
                info = {
                    "id": f"{org}/{name}",
                    "sha": commit,
                    "private": False,
                    "gated": "manual" if repo.gated else False,
                    "siblings": [{"rfilename": path} for path in sorted(repo.files)],
                }
                return self._reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
            entries, folders = [], set()
            for path, data in sorted(repo.files.items()):
                parts = path.split("/")[:-1]
                folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
                entry = {"type": "file", "oid": git_sha1(data), "size": len(data), "path": path}
                if path.endswith(LARGE_SUFFIXES):
                    entry["lfs"] = {
                        "oid": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    }
                entries.append(entry)
            entries += [
                {"type": "directory", "oid": git_sha1(f.encode()), "size": 0, "path": f} for f in folders
            ]
            self._reply(200, json.dumps(entries).encode(), {"Content-Type": "application/json"})

        def _resolve(self, repo_id: str, revision: str, file: str, body: bool, cached: bool = False) -> None:
            found = self._repo(repo_id, revision)
            if found is None:
                return
            repo, commit = found
            if repo.gated and self.headers.get("Authorization") != f"Bearer {hub.token}":
                message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
                return self._error(401, "GatedRepo", message)
            data = repo.files.get(file)
            if data is None:
                return self._error(404, "EntryNotFound", f"{file} does not exist", {"X-Repo-Commit": commit})
            headers = {"X-Repo-Commit": commit, "ETag": f'"{git_sha1(data)}"'}
            if file.endswith(LARGE_SUFFIXES):
                headers.update(
                    {
                        "Location": hub.cdn + hub.cdn_path(repo_id, file),
                        "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                        "X-Linked-Size": str(len(data)),
                    }
                )
                return self._reply(302, b"", headers)
            if not cached:
                headers["Location"] = f"/api/resolve-cache/models/{repo_id}/{commit}/{quote(file)}"
                return self._reply(307, b"", headers)
            self._reply(200, data, headers, body)

        def _cdn(self, path: str, body: bool) -> None:
            _, _, folder, file = path.split("/", 3)
            repo = hub.repos.get(folder.replace("--", "/"))
            data = None if repo is None else repo.files.get(unquote(file))
            if data is None:
                return self._reply(404)
            if body and hub.take(hub.fail_once, unquote(file)):
                return self._reply(500, b"storage unavailable")
            start = 0
            wanted = self.headers.get("Range")
            if wanted:
                start = int(wanted.split("=")[1].split("-")[0])
            if body and start == 0 and hub.take(hub.drop_once, unquote(file)):
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            if start:
                headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
                return self._reply(206, data[start:], headers, body)
            self._reply(200, data, {"Accept-Ranges": "bytes"}, body)

    return Handler
