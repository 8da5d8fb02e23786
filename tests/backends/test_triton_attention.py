"""The FlashAttention-style prefill and split-KV decode kernels, interpreted, against float64 numpy.

TRITON_INTERPRET=1 is set by tests/backends/conftest.py. One mixed step: decodes (one of them a
one-token prompt), a full prefill spanning two query tiles, and a chunk after a cached prefix
whose first query sits exactly on a key-tile edge; KV blocks scattered over the cache.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.conformance import numpy_reference as ref

torch = pytest.importorskip("torch", reason="Triton's interpreter needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")
from fastdeploy.backends.base import BatchLayout  # noqa: E402
from fastdeploy.backends.cuda import triton_attention as attention  # noqa: E402
from fastdeploy.backends.cuda.attention_metadata import build_host_metadata  # noqa: E402
from fastdeploy.backends.cuda.launch import LARGE_SHARED_MEMORY  # noqa: E402

#: (cached positions before this step, query tokens this step) per sequence
SEQUENCES = [(69, 1), (0, 1), (0, 70), (63, 65), (130, 1)]


def tensor(array):
    return torch.from_numpy(np.ascontiguousarray(array))


def _step(heads, kv_heads, head_dim, block=8, seed=0, sinks=None, window=0, softcap=0.0):
    """One mixed step and its float64 attention. With a window, the cache slots of positions
    no query of the step sees are NaN: a kernel that read them would give NaN."""
    rng = np.random.default_rng(seed)
    contexts = [cached + new for cached, new in SEQUENCES]
    max_blocks = -(-max(contexts) // block)
    num_blocks = sum(-(-c // block) for c in contexts) + 3
    free = list(rng.permutation(num_blocks))
    tables = np.zeros((len(SEQUENCES), max_blocks), np.int64)
    key_cache = np.zeros((num_blocks * block, kv_heads, head_dim), np.float32)
    value_cache = np.zeros_like(key_cache)
    history, slots, positions = [], [], []
    for seq, ((cached, _new), context) in enumerate(zip(SEQUENCES, contexts, strict=True)):
        count = -(-context // block)
        tables[seq, :count] = [free.pop() for _ in range(count)]
        keys, values = rng.standard_normal((2, context, kv_heads, head_dim)).astype(np.float32)
        pos = np.arange(context)
        seq_slots = tables[seq, pos // block] * block + pos % block
        key_cache[seq_slots], value_cache[seq_slots] = keys, values  # this step's keys already stored
        if window:
            unseen = seq_slots[: max(cached + 1 - window, 0)]
            key_cache[unseen] = value_cache[unseen] = np.nan
        history.append((keys, values))
        slots.append(seq_slots[cached:])
        positions.append(pos[cached:])
    layout = BatchLayout(
        input_ids=np.zeros(sum(n for _, n in SEQUENCES), np.int64),
        positions=np.concatenate(positions),
        slot_mapping=np.concatenate(slots),
        query_lens=np.array([n for _, n in SEQUENCES], np.int64),
        context_lens=np.array(contexts, np.int64),
        block_tables=tables,
        logits_indices=np.zeros(0, np.int64),
        block_size=block,
    )
    q = rng.standard_normal((layout.input_ids.size, heads, head_dim)).astype(np.float32)
    expected, start = [], 0
    for (_, new), (keys, values) in zip(SEQUENCES, history, strict=True):
        expected.append(
            ref.causal_attention(q[start : start + new], keys, values, head_dim**-0.5, sinks, window, softcap)
        )
        start += new
    return layout, q, key_cache, value_cache, np.concatenate(expected)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "num_splits", "hopper_tiles"),
    [
        (9, 3, 64, 1, False),
        (9, 3, 64, 4, False),
        (4, 4, 24, 4, False),
        (8, 2, 16, 1, False),
        (9, 3, 64, 1, True),
    ],
)
def test_prefill_and_decode_kernels_match_float64_attention(
    heads, kv_heads, head_dim, num_splits, hopper_tiles, monkeypatch
):
    if hopper_tiles:  # the 128-key tiles 16-bit models take on Hopper, here over float32 data
        options = attention.prefill_launch_options(False, head_dim, LARGE_SHARED_MEMORY)
        assert options["BLOCK_N"] == 128
        monkeypatch.setattr(attention, "prefill_launch_options", lambda *_: options)
    _check_step(heads, kv_heads, head_dim, num_splits)


def _check_step(heads, kv_heads, head_dim, num_splits, sinks=None, window=0, softcap=0.0):
    layout, q, key_cache, value_cache, expected = _step(
        heads, kv_heads, head_dim, sinks=sinks, window=window, softcap=softcap
    )
    meta = build_host_metadata(layout, attention.prefill_block_m(is_float32=True))
    assert meta.tile_seq.tolist() == [2, 2, 3, 3] and meta.decode_seq.tolist() == [0, 1, 4]
    extra = {"sinks": tensor(sinks) if sinks is not None else None, "window": window, "softcap": softcap}
    out = np.full_like(q, np.nan)
    common = (tensor(q), tensor(key_cache), tensor(value_cache), tensor(out), tensor(meta.block_tables))
    attention.prefill_attention(
        *common,
        tensor(meta.seq_query_start),
        tensor(meta.seq_query_len),
        tensor(meta.seq_context_len),
        tensor(meta.tile_seq),
        tensor(meta.tile_offset),
        head_dim**-0.5,
        layout.block_size,
        **extra,
    )
    decoded = meta.decode_token
    assert np.isnan(out[decoded]).all()  # the prefill kernel leaves decode rows alone
    decodes = decoded.size
    partial_out = np.zeros((decodes, heads, num_splits, head_dim), np.float32)
    partial_lse = np.zeros((decodes, heads, num_splits), np.float32)
    attention.decode_attention(
        *common,
        tensor(meta.decode_token),
        tensor(meta.decode_seq),
        tensor(meta.seq_context_len),
        tensor(partial_out),
        tensor(partial_lse),
        head_dim**-0.5,
        layout.block_size,
        num_splits,
        **extra,
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


#: per query head: large (the head attends to almost nothing), small, and in between
SINKS = np.array([9.0, -3.0, 0.5, 2.0, -0.5, 4.0, 1.0, -8.0, 3.0], np.float32)


@pytest.mark.parametrize(
    ("window", "sinks", "num_splits", "hopper_tiles", "softcap"),
    [
        (1, False, 1, False, 0.0),  # each query sees itself only
        (5, False, 4, False, 0.0),  # inside one 8-slot block
        (20, False, 1, False, 0.0),  # across blocks, narrower than a query tile: late rows skip whole tiles
        (20, True, 4, False, 0.0),
        (70, True, 1, True, 0.0),  # wider than a query tile: tiles every row sees run unmasked
        (100, False, 4, False, 0.0),
        (1000, False, 1, False, 0.0),  # wider than every context: plain causal attention
        (0, True, 1, False, 0.0),  # sinks alone
        (0, True, 4, True, 0.0),
        (0, False, 1, False, 1.5),  # soft-capped scores (Gemma 2): the cap binds (scores reach ~+-4)
        (20, False, 4, False, 1.5),  # Gemma 2's sliding layers cap and slide
        (0, False, 4, True, 1.5),
    ],
)
def test_windows_sinks_and_softcap_match_float64_attention(
    window, sinks, num_splits, hopper_tiles, softcap, monkeypatch
):
    """GQA (9 query heads over 3 KV heads); the NaN outside every window proves the skipped
    positions are never read."""
    if hopper_tiles:
        options = attention.prefill_launch_options(False, 64, LARGE_SHARED_MEMORY)
        monkeypatch.setattr(attention, "prefill_launch_options", lambda *_: options)
    _check_step(9, 3, 64, num_splits, SINKS if sinks else None, window, softcap)


def test_decode_split_count_fills_the_gpu_and_stays_a_power_of_two():
    assert attention.decode_splits(256, 8, 2048, 132) == 1  # 2048 programs already
    assert attention.decode_splits(1, 8, 2048, 132) == 8  # 33 wanted, 8 by the 256-position floor
    assert attention.decode_splits(1, 8, 100_000, 132) == 64
    assert attention.decode_splits(4, 2, 300, 132) == 1  # too short to split
    for decodes in range(1, 300, 7):
        splits = attention.decode_splits(decodes, 8, 4096, 132)
        assert splits & (splits - 1) == 0
