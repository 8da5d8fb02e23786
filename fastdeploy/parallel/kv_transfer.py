"""Moving KV blocks from a prefill instance to a decode instance: the interface a transport
implements, and what crosses it.

A transfer is two exchanges. The prefill side offers the blocks (`KVOffer`: the layout
descriptor, the prompt tokens the blocks hold, how many blocks, the last one possibly partial);
the decode side answers how many leading whole blocks of that prompt it already holds in its
prefix cache (`KVReceiver.held_blocks`).
The prefill side then sends only the blocks after those, and the decode side takes them
(`KVReceiver.accept`) or refuses them (a layout that differs from its own). Blocks travel as one
array per layer and kind in the layout's order (`wire_arrays`); a transport moves the bytes.

The built-in transport is ZeroMQ over TCP (`parallel/zmq_kv_transport.py`). A device plugin
registers its own (RDMA, NVLink, HCCL) under a name through the `fastdeploy_kv_transports` hook,
and `fastdeploy serve --kv-transport NAME` picks it; docs/plugins.md describes the contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from fastdeploy.errors import FastDeployError, InvalidArgumentError
from fastdeploy.kv_layout import WIRE_DTYPES, KVLayout


class TransferError(FastDeployError, RuntimeError):
    """A transfer failed: the peer refused it, could not be reached, or stalled past the timeout."""


@dataclass
class KVOffer:
    """The blocks a prefill instance offers: which prompt they belong to and what they look like."""

    transfer_id: str
    layout: KVLayout
    #: the prompt tokens whose keys and values the blocks hold, in `num_blocks` blocks: the last
    #: block holds fewer than `block_size` of them when their number is not a multiple of it
    token_ids: list[int]
    num_blocks: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "transfer_id": self.transfer_id,
            "layout": self.layout.to_dict(),
            "token_ids": list(self.token_ids),
            "num_blocks": self.num_blocks,
        }

    @classmethod
    def from_dict(cls, data: Any) -> KVOffer:
        """An offer a peer sent; InvalidArgumentError naming what is wrong with it."""
        if not isinstance(data, dict):
            raise InvalidArgumentError("a KV offer must be a JSON object")
        layout = KVLayout.from_dict(data.get("layout"))
        tokens, count = data.get("token_ids"), data.get("num_blocks")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise InvalidArgumentError("a KV offer's token_ids must be a list of ints")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgumentError("a KV offer's num_blocks must be an int >= 0")
        size = layout.block_size
        if -(-len(tokens) // size) != count:
            raise InvalidArgumentError(
                f"a KV offer of {count} blocks of {size} must name {max(0, count - 1) * size + min(count, 1)}"
                f" to {count * size} tokens, got {len(tokens)}"
            )
        return cls(str(data.get("transfer_id", "")), layout, tokens, count)


@dataclass
class TransferResult:
    """What a finished transfer moved."""

    #: leading blocks the decode instance already held (not sent)
    blocks_held: int
    blocks_sent: int
    bytes_sent: int


class KVReceiver(Protocol):
    """The decode instance's side of a transfer (the engine implements it; a transport calls it
    from its own thread)."""

    def held_blocks(self, offer: KVOffer) -> int:
        """How many leading blocks of the offer this instance already holds (they are not sent).
        Raises TransferError if it refuses the offer (a layout other than its own)."""

    def accept(self, offer: KVOffer, first_block: int, arrays: list[np.ndarray]) -> None:
        """Take blocks `first_block`.. of the offer (`wire_arrays` order, each array's first axis
        the blocks). Raises TransferError to refuse them."""


class KVTransport(ABC):
    """Moves KV blocks between instances; one object per process, used from several threads."""

    #: the name `--kv-transport` selects it by
    name: ClassVar[str]

    @abstractmethod
    def serve(self, host: str, port: int, receiver: KVReceiver) -> int:
        """Start receiving transfers on `host`:`port` (0: a free port) in the background, handing
        them to `receiver`; returns the port. Raises InvalidArgumentError if it cannot listen."""

    @abstractmethod
    def send(self, address: str, offer: KVOffer, arrays: list[np.ndarray], timeout: float) -> TransferResult:
        """Offer `offer` to the instance receiving at `address` (`host:port`), then send the blocks
        it does not hold (`arrays`: every offered block, in `wire_arrays` order). Raises
        TransferError when the peer refuses, cannot be reached, or the transfer takes longer than
        `timeout` seconds in all."""

    @abstractmethod
    def close(self) -> None:
        """Stop receiving and release sockets (transfers in flight fail)."""


def wire_shapes(layout: KVLayout, num_blocks: int) -> list[tuple[tuple[int, ...], np.dtype]]:
    """Shape and element type of each array of `num_blocks` blocks in the built-in layout, in
    order: per layer keys, values, then (int8) key scales and value scales."""
    data = (
        (num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim),
        np.dtype(WIRE_DTYPES[layout.dtype]),
    )
    scales = ((num_blocks, layout.block_size, layout.num_kv_heads), np.dtype("<f4"))
    per_layer = [data, data, scales, scales] if layout.dtype == "int8" else [data, data]
    return per_layer * layout.num_layers


def wire_arrays(layout: KVLayout, num_blocks: int, buffers: list[Any]) -> list[np.ndarray]:
    """The arrays of `num_blocks` blocks read from received `buffers` (one per array, any object
    with the buffer protocol); TransferError if their number or sizes do not fit the layout."""
    shapes = wire_shapes(layout, num_blocks)
    if len(buffers) != len(shapes):
        raise TransferError(f"expected {len(shapes)} arrays for {num_blocks} blocks, got {len(buffers)}")
    arrays = []
    for buffer, (shape, dtype) in zip(buffers, shapes, strict=True):
        array = np.frombuffer(buffer, dtype)
        if array.size != int(np.prod(shape)):
            raise TransferError(f"a KV array of {array.nbytes} bytes does not hold {shape} {dtype.name}")
        arrays.append(array.reshape(shape))
    return arrays
