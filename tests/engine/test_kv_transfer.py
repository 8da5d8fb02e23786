"""Prefill/decode disaggregation in the engine: a prefill engine sends a prompt's KV blocks over the
ZeroMQ transport (loopback) to a decode engine, which generates what one mixed engine generates,
takes blocks it already holds from its prefix cache instead of the wire, and keeps no block after.

Three engines of the embedded SmolLM2 in this process: mixed (the reference), prefill, decode."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine import kv_transfer
from fastdeploy.engine.kv_transfer import KVExport, KVImport
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.parallel.kv_transfer import TransferError

zmq_transport = pytest.importorskip("fastdeploy.parallel.zmq_kv_transport", reason="pyzmq is not installed")

BLOCK = 16
OPTIONS = {"max_model_len": 512, "block_size": BLOCK, "max_num_seqs": 8}
LONG = (
    "The history of the printing press begins in the fifteenth century, when movable type changed how "
    "books were made across Europe. Before it, every copy of a text was written by hand. Explain"
)


@pytest.fixture(scope="module")
def engines():
    mixed = LLM(**OPTIONS)
    prefill = LLM(**OPTIONS, splitwise_role="prefill")
    decode = LLM(**OPTIONS, splitwise_role="decode")
    receiving = zmq_transport.ZmqKVTransport()
    sending = zmq_transport.ZmqKVTransport()
    port = receiving.serve("127.0.0.1", 0, decode.llm_engine.kv_transfer)
    prefill.llm_engine.kv_transfer.transport = sending
    try:
        yield mixed, prefill, decode, f"127.0.0.1:{port}"
    finally:
        prefill.llm_engine.kv_transfer.close()
        sending.close()
        receiving.close()


def run(engine, request_id: str, token_ids: list[int], max_tokens: int):
    """Greedy generation of `token_ids` on `engine`: the finished RequestOutput."""
    engine.add_request(request_id, token_ids, SamplingParams(max_tokens=max_tokens, temperature=0))
    finished = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished and output.request_id == request_id:
                finished = output
    assert finished is not None and finished.error_code == 200, finished
    return finished


def disaggregated(prefill, decode, address: str, request_id: str, token_ids: list[int], max_tokens: int):
    """Prefill on one engine (its KV blocks sent to `address`), generate on the other."""
    transfer = prefill.llm_engine.kv_transfer.expect(request_id, address)
    run(prefill.llm_engine, request_id, token_ids, 1)
    result = transfer.result(timeout=60)
    return result, run(decode.llm_engine, request_id, token_ids, max_tokens)


def assert_no_block_kept(*llms):
    for llm in llms:
        engine = llm.llm_engine
        engine.step()  # a decode engine lets go of received blocks before it schedules
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        if isinstance(engine.kv_transfer, KVImport):
            assert engine.kv_transfer.held == 0
        if isinstance(engine.kv_transfer, KVExport):
            assert engine.kv_transfer.in_flight == 0


def test_roles_build_their_sides(engines):
    mixed, prefill, decode, _ = engines
    assert mixed.llm_engine.kv_transfer is None
    assert isinstance(prefill.llm_engine.kv_transfer, KVExport)
    assert isinstance(decode.llm_engine.kv_transfer, KVImport)


def test_decode_continues_from_the_sent_blocks_with_the_mixed_engines_tokens(engines):
    mixed, prefill, decode, address = engines
    tokens = mixed.llm_engine.tokenizer.encode(LONG)
    expected = run(mixed.llm_engine, "ref", tokens, 24).outputs[0].token_ids
    result, output = disaggregated(prefill, decode, address, "one", tokens, 24)
    whole, tail = divmod(len(tokens) - 1, BLOCK)  # the tokens before the last one
    assert whole >= 2 and tail > 0
    assert (result.blocks_held, result.blocks_sent) == (0, whole + 1)  # the partial block travelled too
    assert output.outputs[0].token_ids == expected
    assert output.num_cached_tokens == len(tokens) - 1  # the decode engine computed only the last token
    assert_no_block_kept(prefill, decode)


def test_blocks_the_decode_engine_holds_are_not_sent_again(engines):
    mixed, prefill, decode, address = engines
    tokenizer = mixed.llm_engine.tokenizer
    first = tokenizer.encode(LONG + " the first part.")
    second = first[: 2 * BLOCK] + tokenizer.encode(
        " A different ending about something else entirely, at length."
    )
    disaggregated(prefill, decode, address, "first", first, 4)
    expected = run(mixed.llm_engine, "ref2", second, 12).outputs[0].token_ids
    result, output = disaggregated(prefill, decode, address, "second", second, 12)
    offered = -(-(len(second) - 1) // BLOCK)  # every block before the last token, a partial one too
    assert result.blocks_held == 2 and result.blocks_sent == offered - 2
    layout = decode.llm_engine.kv_transfer.layout
    per_block = 2 * layout.num_layers * BLOCK * layout.num_kv_heads * layout.head_dim * 4  # float32 K and V
    assert result.bytes_sent == result.blocks_sent * per_block
    assert output.outputs[0].token_ids == expected
    assert_no_block_kept(prefill, decode)


def test_a_decode_engine_with_another_block_size_refuses_the_blocks_and_the_prefill_is_unharmed(engines):
    mixed, prefill, _, _ = engines
    other = LLM(**{**OPTIONS, "block_size": 32}, splitwise_role="decode")
    receiving = zmq_transport.ZmqKVTransport()
    port = receiving.serve("127.0.0.1", 0, other.llm_engine.kv_transfer)
    try:
        tokens = mixed.llm_engine.tokenizer.encode(LONG)
        transfer = prefill.llm_engine.kv_transfer.expect("mismatch", f"127.0.0.1:{port}")
        run(prefill.llm_engine, "mismatch", tokens, 1)
        with pytest.raises(TransferError, match="block_size 16 differs from 32"):
            transfer.result(timeout=60)
    finally:
        receiving.close()
    assert_no_block_kept(prefill, other)


def test_a_stalled_transfer_fails_its_request_alone(engines):
    mixed, prefill, decode, address = engines
    zmq = pytest.importorskip("zmq")
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)  # takes the offer and never answers
    silent_port = silent.bind_to_random_port("tcp://127.0.0.1")
    export = prefill.llm_engine.kv_transfer
    timeout, export.timeout = export.timeout, 1.0
    try:
        tokens = mixed.llm_engine.tokenizer.encode(LONG)
        stalled = export.expect("stalled", f"127.0.0.1:{silent_port}")
        healthy = export.expect("healthy", address)
        prefill.llm_engine.add_request("stalled", tokens, SamplingParams(max_tokens=1, temperature=0))
        run(prefill.llm_engine, "healthy", tokens[:-3], 1)
        with pytest.raises(TransferError, match="stalled"):
            stalled.result(timeout=30)
        assert healthy.result(timeout=30).blocks_sent + healthy.result().blocks_held == -(
            -(len(tokens) - 4) // BLOCK
        )
    finally:
        export.timeout = timeout
        silent.close(linger=0)
        context.term()
    assert_no_block_kept(prefill)


def test_a_request_that_ends_before_its_prompt_is_computed_fails_its_transfer(engines):
    _, prefill, _, address = engines
    transfer = prefill.llm_engine.kv_transfer.expect("aborted", address)
    prefill.llm_engine.add_request("aborted", [1, 2, 3] * 20, SamplingParams(max_tokens=1))
    prefill.llm_engine.abort_request("aborted")
    with pytest.raises(TransferError, match="ended before"):
        transfer.result(timeout=5)
    assert_no_block_kept(prefill)


def test_decode_role_needs_prefix_caching():
    with pytest.raises(InvalidArgumentError, match="--splitwise-role decode.*--no-enable-prefix-caching"):
        LLM(**OPTIONS, splitwise_role="decode", enable_prefix_caching=False)


def test_unknown_role_is_refused_naming_the_flag():
    with pytest.raises(InvalidArgumentError, match="--splitwise-role must be one of mixed, prefill, decode"):
        LLM(**OPTIONS, splitwise_role="both")


def test_received_blocks_nobody_takes_are_let_go_after_the_hold_time(engines, monkeypatch):
    _, prefill, decode, address = engines
    tokens = [int(t) for t in np.arange(100, 100 + 3 * BLOCK + 1)]
    transfer = prefill.llm_engine.kv_transfer.expect("unclaimed", address)
    run(prefill.llm_engine, "unclaimed", tokens, 1)
    assert transfer.result(timeout=60).blocks_sent == 3
    importer = decode.llm_engine.kv_transfer
    decode.llm_engine.step()  # imported into the cache, held for the request that never comes
    assert importer.held >= 3  # (with any a test before left unclaimed)
    later = kv_transfer.time.monotonic() + importer.hold_seconds + 1
    monkeypatch.setattr(kv_transfer.time, "monotonic", lambda: later)
    assert_no_block_kept(decode)
    # let go, the blocks stay in the prefix cache: the same prompt now finds them there
    assert decode.llm_engine.block_manager.cached_prefix(tokens[: 3 * BLOCK]) != []


def test_an_unclaimed_partial_block_is_freed_after_the_hold_time(engines, monkeypatch):
    _, prefill, decode, address = engines
    tokens = [int(t) for t in np.arange(300, 300 + 2 * BLOCK + 6)]  # 2 whole blocks and 5 tokens
    transfer = prefill.llm_engine.kv_transfer.expect("unclaimed-tail", address)
    run(prefill.llm_engine, "unclaimed-tail", tokens, 1)
    assert transfer.result(timeout=60).blocks_sent == 3
    importer = decode.llm_engine.kv_transfer
    decode.llm_engine.step()
    assert importer.held >= 3
    later = kv_transfer.time.monotonic() + importer.hold_seconds + 1
    monkeypatch.setattr(kv_transfer.time, "monotonic", lambda: later)
    assert_no_block_kept(decode)  # the partial block too: it is in no cache, so it is free


def test_the_same_prompt_twice_at_once_gives_each_request_its_partial_block(engines):
    mixed, prefill, decode, address = engines
    tokens = mixed.llm_engine.tokenizer.encode(LONG + " twice")
    assert (len(tokens) - 1) % BLOCK
    expected = run(mixed.llm_engine, "ref-twice", tokens, 8).outputs[0].token_ids
    transfers = [prefill.llm_engine.kv_transfer.expect(name, address) for name in ("a", "b")]
    for name in ("a", "b"):
        prefill.llm_engine.add_request(name, tokens, SamplingParams(max_tokens=1, temperature=0))
    while prefill.llm_engine.has_unfinished_requests():
        prefill.llm_engine.step()
    for transfer in transfers:
        transfer.result(timeout=60)
    params = SamplingParams(max_tokens=8, temperature=0)
    decode.llm_engine.step()  # both imports land before the requests arrive
    for name in ("a", "b"):
        decode.llm_engine.add_request(name, tokens, params)
    outputs = {}
    while decode.llm_engine.has_unfinished_requests():
        for output in decode.llm_engine.step():
            if output.finished:
                outputs[output.request_id] = output
    assert [outputs[name].outputs[0].token_ids for name in ("a", "b")] == [expected, expected]
    assert [outputs[name].num_cached_tokens for name in ("a", "b")] == [len(tokens) - 1] * 2
    assert_no_block_kept(prefill, decode)
