"""The built-in KV transport: ZeroMQ over TCP (pyzmq, the `disagg` extra).

The decode instance binds a ROUTER socket and answers on one background thread; each transfer of
a prefill instance is a REQ socket of its own, so transfers run on several threads at once and a
stalled one (no answer within its timeout) is closed alone. ZeroMQ frames the messages: a kind,
a JSON header, and for blocks one frame per array, sent without copying.

    prefill -> decode   [b"offer", offer JSON]           decode -> prefill   [b"held", {"blocks": n}]
    prefill -> decode   [b"blocks", {"transfer_id", "first"}, array frames...]   -> [b"ok"]
    either refusal      [b"refused", reason]
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger
from fastdeploy.parallel.kv_transfer import (
    KVOffer,
    KVReceiver,
    KVTransport,
    TransferError,
    TransferResult,
    wire_arrays,
)

logger = get_logger(__name__)

#: how often the receiving thread looks whether it should stop (milliseconds)
_POLL_MS = 100


def _zmq() -> Any:
    try:
        import zmq
    except ImportError as exc:  # optional: only disaggregated serving needs it
        raise InvalidArgumentError(
            "--kv-transport zmq needs pyzmq (pip install 'fastdeploy[disagg]')"
        ) from exc
    return zmq


class ZmqKVTransport(KVTransport):
    name = "zmq"

    def __init__(self) -> None:
        self._zmq = _zmq()
        self._context = self._zmq.Context()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the decode side ----------------------------------------------------------------------
    def serve(self, host: str, port: int, receiver: KVReceiver) -> int:
        socket = self._context.socket(self._zmq.ROUTER)
        socket.setsockopt(self._zmq.LINGER, 0)
        try:
            if port:
                socket.bind(f"tcp://{_bracketed(host)}:{port}")
            else:
                port = socket.bind_to_random_port(f"tcp://{_bracketed(host)}")
        except self._zmq.ZMQError as exc:
            socket.close()
            raise InvalidArgumentError(
                f"--kv-transfer-port: cannot listen on {host}:{port}: {exc}; free it or choose another"
            ) from exc
        self._thread = threading.Thread(
            target=self._receive, args=(socket, receiver), name="fastdeploy-kv-receiver", daemon=True
        )
        self._thread.start()
        return port

    def _receive(self, socket: Any, receiver: KVReceiver) -> None:
        try:
            while not self._stop.is_set():
                if not socket.poll(_POLL_MS):
                    continue
                identity, empty, kind, header, *frames = socket.recv_multipart(copy=False)
                try:
                    reply = self._answer(kind.bytes, header.bytes, frames, receiver)
                except Exception as exc:  # a bad message or a refusal: the sender hears why
                    reason = str(exc) if isinstance(exc, TransferError | InvalidArgumentError) else repr(exc)
                    reply = [b"refused", reason.encode()]
                socket.send_multipart([identity, empty, *reply])
        finally:
            socket.close()

    def _answer(self, kind: bytes, header: bytes, frames: list[Any], receiver: KVReceiver) -> list[bytes]:
        data = json.loads(header)
        if kind == b"offer":
            offer = KVOffer.from_dict(data)
            return [b"held", json.dumps({"blocks": receiver.held_blocks(offer)}).encode()]
        if kind == b"blocks":
            offer = KVOffer.from_dict(data["offer"])
            first = int(data["first"])
            arrays = wire_arrays(offer.layout, offer.num_blocks - first, [frame.buffer for frame in frames])
            receiver.accept(offer, first, arrays)
            return [b"ok", b"{}"]
        raise TransferError(f"unknown message kind {kind!r}")

    # --- the prefill side ---------------------------------------------------------------------
    def send(self, address: str, offer: KVOffer, arrays: list[np.ndarray], timeout: float) -> TransferResult:
        deadline = time.monotonic() + timeout
        socket = self._context.socket(self._zmq.REQ)
        socket.setsockopt(self._zmq.LINGER, 0)
        socket.setsockopt(self._zmq.IMMEDIATE, 1)  # queue nothing for a peer not yet connected
        try:
            socket.connect(f"tcp://{address}")
            header = offer.to_dict()
            self._send(socket, [b"offer", json.dumps(header).encode()], address, deadline, timeout)
            held = min(
                int(self._reply(socket, address, deadline, timeout).get("blocks", 0)), offer.num_blocks
            )
            parts = [np.ascontiguousarray(array[held:]) for array in arrays]
            message = json.dumps({"offer": header, "first": held}).encode()
            self._send(socket, [b"blocks", message, *parts], address, deadline, timeout)
            self._reply(socket, address, deadline, timeout)
        finally:
            socket.close()
        return TransferResult(held, offer.num_blocks - held, sum(part.nbytes for part in parts))

    def _send(self, socket: Any, parts: list[Any], address: str, deadline: float, timeout: float) -> None:
        """Send, waiting at most until `deadline` for the peer (a REQ socket waits for a connection)."""
        socket.setsockopt(self._zmq.SNDTIMEO, max(1, int((deadline - time.monotonic()) * 1000)))
        try:
            socket.send_multipart(parts, copy=False)
        except self._zmq.Again:
            raise TransferError(
                f"the KV transfer to {address} stalled: no connection within {timeout:g} s"
            ) from None

    def _reply(self, socket: Any, address: str, deadline: float, timeout: float) -> dict:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not socket.poll(int(remaining * 1000)):
            raise TransferError(f"the KV transfer to {address} stalled: no answer within {timeout:g} s")
        kind, body = socket.recv_multipart()
        if kind == b"refused":
            raise TransferError(f"{address} refused the KV blocks: {body.decode(errors='replace')}")
        return json.loads(body)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._context.term()


def _bracketed(host: str) -> str:
    """An IPv6 literal in brackets, as ZeroMQ's tcp:// endpoints want it."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
