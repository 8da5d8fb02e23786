"""Quantised matmuls in Triton: out = x @ W for W in a packed weight format, dequantised in registers.

One kernel serves every format; `FORMAT` picks how a [BLOCK_K, BLOCK_N] tile of W is read:

- `WINT8`: int8 [K, N], one float scale per output column (applied once, after the K loop);
- `WINT4`: [K / 2, N] bytes of two 4-bit levels biased by 8 (input 2i low nibble, 2i + 1 high),
  one scale per `GROUP` inputs of a column ([K / GROUP, N]); the even and odd inputs are two
  half-depth products, so no nibble is ever interleaved;
- `Q8_0`, `Q4_0`: GGUF blocks as the file stores them, rows [N, K / 32 * block bytes] (a float16
  scale, then 32 int8, or 16 bytes holding inputs p and p + 16 of the block in their low and
  high nibbles, value = (nibble - 8) * scale);
- `Q4_K`, `Q6_K`: GGUF's 256-input super-blocks as stored (144 / 210 bytes); each weight of the
  tile is decoded where it sits (`_q4_k_values`, `_q6_k_values`: sub-block scales unpacked per
  weight from the bytes L1 already holds);
- `FP8`: e4m3 [N, K] (its bits) with one float scale per 128 x 128 block ([N / 128, K / 128]).

Two launch shapes (`matmul_config`): for decode-sized M (<= 16) a skinny tile of 16 rows with
narrow columns and the K range split across programs (`SPLIT_K`, partial sums added atomically
into a float32 output the caller zeroed), so a few rows still spread the weight reads over every
multiprocessor; otherwise square tiles as for a plain GEMM. Weights are read once per row tile:
the products are bound by the bytes of W, which is why the packed formats are faster.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

WINT8, WINT4, Q8_0, Q4_0, FP8, Q4_K, Q6_K = 0, 1, 2, 3, 4, 5, 6
FORMATS = {"wint8": WINT8, "wint4": WINT4, "Q8_0": Q8_0, "Q4_0": Q4_0, "fp8": FP8, "Q4_K": Q4_K, "Q6_K": Q6_K}
#: (inputs, bytes) of one GGUF block
GGUF_BLOCKS = {Q8_0: (32, 34), Q4_0: (32, 18), Q4_K: (256, 144), Q6_K: (256, 210)}
#: rows at or below which the skinny (decode) launch is used
SKINNY_MAX_M = 16


@triton.jit
def _half_scale(row_ptr, mask):
    """The float16 scale at the start of a GGUF block, assembled from its two bytes (GGUF blocks
    are 34 or 18 bytes, so a 2-byte load may be misaligned)."""
    low = tl.load(row_ptr, mask=mask, other=0).to(tl.uint16)
    high = tl.load(row_ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _q4_k_values(block, e, mask):
    """Weights at offsets e of Q4_K super-blocks (`block`: their first byte): d (float16), dmin,
    12 bytes of 6-bit scales and minimums for eight 32-input sub-blocks, 128 bytes of nibbles
    (sub-blocks 2j and 2j + 1 share bytes 32j.., low and high nibble); w = d * sc * q - dmin * m."""
    pair, r = e // 64, e % 64
    sub = 2 * pair + r // 32
    byte = tl.load(block + 16 + 32 * pair + r % 32, mask=mask, other=0).to(tl.int32)
    level = tl.where(r < 32, byte & 15, byte >> 4).to(tl.float32)
    first = sub < 4
    own = tl.load(block + 4 + sub, mask=mask, other=0).to(tl.int32)
    later = tl.load(block + 8 + sub, mask=mask, other=0).to(tl.int32)
    early = tl.load(block + 4 + tl.where(first, sub, sub - 4), mask=mask, other=0).to(tl.int32)
    scale = tl.where(first, own & 63, (later & 15) | ((early >> 6) << 4)).to(tl.float32)
    minimum = tl.where(first, later & 63, (later >> 4) | ((own >> 6) << 4)).to(tl.float32)
    return _half_scale(block, mask) * scale * level - _half_scale(block + 2, mask) * minimum


@triton.jit
def _q6_k_values(block, e, mask):
    """Weights at offsets e of Q6_K super-blocks: 128 bytes of low nibbles, 64 of 2-bit high parts,
    16 int8 scales (one per 16 inputs), d (float16); w = d * scale * (6-bit level - 32)."""
    half, r = e // 128, e % 128
    quarter, lane = r // 32, r % 32
    low = tl.load(block + 64 * half + 32 * (quarter % 2) + lane, mask=mask, other=0).to(tl.int32)
    high = tl.load(block + 128 + 32 * half + lane, mask=mask, other=0).to(tl.int32)
    level = tl.where(quarter < 2, low & 15, low >> 4) | (((high >> (2 * quarter)) & 3) << 4)
    scale = tl.load(block + 192 + 8 * half + 2 * quarter + lane // 16, mask=mask, other=0)
    scale = scale.to(tl.int8, bitcast=True).to(tl.float32)
    return _half_scale(block + 208, mask) * scale * (level - 32).to(tl.float32)


@triton.jit
def _quant_matmul_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    m_size,
    n_size,
    k_size,
    x_stride,
    w_row_bytes,
    k_per_split,
    FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < m_size
    n_mask = n < n_size
    x_rows = x_ptr + m.to(tl.int64)[:, None] * x_stride
    compute = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start = pid_k * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, k_size)
    for step in range(0, k_per_split, BLOCK_K):  # the last split's tail tiles load nothing
        k0 = k_start + step
        live = k0 < k_stop
        if FORMAT == 0:  # WINT8: int8 [K, N]
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < k_stop
            x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            q = tl.load(
                w_ptr + k.to(tl.int64)[:, None] * n_size + n[None, :],
                mask=k_mask[:, None] & n_mask[None, :],
                other=0,
            )
            acc = tl.dot(x, q.to(compute), acc, input_precision=PRECISION)
        elif FORMAT == 1:  # WINT4: [K / 2, N] bytes, scales [K / GROUP, N]
            j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            j_mask = 2 * j < k_stop
            pair = tl.load(
                w_ptr + j.to(tl.int64)[:, None] * n_size + n[None, :],
                mask=j_mask[:, None] & n_mask[None, :],
                other=0x88,
            ).to(tl.int32)
            scale = tl.load(s_ptr + (k0 // GROUP) * n_size + n, mask=n_mask & live, other=0.0).to(tl.float32)
            low = (((pair & 15) - 8).to(tl.float32) * scale[None, :]).to(compute)
            high = (((pair >> 4) - 8).to(tl.float32) * scale[None, :]).to(compute)
            x_mask = m_mask[:, None] & j_mask[None, :]
            x_even = tl.load(x_rows + 2 * j[None, :], mask=x_mask, other=0.0)
            x_odd = tl.load(x_rows + 2 * j[None, :] + 1, mask=x_mask, other=0.0)
            acc = tl.dot(x_even, low, acc, input_precision=PRECISION)
            acc = tl.dot(x_odd, high, acc, input_precision=PRECISION)
        elif FORMAT == 2:  # Q8_0 rows [N, K / 32 * 34]
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < k_stop
            mask = k_mask[:, None] & n_mask[None, :]
            block = w_ptr + n.to(tl.int64)[None, :] * w_row_bytes + (k // 32 * 34)[:, None]
            q = tl.load(block + 2 + (k % 32)[:, None], mask=mask, other=0).to(tl.int8, bitcast=True)
            scale = _half_scale(block, mask)
            x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            acc = tl.dot(x, (q.to(tl.float32) * scale).to(compute), acc, input_precision=PRECISION)
        elif FORMAT == 3:  # Q4_0 rows [N, K / 32 * 18]
            i = tl.arange(0, BLOCK_K // 2)
            first = k0 + i // 16 * 32 + i % 16  # input of the low nibble; the high one is 16 further
            k_mask = first < k_stop
            mask = k_mask[:, None] & n_mask[None, :]
            block = w_ptr + n.to(tl.int64)[None, :] * w_row_bytes + (first // 32 * 18)[:, None]
            pair = tl.load(block + 2 + (i % 16)[:, None], mask=mask, other=0x88).to(tl.int32)
            scale = _half_scale(block, mask)
            low = (((pair & 15) - 8).to(tl.float32) * scale).to(compute)
            high = (((pair >> 4) - 8).to(tl.float32) * scale).to(compute)
            x_mask = m_mask[:, None] & k_mask[None, :]
            x_low = tl.load(x_rows + first[None, :], mask=x_mask, other=0.0)
            x_high = tl.load(x_rows + first[None, :] + 16, mask=x_mask, other=0.0)
            acc = tl.dot(x_low, low, acc, input_precision=PRECISION)
            acc = tl.dot(x_high, high, acc, input_precision=PRECISION)
        elif FORMAT == 5 or FORMAT == 6:  # Q4_K / Q6_K rows [N, K / 256 * 144 or 210]
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < k_stop
            mask = k_mask[:, None] & n_mask[None, :]
            block_bytes = 144 if FORMAT == 5 else 210
            block = w_ptr + n.to(tl.int64)[None, :] * w_row_bytes + (k // 256 * block_bytes)[:, None]
            if FORMAT == 5:
                w = _q4_k_values(block, (k % 256)[:, None], mask)
            else:
                w = _q6_k_values(block, (k % 256)[:, None], mask)
            x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            acc = tl.dot(x, w.to(compute), acc, input_precision=PRECISION)
        else:  # FP8: e4m3 bits [N, K], scales [ceil(N / 128), ceil(K / 128)]
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < k_stop
            bits = tl.load(
                w_ptr + n.to(tl.int64)[None, :] * k_size + k[:, None],
                mask=k_mask[:, None] & n_mask[None, :],
                other=0,
            )
            scale = tl.load(
                s_ptr + (n // 128) * tl.cdiv(k_size, 128) + k0 // 128, mask=n_mask & live, other=0.0
            )
            w = bits.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[None, :]
            x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            acc = tl.dot(x, w.to(compute), acc, input_precision=PRECISION)
    if FORMAT == 0:
        acc = acc * tl.load(s_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + m.to(tl.int64)[:, None] * n_size + n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=mask)


def matmul_config(
    format_name: str, m: int, n: int, k: int, num_sms: int, is_float32: bool, group_size: int = 0
) -> dict[str, int]:
    """Tile sizes, split count and launch options for an [m, k] x [k, n] product.

    Skinny (m <= 16): 16 x 32 tiles, K tiles of 128 (64 for 64-wide wint4 groups), and the K range
    split until the grid holds one to two programs per multiprocessor. Tiled: 64-row tiles up to
    m = 64, 128 beyond, 128 columns, K tiles of 64 (32 for float32, whose tiles take twice the
    shared memory)."""
    depth = 128 if format_name != "wint4" else min(128, group_size)
    if m <= SKINNY_MAX_M:
        block_n = 32
        tiles = triton.cdiv(n, block_n)
        k_tiles = triton.cdiv(k, depth)
        split = 1
        while tiles * split < num_sms and split * 2 <= k_tiles:  # 1 to 2 programs per SM
            split *= 2
        return {"BLOCK_M": 16, "BLOCK_N": block_n, "BLOCK_K": depth, "SPLIT_K": split}
    block_k = 64 if not is_float32 else 32
    if format_name in ("Q4_0", "wint4", "fp8"):
        block_k = 64  # two 32-deep halves (4-bit) or one wint4 group / FP8 block slice
    block_m = 64 if m <= 64 else 128
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": 128,
        "BLOCK_K": block_k,
        "SPLIT_K": 1,
        "num_warps": 8 if block_m == 128 else 4,
        "num_stages": 2 if is_float32 else 3,
    }


def quant_matmul(
    x: Any,
    weight: Any,
    scales: Any,
    out: Any,
    format_name: str,
    n: int,
    k: int,
    config: dict[str, int],
    group_size: int = 0,
) -> None:
    """out [m, n] = x [m, k] @ W, W given by `weight` (and `scales`) in `format_name`'s layout.

    x is contiguous. With config["SPLIT_K"] > 1, `out`
    must be float32 and zeroed: the splits add into it.
    """
    m = x.shape[0]
    if m == 0:
        return
    fmt = FORMATS[format_name]
    block_k, split = config["BLOCK_K"], config["SPLIT_K"]
    k_tiles = triton.cdiv(k, block_k)
    per_split = triton.cdiv(k_tiles, split) * block_k
    inputs, block_bytes = GGUF_BLOCKS.get(fmt, (1, 0))
    row_bytes = k // inputs * block_bytes
    grid = (triton.cdiv(n, config["BLOCK_N"]), triton.cdiv(m, config["BLOCK_M"]), split)
    options = {key: value for key, value in config.items() if key.startswith("num_")}
    _quant_matmul_kernel[grid](
        x,
        weight,
        scales if scales is not None else weight,
        out,
        m,
        n,
        k,
        k,
        row_bytes,
        per_split,
        FORMAT=fmt,
        GROUP=max(group_size, 1),
        BLOCK_M=config["BLOCK_M"],
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=block_k,
        SPLIT_K=split,
        PRECISION="ieee" if str(x.dtype).endswith("float32") else "tf32",
        **options,
    )
