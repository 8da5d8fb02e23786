"""paddle's TCPStore client sends each request in several small writes without TCP_NODELAY, so
every request waited 40 ms for a delayed acknowledgement; the communicator turns the option on
for the connections to the store's address, and leaves other connections alone."""

from __future__ import annotations

import socket
import sys

import pytest

from fastdeploy.parallel.paddle_communicator import _no_delay

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="finds the socket in /proc/self/fd"
)


def no_delay(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def test_connections_to_the_store_address_get_tcp_nodelay_and_others_do_not():
    with socket.create_server(("127.0.0.1", 0)) as store, socket.create_server(("127.0.0.1", 0)) as other:
        store_port, other_port = store.getsockname()[1], other.getsockname()[1]
        with (
            socket.create_connection(("127.0.0.1", store_port)) as client,
            socket.create_connection(("127.0.0.1", other_port)) as bystander,
        ):
            assert not no_delay(client) and not no_delay(bystander)
            _no_delay(f"127.0.0.1:{store_port}")
            assert no_delay(client)
            assert not no_delay(bystander)
            client.sendall(b"still open")  # the descriptor was borrowed, not closed
