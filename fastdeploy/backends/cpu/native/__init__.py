"""The cpu backend's native kernels: products on GGUF-quantised weights kept in their blocks,
paged attention and the element-wise ops of a decoder layer.

`pack` turns the parts of a linear weight into a `PackedWeight` (GGUF blocks of the
`SUPPORTED_TYPES` repacked into column panels by packing.c / block_packing.c, anything else as
float32 panels); `matmul` multiplies float32
activations by it. Every kernel takes the instruction set to run (`isa`), so the backend
runs what `FD_CPU_KERNELS` names and tests exercise the AVX2 code on an AVX-512 machine. Where the extension was not built, `unavailable_reason`
says why and the backend keeps its numpy path.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from fastdeploy.backends.base import AttentionBlock, BatchLayout, MLPBlock
from fastdeploy.backends.cpu.kv_cache import KV_TYPES, LayerKVCache
from fastdeploy.backends.cpu.native.weight_arena import HUGE_PAGE, WeightArena
from fastdeploy.backends.cpu.native.weight_cache import WeightCache
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.weight_only import WeightOnlyTensor


def _import_extension() -> tuple[Any, str | None]:
    """The compiled `_native` module, or None and why not. Imported by its full name: a missing
    module then reads "no module named ...", not the "partially initialized module (most likely
    due to a circular import)" that `from package import _native` says inside this package."""
    try:
        return importlib.import_module(f"{__name__}._native"), None
    except ModuleNotFoundError:
        # not compiled (no C compiler at install time, not x86-64), or not for this Python
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return None, (
            f"the native extension is not built for this Python ({version}); build it with "
            "`pip install -e .` or `python setup.py build_ext --inplace`"
        )
    except ImportError as error:  # built, but it does not load here
        return None, f"the native extension does not load ({error})"


_native, _IMPORT_ERROR = _import_extension()

#: the GGML block types multiplied in their blocks, never dequantised: Q4_1 and Q8_0 in gemm.c's
#: panels, the others in blocks.h's sub-block panels (gemm_blocks.c)
SUPPORTED_TYPES = (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
    "MXFP4",
)  # fmt: skip
#: the block types with int8-activation kernels too: all but MXFP4 (Q4_1/Q8_0: gemm_int8.c, with
#: layouts of their own; the others: gemm_blocks_int8.c, on their float32 panels)
INT8_TYPES = tuple(name for name in SUPPORTED_TYPES if name != "MXFP4")
PANEL = 16
ISAS = ("avx512", "avx2")
#: what the activations are multiplied in: float32 (exact) or int8 (gemm_int8.c, gemm_blocks_int8.c; opt-in)
ACTIVATIONS = ("float32", "int8")
#: the int8 products' dot instructions, widest last: AVX2's vpmaddubsw, AVX-VNNI's and AVX-512 VNNI's
#: vpdpbusd (the extension's numbers 0..2); "auto" leaves the widest the CPU has
INT8_DOTS = ("auto", "maddubs", "avx-vnni", "avx512-vnni")
#: cached packed weights of at least this many bytes are mapped where they lie (the page cache
#: holds them in 2 MiB folios, which map as huge pages: no copy at load); smaller ones are read into
#: the weight arena, where they share huge pages instead of sitting on 4 KiB pages of their own
MAP_CACHED_FROM = HUGE_PAGE
#: what a vision encoder's linear layers and attention multiply in: float32 (exact) or bfloat16
#: (gemm_bf16.c, encoder_attention_bf16.c; opt-in)
VISION_MATMULS = ("float32", "bfloat16")


def unavailable_reason() -> str | None:
    """Why the kernels cannot run here, or None when they can."""
    if _IMPORT_ERROR:
        return _IMPORT_ERROR
    if _native.best_isa() == "none":
        return "this CPU has neither AVX-512 nor AVX2+FMA"
    return None


def build_stamp() -> str:
    """The extension's file size and modification time: a rebuild (which may change a packed
    layout) changes it, so `WeightCache` entries of an older build are not read."""
    status = os.stat(_native.__file__)
    return f"{status.st_size}|{status.st_mtime_ns}"


def has_vnni() -> bool:
    """Whether the CPU has AVX-512 VNNI for the AVX-512 kernels (the int8 products' widest dots;
    `int8_dots` names the ones they use)."""
    return _native is not None and _native.has_vnni()


def has_bf16() -> bool:
    """Whether the bfloat16 products use AVX512_BF16 here (else bfloat16 widened to float32 FMAs)."""
    return _native is not None and _native.has_bf16()


def cap_int8_dots(cap: str) -> None:
    """Caps the int8 products' dots to `cap` (one of INT8_DOTS), process-wide: every dot computes
    the same exact integers, so only the speed changes."""
    _native.int8_dots(ISAS[-1], INT8_DOTS.index(cap) - 1 if cap != "auto" else len(INT8_DOTS) - 2)


def int8_dots(isa: str, cap: str = "auto") -> str:
    """The dots the int8 products of `isa`'s kernels run here, under the current cap and `cap`."""
    widest = min(_native.int8_dots(isa, -1), INT8_DOTS.index(cap) - 1 if cap != "auto" else len(INT8_DOTS))
    return INT8_DOTS[1 + widest]


def best_isa() -> str:
    """The widest instruction set the kernels use on this CPU (avx512, avx2 or none)."""
    return _native.best_isa() if _native is not None else "none"


@dataclass(frozen=True)
class PackedWeight:
    """A [out_features, in_features] weight in the kernels' panel layout; `type_name` is the GGML
    block type kept (one of `SUPPORTED_TYPES`), F32, BF16, or MIXED (fused parts of different types,
    each kept in its own: `segments`) (`pack_bf16`); `activations` what the kernel quantises
    x to (block weights only: float32 weights multiply in float32, bfloat16 ones in bfloat16)."""

    type_name: str  # or W8A8: int8 levels with a scale per output channel (`pack_w8a8`)
    packed: np.ndarray
    out_features: int
    in_features: int
    activations: str = "float32"
    #: type "MIXED" only: (type name, output columns) of each part, in column order
    segments: tuple[tuple[str, int], ...] = ()

    @cached_property
    def kind(self) -> int:
        """The extension's weight kind (native.h `enum weight_kind`); cached: every product asks."""
        return _kind(self.type_name, self.activations)


def _kind(type_name: str, activations: str) -> int:
    """The extension's kind for weights of a type multiplied by activations of `activations`."""
    suffix = "_I8" if activations == "int8" and type_name in INT8_TYPES else ""
    return getattr(_native, f"KIND_{type_name}{suffix}")


def keeps_blocks(parts: Sequence[GGMLTensor | np.ndarray]) -> bool:
    """Whether `pack` keeps any of `parts` in its GGUF blocks (else they are float weights, packed
    as float32, or as bfloat16 by `pack_bf16` where the backend multiplies in bfloat16)."""
    return any(isinstance(part, GGMLTensor) and part.type_name in SUPPORTED_TYPES for part in parts)


def pack(
    parts: Sequence[GGMLTensor | np.ndarray],
    activations: str = "float32",
    arena: WeightArena | None = None,
    cache: WeightCache | None = None,
) -> PackedWeight:
    """One packed weight from [out, in] parts stacked along `out` (a fused qkv or gate/up projection).

    Parts that share a block type with a kernel stay in their blocks, in the layout of the
    `activations` kernels; anything else (float checkpoints, other GGUF types, mixed types) is
    packed as float32; with int8 activations, FastDeploy wint8 parts (`WeightOnlyTensor`) go to
    `pack_w8a8` (else they dequantise to float32). The packed bytes come from `arena` when given
    (huge pages), else numpy; blocks of a known origin are repacked once and taken from `cache` after that
    (mapped from MAP_CACHED_FROM bytes on, else read into `arena`).
    """
    empty = arena.empty if arena is not None else lambda nbytes: np.empty(nbytes, np.uint8)
    if activations == "int8" and runs_w8a8(parts):
        return pack_w8a8(parts, arena)
    in_features = {part.shape[1] for part in parts}
    if not parts or len(in_features) != 1 or any(len(part.shape) != 2 for part in parts):
        raise ValueError(
            f"linear weight parts must be [out, in] matrices with one `in`; got {[p.shape for p in parts]}"
        )
    type_names = [part.type_name if isinstance(part, GGMLTensor) else None for part in parts]
    if len(set(type_names)) > 1 and any(name in SUPPORTED_TYPES for name in type_names):
        return _pack_mixed(parts, activations, empty, cache)
    type_name = type_names[0] if len(set(type_names)) == 1 else None
    if type_name in SUPPORTED_TYPES:
        out_features, depth = sum(part.shape[0] for part in parts), in_features.pop()
        kind = _kind(type_name, activations)
        nbytes = _native.packed_bytes(kind, out_features, depth)
        key = cache.key(parts, kind, out_features, depth) if cache is not None else None
        mapped = key is not None and nbytes >= MAP_CACHED_FROM
        packed = cache.mapped(key, (nbytes,), np.uint8, writable=False) if mapped else None
        if packed is None:
            packed = empty(nbytes)
            if key is None or mapped or not cache.read_into(key, packed):
                rows = np.ascontiguousarray(np.concatenate([part.rows for part in parts], axis=0), np.uint8)
                _native.pack_blocks(kind, rows, packed, out_features, depth)
                if key is not None:
                    cache.write(key, packed)
        return PackedWeight(type_name, packed, out_features, depth, activations)
    out_features = sum(part.shape[0] for part in parts)
    return PackedWeight("F32", _pack_f32(parts, empty), out_features, in_features.pop())


def _pack_mixed(
    parts: Sequence[GGMLTensor | np.ndarray],
    activations: str,
    empty: Callable[[int], np.ndarray],
    cache: WeightCache | None,
) -> PackedWeight:
    """Parts of different types (a Q4_K_M file's q/k in Q4_K and v in Q6_K) as one KIND_MIXED
    weight (gemm_mixed.c): each run of parts of one type packed in its own kind, behind a header of
    (kind, columns, byte offset) per segment; `segments` names each one's type and columns."""
    runs: list[list] = []
    for part in parts:
        name = part.type_name if isinstance(part, GGMLTensor) else None
        if runs and (runs[-1][0].type_name if isinstance(runs[-1][0], GGMLTensor) else None) == name:
            runs[-1].append(part)
        else:
            runs.append([part])
    if len(runs) > _native.MIXED_MAX_SEGMENTS:
        raise ValueError(f"a fused weight has at most {_native.MIXED_MAX_SEGMENTS} parts of different types")
    packed_runs = [pack(run, activations, cache=cache) for run in runs]
    offsets, end = [], _native.MIXED_HEADER_BYTES
    for weight in packed_runs:
        offsets.append(end)
        end += -(-weight.packed.nbytes // 64) * 64
    packed = empty(end)
    packed[:] = 0
    header = [len(packed_runs)]
    for weight, offset in zip(packed_runs, offsets, strict=True):
        header += [weight.kind, weight.out_features, offset]
        packed[offset : offset + weight.packed.nbytes] = weight.packed.reshape(-1).view(np.uint8)
    packed[: 8 * len(header)] = np.array(header, np.int64).view(np.uint8)
    segments = tuple((weight.type_name, weight.out_features) for weight in packed_runs)
    return PackedWeight(
        "MIXED", packed, sum(n for _, n in segments), packed_runs[0].in_features, segments=segments
    )


def _pack_f32(parts: Sequence[GGMLTensor | np.ndarray], empty: Callable[[int], np.ndarray]) -> np.ndarray:
    """Panel pairs [pairs, in, 32] float32 of [out, in] parts stacked along `out` (out padded
    with zero rows): already the kernels' float buffer layout (gemm.c); `empty(nbytes)` gives
    the memory. Each part's rows go straight to their panels: stacking the parts and padding
    the stack first took three more passes over the weights, the larger part of loading a
    float32 checkpoint (a rank loading its shard beside another does not go faster than that
    memory traffic)."""
    width = 2 * PANEL
    out, depth = sum(part.shape[0] for part in parts), parts[0].shape[1]
    pairs = -(-out // width)
    panels = empty(pairs * width * depth * 4).view(np.float32).reshape(pairs, depth, width)
    first = 0  # the stacked row of the part's first row
    for part in parts:
        matrix = np.asarray(part, dtype=np.float32)
        done = 0
        while done < len(matrix):
            pair, column = divmod(first + done, width)
            if column == 0 and len(matrix) - done >= width:  # whole pairs at once
                count = (len(matrix) - done) // width
                rows = matrix[done : done + count * width]
                panels[pair : pair + count] = rows.reshape(count, width, depth).transpose(0, 2, 1)
                done += count * width
            else:  # the rows of a pair that the part begins or ends inside
                take = min(width - column, len(matrix) - done)
                panels[pair, :, column : column + take] = matrix[done : done + take].T
                done += take
        first += len(matrix)
    panels[-1, :, out - (pairs - 1) * width :] = 0
    return panels


def round_bf16(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (uint16) of float32 x, rounded to nearest even as the kernels round."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty(x.shape, np.uint16)
    _native.round_bf16(x, out)
    return out


def pack_bf16(parts: Sequence[GGMLTensor | np.ndarray], arena: WeightArena | None = None) -> PackedWeight:
    """One weight from [out, in] parts stacked along `out`, rounded to bfloat16 once, for
    gemm_bf16.c: [pairs of 16-column panels][in/2][32 columns][2 consecutive k] (zero padded);
    the packed bytes come from `arena` when given (huge pages), else numpy."""
    matrix = np.concatenate([np.asarray(part, dtype=np.float32) for part in parts], axis=0)
    out, depth = matrix.shape
    pairs, k2 = -(-out // (2 * PANEL)), -(-depth // 2)
    padded = np.zeros((pairs * 2 * PANEL, 2 * k2), np.uint16)
    padded[:out, :depth] = round_bf16(matrix)
    shape = (pairs, k2, 2 * PANEL, 2)
    packed = (
        np.empty(shape, np.uint16)
        if arena is None
        else arena.empty(padded.nbytes).view(np.uint16).reshape(shape)
    )
    packed[...] = padded.reshape(pairs, 2 * PANEL, k2, 2).transpose(0, 2, 1, 3)
    return PackedWeight("BF16", packed, out, depth)


def runs_w8a8(parts: Sequence[Any]) -> bool:
    """Whether `pack` with int8 activations multiplies `parts` by gemm_w8a8.c: FastDeploy wint8
    weights (one scale per output channel) of an input width that is a multiple of 32."""
    return bool(parts) and all(
        isinstance(part, WeightOnlyTensor) and part.kind == "wint8" and part.shape[1] % 32 == 0
        for part in parts
    )


def _channel_levels(part: WeightOnlyTensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(levels [out, in] int8 in -127..127, scales [out] float32) of one part: a wint8 tensor's own,
    or a float matrix's rounded per output channel (scale = max |w| / 127)."""
    if isinstance(part, WeightOnlyTensor) and part.kind == "wint8":
        # -128 (possible in a checkpoint) would overflow AVX2's 16-bit pair sums: one step closer
        levels = np.maximum(part.qweight.T, -127).astype(np.int8)
        return levels, np.asarray(part.scales, np.float32).reshape(-1)
    matrix = np.asarray(part, dtype=np.float32)
    peak = np.abs(matrix).max(axis=1)
    scales = (peak / np.float32(127)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))[:, None]
    return np.clip(np.rint(matrix / safe), -127, 127).astype(np.int8), scales


def pack_w8a8(
    parts: Sequence[WeightOnlyTensor | np.ndarray], arena: WeightArena | None = None
) -> PackedWeight:
    """One weight from [out, in] parts stacked along `out` for gemm_w8a8.c: int8 levels + 128 as
    [panels][in / 4][16 columns][4 consecutive k] (columns padded with level 0), then each output
    channel's float32 scale [panels * 16] (padding 0). Float parts are quantised per channel here."""
    levels, scales = zip(*(_channel_levels(part) for part in parts), strict=True)
    matrix, channel_scales = np.concatenate(levels, axis=0), np.concatenate(scales)
    out, depth = matrix.shape
    if depth % 32:
        raise ValueError(f"pack_w8a8: the input width must be a multiple of 32, got {depth}")
    panels = -(-out // PANEL)
    stored = np.full((panels * PANEL, depth), 128, np.uint8)
    stored[:out] = (matrix.astype(np.int16) + 128).astype(np.uint8)
    level_bytes = panels * PANEL * depth
    packed = (
        np.empty(level_bytes + panels * PANEL * 4, np.uint8)
        if arena is None
        else arena.empty(level_bytes + panels * PANEL * 4)
    )
    packed[:level_bytes] = stored.reshape(panels, PANEL, depth // 4, 4).transpose(0, 2, 1, 3).reshape(-1)
    padded_scales = np.zeros(panels * PANEL, np.float32)
    padded_scales[:out] = channel_scales
    packed[level_bytes:] = padded_scales.view(np.uint8)
    return PackedWeight("W8A8", packed, out, depth, "int8")


def set_spin_us(microseconds: float) -> None:
    """How long the kernels' idle threads spin before they sleep (process-wide)."""
    _native.set_spin_us(microseconds)


def set_adaptive_threads(on: bool) -> None:
    """Whether the kernels' loops run on the thread count measured fastest lately, at most the count
    each call asks for (process-wide; threadpool.c, thread_adapt.c)."""
    _native.set_adaptive(on)


def set_step_shape(tokens: int, sequences: int) -> None:
    """The forward pass the next kernels belong to: the adaptive thread count compares the cost of a
    kernel's loops only between passes of one shape."""
    _native.set_step_shape(tokens << 32 | sequences)


def matmul(
    x: np.ndarray, weight: PackedWeight, isa: str, threads: int, bias: np.ndarray | None = None
) -> np.ndarray:
    """x [tokens, in_features] float32 times the weight's transpose (+ bias, added as the kernel
    stores each tile): [tokens, out_features] float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], weight.out_features), np.float32)
    if bias is not None:
        bias = np.ascontiguousarray(bias, np.float32)
    if weight.type_name == "BF16":
        rows, cols, depth = x.shape[0], weight.out_features, weight.in_features
        _native.gemm_bf16(x, weight.packed, out, rows, cols, depth, isa, threads, bias)
        return out
    _native.gemm(
        weight.kind,
        x,
        weight.packed,
        out,
        x.shape[0],
        weight.out_features,
        weight.in_features,
        isa,
        threads,
        bias,
    )
    return out


@dataclass(frozen=True)
class AttentionBatch:
    """What the native attention needs of a `BatchLayout`, as contiguous int64 arrays."""

    slot_mapping: np.ndarray
    query_starts: np.ndarray  # [seqs + 1] first token row of each sequence, then the token count
    context_lens: np.ndarray
    block_tables: np.ndarray
    block_size: int

    @cached_property
    def block_arguments(self) -> tuple:
        """The batch as `attention_block` takes it (built once per pass, used by every layer)."""
        tables = self.block_tables
        return (
            self.slot_mapping,
            self.query_starts,
            self.context_lens,
            tables,
            self.block_size,
            tables.shape[1],
        )


def attention_batch(layout: BatchLayout) -> AttentionBatch:
    starts = np.zeros(len(layout.query_lens) + 1, np.int64)
    np.cumsum(layout.query_lens, out=starts[1:])
    return AttentionBatch(
        np.ascontiguousarray(layout.slot_mapping, np.int64),
        starts,
        np.ascontiguousarray(layout.context_lens, np.int64),
        np.ascontiguousarray(layout.block_tables, np.int64),
        layout.block_size,
    )


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    kv_cache: LayerKVCache,
    batch: AttentionBatch,
    scale: float,
    isa: str,
    threads: int,
    window: int = 0,
    softcap: float = 0.0,
) -> np.ndarray:
    """`Backend.attention` on a cache from `kv_cache.allocate_native`: writes k/v, then attends causally
    (over each query's last `window` positions where `window` > 0: `Backend.windowed_attention`; with
    scores soft-capped where `softcap` > 0: `Backend.softcapped_attention`)."""
    key_cache, value_cache = kv_cache.keys, kv_cache.values
    q = np.ascontiguousarray(q, np.float32)
    tokens, heads, head_dim = q.shape
    out = np.empty_like(q)
    _native.attention(
        q,
        np.ascontiguousarray(k, np.float32),
        np.ascontiguousarray(v, np.float32),
        batch.slot_mapping,
        key_cache,
        value_cache,
        kv_cache.key_scales,
        kv_cache.value_scales,
        out,
        batch.query_starts,
        batch.context_lens,
        batch.block_tables,
        tokens,
        heads,
        value_cache.shape[1],
        head_dim,
        batch.block_size,
        batch.block_tables.shape[1],
        scale,
        KV_TYPES[kv_cache.kv_dtype],
        isa,
        threads,
        window,
        softcap,
    )
    return out


def _attention_weights(block: AttentionBlock) -> tuple:
    """The attention half's weights as decoder_layer.c takes them (built once per block)."""
    if block.prepared is None:
        qkv, o_proj = block.qkv, block.o_proj
        block.prepared = (
            _floats(block.input_norm),
            qkv.kind,
            qkv.packed,
            _floats(block.qkv_bias),
            _floats(block.q_norm),
            _floats(block.k_norm),
            o_proj.kind,
            o_proj.packed,
            _floats(block.o_bias),
            qkv.in_features,
            block.num_heads,
            block.num_kv_heads,
            block.head_dim,
            block.eps,
            block.scale,
            block.window,
            block.softcap,
        )
    return block.prepared


def _mlp_weights(block: MLPBlock) -> tuple:
    """The MLP half's weights as decoder_layer.c takes them (built once per block)."""
    if block.prepared is None:
        gate_up, down = block.gate_up, block.down
        block.prepared = (
            _floats(block.norm),
            gate_up.kind,
            gate_up.packed,
            _floats(block.gate_up_bias),
            down.kind,
            down.packed,
            _floats(block.down_bias),
            gate_up.in_features,
            gate_up.out_features // 2,
            block.eps,
        )
    return block.prepared


def _cache_arguments(kv_cache: LayerKVCache) -> tuple:
    return (
        kv_cache.keys,
        kv_cache.values,
        kv_cache.key_scales,
        kv_cache.value_scales,
        KV_TYPES[kv_cache.kv_dtype],
    )


def attention_sink_factors(
    q: np.ndarray,
    kv_cache: LayerKVCache,
    batch: AttentionBatch,
    scale: float,
    sinks: np.ndarray,
    threads: int,
    window: int = 0,
) -> np.ndarray:
    """[tokens, heads, 1] factors that turn `attention`'s output (same q, cache and batch, after
    it has written the keys) into attention with `sinks` [heads] (attention_sinks.c): with lse
    a query head's log-sum-exp of its scores, 1 / (1 + exp(sink_h - lse))."""
    q = np.ascontiguousarray(q, np.float32)
    tokens, heads, head_dim = q.shape
    out = np.empty((tokens, heads, 1), np.float32)
    _native.attention_sink_factors(
        q,
        kv_cache.keys,
        kv_cache.key_scales,
        np.ascontiguousarray(sinks, np.float32),
        out,
        batch.query_starts,
        batch.context_lens,
        batch.block_tables,
        tokens,
        heads,
        kv_cache.values.shape[1],
        head_dim,
        batch.block_size,
        batch.block_tables.shape[1],
        scale,
        KV_TYPES[kv_cache.kv_dtype],
        window,
        threads,
    )
    return out


def attention_block(
    x: np.ndarray,
    residual: np.ndarray | None,
    block: AttentionBlock,
    positions: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    kv_cache: LayerKVCache,
    batch: AttentionBatch,
    isa: str,
    threads: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`Backend.attention_block` in one call (decoder_layer.c); the block's weights are packed."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    total, residual = _residual_sum(x, residual)
    _native.attention_block(
        x,
        residual,
        out,
        total if residual is not None else None,
        np.ascontiguousarray(positions, np.int64),
        _floats(cos),
        _floats(sin),
        cos.shape[-1],
        _attention_weights(block),
        _cache_arguments(kv_cache),
        batch.block_arguments,
        isa,
        threads,
    )
    return out, total


def mlp_block(
    x: np.ndarray, residual: np.ndarray | None, block: MLPBlock, isa: str, threads: int
) -> tuple[np.ndarray, np.ndarray]:
    """`Backend.mlp_block` in one call (decoder_layer.c); the block's weights are packed."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    total, residual = _residual_sum(x, residual)
    _native.mlp_block(
        x, residual, out, total if residual is not None else None, _mlp_weights(block), isa, threads
    )
    return out, total


def prepare_decoder_stack(
    layers: Sequence[tuple[AttentionBlock, MLPBlock]], kv_caches: Sequence[LayerKVCache]
) -> object:
    """The native handle of a run of dense layers and their caches for `decoder_stack`: their
    weights and caches parsed once (it keeps them alive)."""
    return _native.decoder_stack_prepare(
        [
            (_attention_weights(attention), _cache_arguments(kv_cache), _mlp_weights(mlp))
            for (attention, mlp), kv_cache in zip(layers, kv_caches, strict=True)
        ]
    )


def decoder_stack(
    x: np.ndarray,
    residual: np.ndarray | None,
    stack: object,
    positions: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    batch: AttentionBatch,
    isa: str,
    threads: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`Backend.decoder_layers` in one call (decoder_layer.c) on a `prepare_decoder_stack` handle:
    (the last layer's output, the residual stream)."""
    x = np.ascontiguousarray(x, np.float32)
    out, total = np.empty_like(x), np.empty_like(x)
    _native.decoder_stack(
        x,
        None if residual is None else np.ascontiguousarray(residual, np.float32),
        out,
        total,
        np.ascontiguousarray(positions, np.int64),
        _floats(cos),
        _floats(sin),
        cos.shape[-1],
        stack,
        batch.block_arguments,
        isa,
        threads,
    )
    return out, total


def _floats(array: np.ndarray | None) -> np.ndarray | None:
    return None if array is None else np.ascontiguousarray(array, np.float32)


def _residual_sum(x: np.ndarray, residual: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(where x + residual goes: x itself when there is no residual; the residual, contiguous)."""
    if residual is None:
        return x, None
    return np.empty_like(x), np.ascontiguousarray(residual, np.float32)


def encoder_attention_bf16_runs(head_dim: int, isa: str) -> bool:
    """Whether `encoder_attention(..., bf16=True)` takes the bfloat16 kernel (AVX512_BF16, head_dim a
    multiple of 16 up to 512) rather than the float32 one."""
    return isa == "avx512" and has_bf16() and head_dim % 16 == 0 and head_dim <= 512


def encoder_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cu_seqlens: np.ndarray,
    scale: float,
    isa: str,
    threads: int,
    bf16: bool = False,
) -> np.ndarray:
    """`Backend.encoder_attention`: tokens `cu_seqlens[i]:cu_seqlens[i+1]` attend to each other only;
    `bf16`: with bfloat16 products (encoder_attention_bf16.c) where `encoder_attention_bf16_runs`."""
    q, k, v = (np.ascontiguousarray(t, np.float32) for t in (q, k, v))
    tokens, heads, head_dim = q.shape
    inputs = (q, k, v, (0, 0, 0), heads * head_dim, None, None)
    return _encoder_attention(inputs, tokens, heads, head_dim, cu_seqlens, scale, isa, threads, bf16)


def encoder_attention_qkv(
    qkv: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    cu_seqlens: np.ndarray,
    heads: int,
    scale: float,
    isa: str,
    threads: int,
    bf16: bool = False,
) -> np.ndarray:
    """`Backend.encoder_attention_qkv`: q, k and v read in place from the fused projection, q and k
    rotated by one pass over the tokens inside the call; [tokens, heads, head_dim]."""
    qkv = np.ascontiguousarray(qkv, np.float32)
    tokens, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // heads
    cos, sin = np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32)
    inputs = (qkv, qkv, qkv, (0, hidden, 2 * hidden), width, cos, sin)
    return _encoder_attention(inputs, tokens, heads, head_dim, cu_seqlens, scale, isa, threads, bf16)


def _encoder_attention(
    inputs: tuple, tokens: int, heads: int, head_dim: int, cu_seqlens: np.ndarray, scale: float, isa: str,
    threads: int, bf16: bool,
) -> np.ndarray:  # fmt: skip
    """The float32 or bfloat16 entry on `inputs` (q, k, v, their offsets, row stride, cos, sin)."""
    out = np.empty((tokens, heads, head_dim), np.float32)
    cu_seqlens = np.ascontiguousarray(cu_seqlens, np.int64)
    shape = (out, cu_seqlens, tokens, heads, head_dim, scale)
    if bf16 and encoder_attention_bf16_runs(head_dim, isa):
        _native.encoder_attention_bf16(*inputs, *shape, threads)
    else:
        _native.encoder_attention(*inputs, *shape, isa, threads)
    return out


def rms_norm(
    x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None, isa: str, threads: int
) -> tuple[np.ndarray, np.ndarray]:
    """`Backend.rms_norm`: (normed, x + residual) row by row."""
    return _norm(_native.rms_norm, (), x, weight, eps, residual, isa, threads)


def layer_norm(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    eps: float,
    residual: np.ndarray | None,
    isa: str,
    threads: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`Backend.layer_norm`: (normed, x + residual) row by row."""
    bias = None if bias is None else np.ascontiguousarray(bias, np.float32)
    return _norm(_native.layer_norm, (bias,), x, weight, eps, residual, isa, threads)


def _norm(
    entry: object,
    extra: tuple,
    x: np.ndarray,
    weight: np.ndarray,
    eps: float,
    residual: np.ndarray | None,
    isa: str,
    threads: int,
) -> tuple[np.ndarray, np.ndarray]:
    """A norm entry point's (normed, x + residual); `extra` are its arguments after the weight."""
    x = np.ascontiguousarray(x, np.float32)
    weight = np.ascontiguousarray(weight, np.float32)
    out = np.empty_like(x)
    total = x
    if residual is not None:
        residual = np.ascontiguousarray(residual, np.float32)
        total = np.empty_like(x)
    entry(
        x, residual, weight, *extra, eps, out, total if residual is not None else None, *x.shape, isa, threads
    )
    return out, total


def activation(x: np.ndarray, kind: str, isa: str, threads: int) -> np.ndarray:
    """`Backend.quick_gelu` (kind "quick_gelu") or `Backend.gelu` ("gelu_erf") of a float32 array."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    rows = x.shape[0] if x.ndim > 1 else 1
    _native.activation(
        getattr(_native, f"ACT_{kind.upper()}"), x, out, rows, x.size // max(rows, 1), isa, threads
    )
    return out


def silu_and_mul(x: np.ndarray, isa: str, threads: int) -> np.ndarray:
    """`Backend.silu_and_mul` of [tokens, 2 * half] rows."""
    x = np.ascontiguousarray(x, np.float32)
    half = x.shape[1] // 2
    out = np.empty((x.shape[0], half), np.float32)
    _native.silu_and_mul(x, out, x.shape[0], half, isa, threads)
    return out


def rotary_embedding(
    x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, isa: str, threads: int
) -> np.ndarray:
    """`Backend.rotary_embedding` of x [tokens, heads, head_dim] with [positions, rotary_dim/2] tables."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    positions = np.ascontiguousarray(positions, np.int64)
    cos, sin = np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32)
    _native.rotary(x, positions, cos, sin, out, *x.shape, cos.shape[-1], isa, threads)
    return out
