"""A rank's shard of each kind of weight, checked against slicing the full float32 tensor.

No processes here: each rank's share is computed in this process, and the shares are summed or
joined by hand where the ranks' collectives would do it.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from fastdeploy.backends.base import Backend, BackendOptions
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.weight_only import WeightOnlyTensor, quantize_weight_only
from fastdeploy.parallel.model_parallel import ModelParallel
from fastdeploy.parallel.sharding import pad_rows, take_columns, take_rows
from fastdeploy.parallel.topology import ParallelLayout

RNG = np.random.default_rng(16)


def ggml(matrix: np.ndarray, kind: GGMLQuantizationType) -> GGMLTensor:
    return GGMLTensor(int(kind), quantize(matrix, kind), matrix.shape)


@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_gguf_rows_and_block_aligned_columns_stay_in_blocks(kind):
    tensor = ggml(RNG.standard_normal((12, 128)).astype(np.float32), kind)
    full = np.asarray(tensor)
    rows = take_rows(tensor, range(4, 10))
    assert isinstance(rows, GGMLTensor) and rows.shape == (6, 128)
    np.testing.assert_array_equal(np.asarray(rows), full[4:10])
    columns = take_columns(tensor, range(32, 96))
    assert isinstance(columns, GGMLTensor) and columns.shape == (12, 64)
    np.testing.assert_array_equal(np.asarray(columns), full[:, 32:96])
    # a cut inside a block: dequantised, then sliced
    unaligned = take_columns(tensor, range(40, 100))
    assert isinstance(unaligned, np.ndarray)
    np.testing.assert_array_equal(unaligned, full[:, 40:100])


@pytest.mark.parametrize(
    "kind",
    [
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.F16,
    ],
)
def test_gguf_rows_are_padded_with_zero_rows_in_blocks(kind):
    tensor = ggml(RNG.standard_normal((5, 64)).astype(np.float32), kind)
    padded = pad_rows(tensor, 8)
    assert isinstance(padded, GGMLTensor) and padded.shape == (8, 64)
    expected = np.concatenate([np.asarray(tensor), np.zeros((3, 64), np.float32)])
    np.testing.assert_array_equal(np.asarray(padded), expected)
    # and as gguf itself reads the padded blocks
    np.testing.assert_array_equal(dequantize(padded.rows, kind).reshape(8, 64), expected)


@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_a_gguf_vocabulary_shard_embeds_like_the_full_table(kind):
    backend = CpuBackend(BackendOptions(threads=1))
    table = ggml(RNG.standard_normal((96, 32)).astype(np.float32), kind)
    ids = np.array([0, 95, 40, 31, 64], dtype=np.int64)
    shares = [
        parallel.vocab_embedding(backend, ids, parallel.vocab_embedding_table(backend, table))
        for parallel in ranks(3)
    ]
    np.testing.assert_array_equal(sum(shares), np.asarray(table)[ids])


class SumLater:
    """A communicator stand-in: collectives return this rank's share, the test combines them."""

    def all_reduce(self, x, group):
        return x

    def all_gather(self, x, group):
        return x


def ranks(size: int) -> list[ModelParallel]:
    return [ModelParallel(ParallelLayout(size), rank, SumLater()) for rank in range(size)]


@pytest.mark.parametrize(("vocab", "size"), [(160, 2), (10, 4), (49152, 3)])
def test_vocabulary_parallel_embedding_sums_to_the_full_lookup(vocab, size):
    backend = CpuBackend(BackendOptions(threads=1))
    table = RNG.standard_normal((vocab, 8)).astype(np.float32)
    ids = np.array([0, vocab - 1, 3, vocab // 2, 3], dtype=np.int64)
    shares = []
    for parallel in ranks(size):
        local = parallel.vocab_embedding_table(backend, table)
        assert local.shape == (-(-vocab // size) + 1, 8)  # its rows, padded, plus the zero row
        shares.append(parallel.vocab_embedding(backend, ids, local))
    np.testing.assert_array_equal(sum(shares), table[ids])


@pytest.mark.parametrize(("vocab", "size"), [(160, 4), (10, 4), (9, 2)])
def test_vocabulary_parallel_logits_join_to_the_full_logits(vocab, size):
    head = RNG.standard_normal((vocab, 8)).astype(np.float32)
    hidden = RNG.standard_normal((3, 8)).astype(np.float32)
    shards = [hidden @ np.asarray(parallel.vocab_rows_of(head)).T for parallel in ranks(size)]
    joined = ModelParallel(ParallelLayout(size), 0, SumLater()).gather_vocab(
        np.concatenate(shards, axis=-1), vocab
    )
    np.testing.assert_allclose(joined, hidden @ head.T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("default_ops", [False, True], ids=["cpu", "base-class-default"])
@pytest.mark.parametrize("size", [2, 3])
def test_expert_parallel_shares_sum_to_all_experts(default_ops, size):
    backend = CpuBackend(BackendOptions(threads=1))
    experts, hidden, inner, tokens, top_k = 8, 16, 8, 6, 3
    gate = [RNG.standard_normal((inner, hidden)).astype(np.float32) for _ in range(experts)]
    up = [RNG.standard_normal((inner, hidden)).astype(np.float32) for _ in range(experts)]
    down = [RNG.standard_normal((hidden, inner)).astype(np.float32) for _ in range(experts)]
    x = RNG.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.stack([RNG.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int64)
    weights = RNG.random((tokens, top_k)).astype(np.float32)
    run = Backend.moe_experts if default_ops else CpuBackend.moe_experts
    full = run(backend, x, backend.moe_expert_weights(gate, up, down), weights, ids)
    total = np.zeros_like(full)
    for parallel in ranks(size):
        mine = parallel.shard_of(experts)
        local = backend.moe_expert_weights(
            gate[mine.start : mine.stop], up[mine.start : mine.stop], down[mine.start : mine.stop]
        )
        total += run(backend, x, local, weights, ids, first_expert=mine.start)
    np.testing.assert_allclose(total, full, rtol=1e-5, atol=1e-5)


def test_safetensors_tensors_are_mapped_so_a_shard_reads_only_its_pages(tmp_path):
    from safetensors.numpy import save_file

    from fastdeploy.model_executor.loaders.safetensors_loader import mapped_tensors

    matrix = RNG.standard_normal((64, 48)).astype(np.float32)
    save_file({"w": matrix, "b": matrix[0].copy()}, str(tmp_path / "model.safetensors"))
    tensors = dict(mapped_tensors(str(tmp_path / "model.safetensors")))
    np.testing.assert_array_equal(tensors["w"], matrix)
    assert not tensors["w"].flags.writeable  # a view of the file, not a copy in memory
    columns = take_columns(tensors["w"], range(16, 32))
    rows = take_rows(tensors["w"], range(8, 40))
    assert np.shares_memory(columns, tensors["w"]) and np.shares_memory(rows, tensors["w"])
    np.testing.assert_array_equal(columns, matrix[:, 16:32])
    np.testing.assert_array_equal(rows, matrix[8:40])


@pytest.mark.parametrize("kind", ["wint8", "wint4", "fp8"])
def test_weight_only_shards_stay_packed_where_the_cut_keeps_whole_scale_groups(kind):
    """A rank's rows or columns of a `quantization=` matrix (cuda backend) equal the same slice of
    the dequantised matrix; columns stay packed on a group boundary, float32 between."""
    matrix = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    packed = quantize_weight_only(matrix, kind, 64)
    dense = packed.dequantize()
    rows = take_rows(packed, range(128, 256))
    assert isinstance(rows, WeightOnlyTensor)
    np.testing.assert_array_equal(np.asarray(rows), dense[128:256])
    columns = take_columns(packed, range(128, 256))
    assert isinstance(columns, WeightOnlyTensor)
    np.testing.assert_array_equal(np.asarray(columns), dense[:, 128:256])
    between = take_columns(packed, range(96, 160))
    assert isinstance(between, WeightOnlyTensor) == (kind == "wint8")
    np.testing.assert_array_equal(np.asarray(between), dense[:, 96:160])
