"""The server's part in prefill/decode disaggregation (`fastdeploy serve --splitwise-role`).

A decode instance receives KV blocks on its transport's port; a prefill instance, given a
request whose `kv_transfer_params` name a decode instance's address (`fastdeploy router` adds
them), computes the prompt, sends its blocks there and answers only once they have arrived, so
the router may then send the request to the decode instance. `GET /v1/disaggregation` says what
a router needs to pair instances (role, KV layout, transfer port) and what the instance holds.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.kv_transfer import KVExport, KVImport
from fastdeploy.entrypoints.openai.errors import OpenAIError, invalid_request
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger
from fastdeploy.parallel.kv_transfer import KVTransport, TransferError
from fastdeploy.plugins.registry import get_registry

logger = get_logger(__name__)


def make_transport(name: str) -> KVTransport:
    """The registered KV transport called `name` (`--kv-transport`)."""
    transports = get_registry().kv_transports()
    if name not in transports:
        known = ", ".join(sorted(transports)) or "none"
        raise InvalidArgumentError(f"--kv-transport {name!r} is not registered (registered: {known})")
    return transports[name]()


class Disaggregation:
    """The transport of a prefill or decode instance and the engine side it serves."""

    def __init__(self, engine: LLMEngine, transport: KVTransport, host: str, port: int) -> None:
        self.engine = engine
        self.role = engine.config.splitwise_role
        self.side: KVExport | KVImport = engine.kv_transfer
        self.transport = transport
        self.timeout = engine.config.kv_transfer_timeout
        self.port: int | None = None
        if isinstance(self.side, KVImport):
            self.port = transport.serve(host, port, self.side)
            logger.info("receiving KV blocks on port %d (%s)", self.port, transport.name)
        else:
            self.side.transport = transport

    def info(self) -> dict[str, Any]:
        """What /v1/disaggregation answers."""
        manager = self.engine.block_manager
        answer: dict[str, Any] = {
            "role": self.role,
            "kv_transport": self.transport.name,
            "kv_port": self.port,
            "kv_layout": self.side.layout.to_dict(),
            "kv_blocks": {"total": manager.num_blocks, "free": manager.num_free_blocks},
        }
        if isinstance(self.side, KVImport):
            answer["kv_blocks"].update(held=self.side.held, received=self.side.blocks_received)
        else:
            answer["transfers_in_flight"] = self.side.in_flight
        return answer

    def target(self, params: Any, stream: bool) -> str | None:
        """The decode address of a request's `kv_transfer_params` (None: an ordinary request);
        400 if this instance cannot act on them."""
        if params is None:
            return None
        address = params.get("decode_address") if isinstance(params, dict) else None
        if not isinstance(address, str) or not address:
            raise invalid_request(
                "kv_transfer_params must be an object naming decode_address (host:port)",
                param="kv_transfer_params",
            )
        if not isinstance(self.side, KVExport):
            raise invalid_request(
                f"kv_transfer_params are for prefill instances; this one is {self.role}",
                param="kv_transfer_params",
            )
        if stream:
            raise invalid_request("a prefill request with kv_transfer_params cannot stream", param="stream")
        return address

    def expect(self, request_ids: list[str], address: str) -> list[Future]:
        return [self.side.expect(request_id, address) for request_id in request_ids]

    def forget(self, request_ids: list[str]) -> None:
        """Drop the transfers of requests that ended without running (refused, failed)."""
        for request_id in request_ids:
            self.side.forget(request_id)

    async def outcome(self, transfers: list[Future]) -> dict[str, int]:
        """The summed `TransferResult`s; 504 naming the failure if a transfer failed or stalled."""
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(asyncio.wrap_future(future) for future in transfers)), self.timeout + 5
            )
        except (TransferError, TimeoutError) as exc:
            raise OpenAIError(
                504, f"KV transfer failed: {exc or 'timed out'}", code="kv_transfer_failed"
            ) from exc
        return {
            "blocks_held": sum(result.blocks_held for result in results),
            "blocks_sent": sum(result.blocks_sent for result in results),
            "bytes_sent": sum(result.bytes_sent for result in results),
        }

    def close(self) -> None:
        if isinstance(self.side, KVExport):
            self.side.close()
        self.transport.close()


def build_disaggregation(engine: Any, host: str, port: int) -> Disaggregation | None:
    """The disaggregation part of a server whose engine is a prefill or decode instance."""
    inner: LLMEngine = engine.engine
    if inner.kv_transfer is None:
        return None
    return Disaggregation(inner, make_transport(inner.config.kv_transport), host, port)
