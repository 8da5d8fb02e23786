"""The ZeroMQ KV transport on loopback: only the blocks the receiver lacks travel, refusals and
stalls come back to the sender as TransferError naming why, and a stalled peer delays no other
transfer."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.kv_layout import KVLayout
from fastdeploy.parallel.kv_transfer import KVOffer, TransferError, wire_shapes

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (the disagg extra)")
from fastdeploy.parallel.zmq_kv_transport import ZmqKVTransport  # noqa: E402

LAYOUT = KVLayout("tiny", "float32", 4, 2, 2, 8)


class Receiver:
    """Holds `held` leading blocks of every offer and records what arrives."""

    def __init__(self, held: int, refuse: str | None = None) -> None:
        self.held = held
        self.refuse = refuse
        self.accepted: list[tuple[KVOffer, int, list[np.ndarray]]] = []

    def held_blocks(self, offer: KVOffer) -> int:
        if self.refuse:
            raise TransferError(self.refuse)
        return self.held

    def accept(self, offer: KVOffer, first: int, arrays: list[np.ndarray]) -> None:
        self.accepted.append((offer, first, [array.copy() for array in arrays]))


def blocks(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in wire_shapes(LAYOUT, count)]


@pytest.fixture
def transports():
    receiving, sending = ZmqKVTransport(), ZmqKVTransport()
    yield receiving, sending
    sending.close()
    receiving.close()


def offer(count: int, transfer_id: str = "t") -> KVOffer:
    return KVOffer(transfer_id, LAYOUT, list(range(count * LAYOUT.block_size)), count)


def test_only_the_blocks_the_receiver_lacks_are_sent(transports):
    receiving, sending = transports
    receiver = Receiver(held=2)
    port = receiving.serve("127.0.0.1", 0, receiver)
    arrays = blocks(5)
    result = sending.send(f"127.0.0.1:{port}", offer(5), arrays, timeout=30)
    assert (result.blocks_held, result.blocks_sent) == (2, 3)
    # 2 layers x (keys, values) x 3 blocks x 4 slots x 2 heads x 8 dims x 4 bytes
    assert result.bytes_sent == 2 * 2 * 3 * 4 * 2 * 8 * 4
    ((received, first, got),) = receiver.accepted
    assert first == 2 and received.token_ids == list(range(20)) and received.layout == LAYOUT
    assert len(got) == 4
    for sent, arrived in zip(arrays, got, strict=True):
        np.testing.assert_array_equal(arrived, sent[2:])


def test_a_receiver_holding_everything_gets_no_block(transports):
    receiving, sending = transports
    receiver = Receiver(held=3)
    port = receiving.serve("127.0.0.1", 0, receiver)
    result = sending.send(f"127.0.0.1:{port}", offer(3), blocks(3), timeout=30)
    assert (result.blocks_held, result.blocks_sent, result.bytes_sent) == (3, 0, 0)


def test_a_refusal_reaches_the_sender_with_its_reason(transports):
    receiving, sending = transports
    port = receiving.serve("127.0.0.1", 0, Receiver(0, refuse="block_size 4 differs from 16"))
    with pytest.raises(TransferError, match="refused the KV blocks: block_size 4 differs from 16"):
        sending.send(f"127.0.0.1:{port}", offer(2), blocks(2), timeout=30)


def test_a_stalled_peer_fails_its_transfer_alone(transports):
    receiving, sending = transports
    port = receiving.serve("127.0.0.1", 0, Receiver(0))
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)  # reads the offer, never answers
    silent_port = silent.bind_to_random_port("tcp://127.0.0.1")
    errors: list[BaseException] = []

    def stalled() -> None:
        try:
            sending.send(f"127.0.0.1:{silent_port}", offer(2, "stalled"), blocks(2), timeout=2)
        except TransferError as exc:
            errors.append(exc)

    thread = threading.Thread(target=stalled)
    thread.start()
    try:
        result = sending.send(f"127.0.0.1:{port}", offer(2, "healthy"), blocks(2), timeout=30)
        assert result.blocks_sent == 2
        thread.join(timeout=30)
        assert len(errors) == 1 and "stalled: no answer within 2 s" in str(errors[0])
    finally:
        thread.join(timeout=30)
        silent.close(linger=0)
        context.term()


def test_a_port_in_use_is_refused_naming_the_flag(transports):
    receiving, sending = transports
    port = receiving.serve("127.0.0.1", 0, Receiver(0))
    with pytest.raises(Exception, match="--kv-transfer-port: cannot listen on 127.0.0.1"):
        sending.serve("127.0.0.1", port, Receiver(0))


def test_malformed_arrays_are_refused(transports):
    receiving, sending = transports
    port = receiving.serve("127.0.0.1", 0, Receiver(0))
    short = [array[:, :2] for array in blocks(2)]  # half the slots of each block
    with pytest.raises(TransferError, match="does not hold"):
        sending.send(f"127.0.0.1:{port}", offer(2), short, timeout=30)


def test_layouts_name_the_field_that_differs():
    assert LAYOUT.mismatch(KVLayout("tiny", "float32", 4, 2, 2, 8)) is None
    assert LAYOUT.mismatch(KVLayout("other", "float32", 4, 2, 2, 8)) == "model 'other' differs from 'tiny'"
    assert KVLayout.from_dict(LAYOUT.to_dict()) == LAYOUT
    with pytest.raises(ValueError, match="lacks 'block_size'"):
        KVLayout.from_dict({k: v for k, v in LAYOUT.to_dict().items() if k != "block_size"})


def test_an_offer_whose_last_block_is_partial_travels_and_a_wrong_count_is_refused(transports):
    receiving, sending = transports
    receiver = Receiver(held=1)
    port = receiving.serve("127.0.0.1", 0, receiver)
    partial = KVOffer("p", LAYOUT, list(range(2 * LAYOUT.block_size + 1)), 3)  # 2 whole blocks and 1 token
    assert KVOffer.from_dict(partial.to_dict()) == partial
    result = sending.send(f"127.0.0.1:{port}", partial, blocks(3), timeout=30)
    assert (result.blocks_held, result.blocks_sent) == (1, 2)
    ((received, first, got),) = receiver.accepted
    assert received.token_ids == list(range(9)) and first == 1 and got[0].shape[0] == 2
    with pytest.raises(
        InvalidArgumentError, match="a KV offer of 2 blocks of 4 must name 5 to 8 tokens, got 9"
    ):
        KVOffer.from_dict({**partial.to_dict(), "num_blocks": 2})
