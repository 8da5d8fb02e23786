"""Multi-head latent attention on the cuda backend's code (interpreted Triton kernels and the
reference kernels, torch-cpu) against float64 numpy with every head's keys and values formed
explicitly (`numpy_reference.latent_attention`).

TRITON_INTERPRET=1 is set by tests/backends/conftest.py. One mixed step over a latent cache in
scattered blocks: a whole prompt and a chunk after a cached prefix longer than
`ABSORB_MAX_QUERIES` (expanded), a 6-query chunk after a cached prefix (absorbed, each query
over the positions up to its own, as a speculative verify pass), and decodes (one of them long
enough for several key tiles per split); then a decode-only step, the shape a captured CUDA
graph replays. 20 heads: two head blocks of the decode kernel, the second partial.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.base import BackendOptions, BatchLayout
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.types import KVCacheSpec

torch = pytest.importorskip("torch", reason="Triton's interpreter needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")
from fastdeploy.backends.cuda import triton_latent  # noqa: E402
from fastdeploy.backends.cuda.backend import TorchCpuBackend  # noqa: E402
from fastdeploy.backends.cuda.latent_attention import latent_plan  # noqa: E402

HEADS, NOPE, ROPE, LORA, V_DIM, BLOCK = 20, 16, 8, 12, 10, 4
SCALE = 0.3
#: (cached positions before the step, query tokens of the step) per sequence
MIXED = [(0, 20), (13, 1), (5, 6), (70, 1), (37, 18)]
DECODES = [(9, 1), (75, 1), (3, 1)]


class Step:
    """A step's layout, inputs and expected outputs over histories written into the cache."""

    def __init__(self, rng, sequences, cache, tables, history):
        positions, slots, expected = [], [], []
        new_latent, new_rope = [], []
        self.q_nope = ref_normal(rng, sum(n for _, n in sequences), HEADS, NOPE)
        self.q_rope = ref_normal(rng, self.q_nope.shape[0], HEADS, ROPE)
        row = 0
        for seq, (cached, new) in enumerate(sequences):
            context = cached + new
            latent, k_rope = history(seq, context)
            pos = np.arange(context)
            seq_slots = tables[seq, pos // BLOCK] * BLOCK + pos % BLOCK
            cache[seq_slots[:cached]] = np.concatenate([latent[:cached], k_rope[:cached]], -1)
            positions.append(pos[cached:])
            slots.append(seq_slots[cached:])
            new_latent.append(latent[cached:])
            new_rope.append(k_rope[cached:])
            rows = slice(row, row + new)
            expected.append(
                ref.latent_attention(
                    self.q_nope[rows], self.q_rope[rows], latent, k_rope, ABSORB_K, ABSORB_V, SCALE
                )
            )
            row += new
        self.latent, self.k_rope = np.concatenate(new_latent), np.concatenate(new_rope)
        self.expected = np.concatenate(expected)
        self.layout = BatchLayout(
            input_ids=np.zeros(row, np.int64),
            positions=np.concatenate(positions),
            slot_mapping=np.concatenate(slots).astype(np.int64),
            query_lens=np.array([n for _, n in sequences], np.int64),
            context_lens=np.array([c + n for c, n in sequences], np.int64),
            block_tables=tables[: len(sequences)],
            logits_indices=np.zeros(0, np.int64),
            block_size=BLOCK,
        )


def ref_normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


_RNG = np.random.default_rng(29)
ABSORB_K = ref_normal(_RNG, HEADS, NOPE, LORA) * 0.5
ABSORB_V = ref_normal(_RNG, HEADS, V_DIM, LORA)


def _run(backend, sequences, splits):
    """One step through `backend.latent_attention` on a fresh cache; (output, expected)."""
    rng = np.random.default_rng(7)
    longest = max(c + n for c, n in sequences)
    max_blocks = -(-longest // BLOCK)
    num_blocks = len(sequences) * max_blocks + 2
    (layer,) = backend.allocate_kv_cache(KVCacheSpec(1, num_blocks, BLOCK, 1, LORA + ROPE, kind="latent"))
    tables = rng.permutation(num_blocks)[: len(sequences) * max_blocks].reshape(len(sequences), max_blocks)
    histories = {
        seq: (ref_normal(rng, longest, LORA), ref_normal(rng, longest, ROPE)) for seq in range(len(sequences))
    }
    host_cache = np.zeros((num_blocks * BLOCK, LORA + ROPE), np.float32)
    step = Step(rng, sequences, host_cache, tables, lambda s, n: (histories[s][0][:n], histories[s][1][:n]))
    layer[0][:] = backend.from_numpy(host_cache)
    batch = backend.prepare_batch(step.layout)
    if batch.num_decodes:
        batch.num_splits = splits
    put = backend.from_numpy
    out = backend.latent_attention(
        put(step.q_nope),
        put(step.q_rope),
        put(step.latent),
        put(step.k_rope),
        layer,
        batch,
        put(ABSORB_K),
        put(ABSORB_V),
        SCALE,
    )
    stored = backend.to_numpy(layer[0])[step.layout.slot_mapping]
    np.testing.assert_array_equal(
        stored, backend.to_numpy(put(np.concatenate([step.latent, step.k_rope], -1)))
    )
    return backend.to_numpy(out), step.expected


def test_the_mixed_step_absorbs_decodes_and_short_chunks_and_expands_long_ones():
    """Rows, sequences and visible positions of the absorbed queries; tiles of the expanded."""
    backend = TorchCpuBackend(BackendOptions(threads=1), kernels="triton")
    lengths = [n for _, n in MIXED]
    layout = BatchLayout(
        input_ids=np.zeros(sum(lengths), np.int64),
        positions=np.zeros(sum(lengths), np.int64),
        slot_mapping=np.zeros(sum(lengths), np.int64),
        query_lens=np.array(lengths, np.int64),
        context_lens=np.array([c + n for c, n in MIXED], np.int64),
        block_tables=np.arange(5 * 30).reshape(5, 30),
        logits_indices=np.zeros(0, np.int64),
        block_size=BLOCK,
    )
    plan = latent_plan(backend.rt, layout, 16)
    assert plan.entries == 8
    assert plan.rows.tolist() == [20, *range(21, 27), 27]
    assert plan.seqs.tolist() == [1, 2, 2, 2, 2, 2, 2, 3]
    assert plan.contexts.tolist() == [14, 6, 7, 8, 9, 10, 11, 71]
    assert plan.tile_seq.tolist() == [0, 0, 4, 4] and plan.tile_offset.tolist() == [0, 16, 0, 16]
    # sequence 0's 5 blocks (20 positions), then sequence 4's 14 (55 positions), gathered in order
    assert plan.block_tables[0, :5].tolist() == list(range(5)) and plan.block_tables[4, :14].tolist() == [
        5 + i for i in range(14)
    ]
    assert plan.slots.tolist()[:BLOCK] == list(range(BLOCK))
    assert plan.slots.tolist()[5 * BLOCK] == 4 * 30 * BLOCK


@pytest.mark.parametrize("sequences", [MIXED, DECODES], ids=["mixed", "decode-only"])
@pytest.mark.parametrize(("kernels", "splits"), [("triton", 1), ("triton", 4), ("reference", 1)])
def test_latent_attention_matches_explicit_keys_and_values(kernels, splits, sequences):
    backend = TorchCpuBackend(BackendOptions(threads=1), kernels=kernels)
    out, expected = _run(backend, sequences, splits)
    np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize(
    ("kernels", "dtype"),
    # Triton 3.8's interpreter multiplies bfloat16 operands of tl.dot as their raw uint16 bits:
    # the Triton kernels' bfloat16 runs only on a GPU (tools/gpu_check.py)
    [("triton", "float16"), ("reference", "bfloat16"), ("reference", "float16")],
)
def test_16_bit_caches_within_their_rounding(kernels, dtype):
    backend = TorchCpuBackend(BackendOptions(threads=1, dtype=dtype), kernels=kernels)
    out, expected = _run(backend, MIXED, 2)
    assert np.abs(out - expected).max() <= 0.02 * np.abs(expected).max()


def test_decode_kernel_skips_padded_rows_and_their_slots():
    """A CUDA-graph padding row: slot -1 writes nothing, context 0 gives zeros (with splits too)."""
    rng = np.random.default_rng(3)
    cache = torch.zeros(8 * BLOCK, LORA + ROPE)
    latent, k_rope = torch.from_numpy(ref_normal(rng, 2, LORA)), torch.from_numpy(ref_normal(rng, 2, ROPE))
    triton_latent.store_latent(latent, k_rope, cache, torch.tensor([5, -1]))
    assert torch.equal(cache[5], torch.cat([latent[0], k_rope[0]]))
    assert int(torch.count_nonzero(cache)) == int(torch.count_nonzero(cache[5]))
    for splits in (1, 2):
        mixed = torch.full((2, HEADS, LORA), float("nan"))
        triton_latent.latent_decode(
            torch.from_numpy(ref_normal(rng, 2, HEADS, LORA)),
            torch.from_numpy(ref_normal(rng, 2, HEADS, ROPE)),
            cache,
            mixed,
            torch.tensor([[1, 0], [2, 0]], dtype=torch.int32),
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([3, 0], dtype=torch.int32),
            torch.empty(2, HEADS, splits, LORA),
            torch.empty(2, HEADS, splits),
            SCALE,
            BLOCK,
            splits,
        )
        assert torch.isfinite(mixed[0]).all()
        assert torch.equal(mixed[1], torch.zeros(HEADS, LORA))
