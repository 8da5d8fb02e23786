"""Ahead-of-time compilation of the Triton kernels for a CUDA architecture, without a GPU.

Triton lowers a kernel to PTX and assembles a cubin with its bundled ptxas for any target, so a
machine without a GPU can prove that every kernel compiles for real hardware (sm_80 / sm_90),
for each storage dtype, with the specialisations the backend launches. The interpreter tests
check what the kernels compute; this checks that the GPU compiler accepts them.

Run `python -m fastdeploy.backends.cuda.aot [ARCH ...] [--dtypes float32,bfloat16]` (TRITON_INTERPRET
must be unset). It compiles float32, bfloat16 and float16 variants (or those `--dtypes` names) of every kernel at the shapes the models here
use (head_dim 128 and 64, GPT-OSS's windowed attention with sinks, soft-capped windowed
attention, DeepSeek-V3's latent attention, ERNIE-4.5-21B-A3B's MoE, a 152064-token vocabulary), in parallel,
with the num_warps / num_stages the launchers use, and fails where a kernel needs more shared
memory than the architecture gives one program (which on a GPU is a launch-time OutOfResources).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

# this tool compiles the Triton kernels: it needs triton (an optional dependency of fastdeploy)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fastdeploy.backends.cuda import triton_quant
from fastdeploy.backends.cuda import triton_sampling as sampling
from fastdeploy.backends.cuda.triton_attention import (
    decode_launch_options,
    prefill_block_m,
    prefill_launch_options,
)
from fastdeploy.backends.cuda.triton_latent import LATENT_HEAD_BLOCK, latent_block_n, latent_launch_options
from fastdeploy.backends.cuda.triton_moe import gemm_config

_TRITON_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: shared memory one program may use (bytes, the opt-in maximum per block): A100 / H100
SHARED_MEMORY_LIMIT = {80: 166912, 90: 232448}

#: (module, kernel, signature, constexprs, launch options: num_warps / num_stages as launched)
Launch = tuple[str, str, dict[str, str], dict[str, Any], dict[str, int]]


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    arch: int
    dtype: str
    ptx_bytes: int
    cubin_bytes: int
    shared_bytes: int


def _specialisations(dtype: str, shared_memory: int) -> list[Launch]:
    """(module, kernel, signature, constexprs) for each launch the backend makes in `dtype` on a GPU
    whose programs may use `shared_memory` bytes (tile sizes depend on it)."""
    t = "*" + _TRITON_DTYPES[dtype]
    precision = "ieee" if dtype == "float32" else "tf32"
    attention_common = {"scale_log2": "fp32", "num_heads": "i32", "num_kv_heads": "i32", "head_dim": "i32"}
    attention_common |= {"block_size": "i32", "max_blocks": "i32"}
    fp32 = dtype == "float32"
    specs: list[Launch] = [
        (
            "triton_kernels",
            "_rms_norm_kernel",
            {"x_ptr": t, "residual_ptr": t, "weight_ptr": t, "out_ptr": t, "residual_out_ptr": t}
            | {"n_cols": "i32", "eps": "fp32", "HAS_RESIDUAL": "constexpr", "BLOCK": "constexpr"},
            {"HAS_RESIDUAL": True, "BLOCK": 1024},
            {},
        ),
        (
            "triton_kernels",
            "_rotary_kernel",
            {"x_ptr": t, "positions_ptr": "*i64", "cos_ptr": t, "sin_ptr": t, "out_ptr": t}
            | {"x_token_stride": "i32", "num_heads": "i32", "head_dim": "i32", "half": "i32"}
            | {"HEADS_BLOCK": "constexpr", "HALF_BLOCK": "constexpr", "TAIL_BLOCK": "constexpr"},
            {"HEADS_BLOCK": 32, "HALF_BLOCK": 64, "TAIL_BLOCK": 0},
            {},
        ),
        (
            "triton_kernels",
            "_store_kv_kernel",
            {"key_ptr": t, "value_ptr": t, "key_cache_ptr": t, "value_cache_ptr": t}
            | {
                "slot_mapping_ptr": "*i64",
                "row_size": "i32",
                "value_token_stride": "i32",
                "BLOCK": "constexpr",
            },
            {"BLOCK": 1024},
            {},
        ),
        (
            "triton_kernels",
            "_silu_and_mul_kernel",
            {"x_ptr": t, "out_ptr": t, "width": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024},
            {},
        ),
    ]
    # prefill: head_dim 128 (Llama-1B) and 64 (SmolLM2), GQA 4 and 3; GPT-OSS's sliding layers
    # (head_dim 64, GQA 8, a window and sinks) and soft-capped sliding layers (head_dim 128, GQA 2)
    attention_common |= {"sinks_ptr": t, "window": "i32", "softcap_scale": "fp32", "softcap_log2": "fp32"}
    attention_flags = dict.fromkeys(("WINDOWED", "HAS_SINKS", "SOFTCAP"), "constexpr")
    # (head_dim, GQA group, decode split counts, WINDOWED / HAS_SINKS / SOFTCAP)
    for head_dim, group, split_counts, (windowed, sinks, softcap) in (
        (128, 4, (1, 8), (False, False, False)),
        (64, 3, (1,), (False, False, False)),
        (64, 8, (1, 8), (True, True, False)),
        (128, 2, (1,), (True, False, True)),
    ):
        prefill = prefill_launch_options(fp32, head_dim, shared_memory)
        flags = {"WINDOWED": windowed, "HAS_SINKS": sinks, "SOFTCAP": softcap}
        specs.append(
            (
                "triton_attention",
                "_prefill_kernel",
                {"q_ptr": t, "key_cache_ptr": t, "value_cache_ptr": t, "out_ptr": t}
                | {"block_tables_ptr": "*i32", "seq_query_start_ptr": "*i32", "seq_query_len_ptr": "*i32"}
                | {"seq_context_len_ptr": "*i32", "tile_seq_ptr": "*i32", "tile_offset_ptr": "*i32"}
                | attention_common
                | dict.fromkeys(("GROUP", "HEAD_DIM", "BLOCK_M", "BLOCK_N", "PRECISION"), "constexpr")
                | attention_flags,
                {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_M": 64 if fp32 else 128}
                | {"BLOCK_N": prefill["BLOCK_N"], "PRECISION": precision}
                | flags,
                {k: v for k, v in prefill.items() if k.startswith("num_")},
            )
        )
        for splits in split_counts:
            specs.append(
                (
                    "triton_attention",
                    "_decode_kernel",
                    {"q_ptr": t, "key_cache_ptr": t, "value_cache_ptr": t, "out_ptr": t}
                    | {"partial_out_ptr": "*fp32", "partial_lse_ptr": "*fp32", "block_tables_ptr": "*i32"}
                    | {"decode_token_ptr": "*i32", "decode_seq_ptr": "*i32", "seq_context_len_ptr": "*i32"}
                    | attention_common
                    | dict.fromkeys(("GROUP", "GROUP_BLOCK", "HEAD_DIM", "BLOCK_N"), "constexpr")
                    | {"NUM_SPLITS": "constexpr", "PRECISION": "constexpr"}
                    | attention_flags,
                    {"GROUP": group, "GROUP_BLOCK": 16, "HEAD_DIM": head_dim, "BLOCK_N": 64}
                    | {"NUM_SPLITS": splits, "PRECISION": precision}
                    | flags,
                    decode_launch_options(fp32),
                )
            )
    for sinks in (False, True):
        specs.append(
            (
                "triton_attention",
                "_decode_reduce_kernel",
                {
                    "out_ptr": t,
                    "partial_out_ptr": "*fp32",
                    "partial_lse_ptr": "*fp32",
                    "decode_token_ptr": "*i32",
                }
                | {"sinks_ptr": t, "num_heads": "i32", "head_dim": "i32"}
                | dict.fromkeys(("HEAD_DIM", "NUM_SPLITS", "HAS_SINKS"), "constexpr"),
                {"HEAD_DIM": 128 if not sinks else 64, "NUM_SPLITS": 8, "HAS_SINKS": sinks},
                {},
            )
        )
    specs += _latent_specialisations(dtype, shared_memory)
    # fused MoE at ERNIE-4.5-21B-A3B's shapes: routing over 64 experts, top-6, each GEMM tile config
    specs.append(
        (
            "triton_moe",
            "_route_kernel",
            {"logits_ptr": t, "bias_ptr": t, "weights_ptr": "*fp32", "ids_ptr": "*i32", "tokens": "i32"}
            | {"num_experts": "i32", "norm_min": "fp32"}
            | dict.fromkeys(
                ("HAS_BIAS", "RENORMALIZE", "TOP_K", "K_BLOCK", "EXPERTS", "BLOCK_T"), "constexpr"
            ),
            {"HAS_BIAS": True, "RENORMALIZE": True, "TOP_K": 6, "K_BLOCK": 8, "EXPERTS": 64, "BLOCK_T": 16},
            {},
        )
    )

    # decode (16-row tiles), 256 tokens (64) and 4096 tokens (128); A rows of tokens or of entries
    for entries, a_choices in ((96, (False,)), (1536, (True,)), (24576, (False, True))):
        launch = gemm_config(entries, 64, fp32, shared_memory)
        config = {k: v for k, v in launch.items() if not k.startswith("num_")}
        options = {k: v for k, v in launch.items() if k.startswith("num_")}
        for a_per_entry in a_choices:
            specs.append(
                (
                    "triton_moe",
                    "_gemm_kernel",
                    {"a_ptr": t, "w_ptr": t, "c_ptr": t, "sorted_ptr": "*i32", "block_expert_ptr": "*i32"}
                    | {"total_ptr": "*i32", "routing_ptr": "*fp32", "scale_ptr": t, "entries": "i32"}
                    | {"n_size": "i32", "k_size": "i32"}
                    | dict.fromkeys(("TOP_K", "A_PER_ENTRY", "MUL_ROUTING", "PRECISION"), "constexpr")
                    | dict.fromkeys(("W_FORMAT", "GROUP"), "constexpr")
                    | dict.fromkeys(config, "constexpr"),
                    {
                        "TOP_K": 6,
                        "A_PER_ENTRY": a_per_entry,
                        "MUL_ROUTING": a_per_entry,
                        "PRECISION": precision,
                        "W_FORMAT": 0,
                        "GROUP": 1,
                    }
                    | config,
                    options,
                )
            )
    return specs


def _latent_specialisations(dtype: str, shared_memory: int) -> list[Launch]:
    """Multi-head latent attention at DeepSeek-V3's shape (kv_lora_rank 512, rope 64, nope 128,
    v 128): the latent store, the absorbed decode (1 and 8 splits) and its reduce, and the paged
    prefill kernel over the expanded keys (192 wide, one query head per KV head)."""
    t = "*" + _TRITON_DTYPES[dtype]
    fp32 = dtype == "float32"
    precision = "ieee" if fp32 else "tf32"
    lora, rope, expanded = 512, 64, 128 + 64
    specs: list[Launch] = [
        (
            "triton_latent",
            "_store_latent_kernel",
            {"latent_ptr": t, "k_rope_ptr": t, "cache_ptr": t, "slot_mapping_ptr": "*i64"}
            | {"lora": "i32", "rope": "i32", "LORA_BLOCK": "constexpr", "ROPE_BLOCK": "constexpr"},
            {"LORA_BLOCK": lora, "ROPE_BLOCK": rope},
            {},
        ),
        (
            "triton_latent",
            "_latent_reduce_kernel",
            {"mixed_ptr": t, "partial_ptr": "*fp32", "partial_lse_ptr": "*fp32", "lora": "i32"}
            | {"LORA_BLOCK": "constexpr", "NUM_SPLITS": "constexpr"},
            {"LORA_BLOCK": lora, "NUM_SPLITS": 8},
            {},
        ),
    ]
    for splits in (1, 8):
        specs.append(
            (
                "triton_latent",
                "_latent_decode_kernel",
                {"q_latent_ptr": t, "q_rope_ptr": t, "cache_ptr": t, "mixed_ptr": t}
                | {"partial_ptr": "*fp32", "partial_lse_ptr": "*fp32", "block_tables_ptr": "*i32"}
                | {"decode_seq_ptr": "*i32", "context_ptr": "*i32", "scale_log2": "fp32"}
                | {"num_heads": "i32", "lora": "i32", "rope": "i32", "block_size": "i32", "max_blocks": "i32"}
                | dict.fromkeys(("HEAD_BLOCK", "LORA_BLOCK", "ROPE_BLOCK", "BLOCK_N"), "constexpr")
                | {"NUM_SPLITS": "constexpr", "PRECISION": "constexpr"},
                {"HEAD_BLOCK": LATENT_HEAD_BLOCK, "LORA_BLOCK": lora, "ROPE_BLOCK": rope}
                | {"BLOCK_N": latent_block_n(lora), "NUM_SPLITS": splits, "PRECISION": precision},
                latent_launch_options(lora),
            )
        )
    prefill = prefill_launch_options(fp32, expanded, shared_memory)
    specs.append(
        (
            "triton_attention",
            "_prefill_kernel",
            {"q_ptr": t, "key_cache_ptr": t, "value_cache_ptr": t, "out_ptr": t}
            | {"block_tables_ptr": "*i32", "seq_query_start_ptr": "*i32", "seq_query_len_ptr": "*i32"}
            | {"seq_context_len_ptr": "*i32", "tile_seq_ptr": "*i32", "tile_offset_ptr": "*i32"}
            | {"sinks_ptr": t, "scale_log2": "fp32", "window": "i32", "softcap_scale": "fp32"}
            | {"softcap_log2": "fp32", "num_heads": "i32", "num_kv_heads": "i32", "head_dim": "i32"}
            | {"block_size": "i32", "max_blocks": "i32"}
            | dict.fromkeys(("GROUP", "HEAD_DIM", "BLOCK_M", "BLOCK_N", "PRECISION"), "constexpr")
            | dict.fromkeys(("WINDOWED", "HAS_SINKS", "SOFTCAP"), "constexpr"),
            {"GROUP": 1, "HEAD_DIM": 256, "BLOCK_M": prefill_block_m(fp32)}
            | {"BLOCK_N": prefill["BLOCK_N"], "PRECISION": precision}
            | {"WINDOWED": False, "HAS_SINKS": False, "SOFTCAP": False},
            {k: v for k, v in prefill.items() if k.startswith("num_")},
        )
    )
    return specs


def _dtype_free_specialisations() -> list[Launch]:
    """Kernels whose inputs do not depend on the model dtype: sampling (float32 logits) and the
    MoE entry sort."""
    vocab = 152064
    chunk = sampling.chunk_size(vocab)
    num_chunks = -(-vocab // chunk)
    groups = -(-num_chunks // (sampling.GROUP_SIZE // chunk))
    pad = 1 << (num_chunks - 1).bit_length()
    groups_pad = 1 << (groups - 1).bit_length()
    shape = {"GROUP_CHUNKS": sampling.GROUP_SIZE // chunk, "CHUNK": chunk}
    warps = {"num_warps": sampling.SAMPLING_WARPS}
    return [
        (
            "triton_sampling",
            "_chunk_stats_kernel",
            {"logits_ptr": "*fp32", "temperature_ptr": "*fp32", "chunk_max_ptr": "*fp32"}
            | {"group_max_ptr": "*fp32", "group_sum_ptr": "*fp32", "vocab": "i32", "num_chunks": "i32"}
            | {
                "num_groups": "i32",
                "CHUNKS_PAD": "constexpr",
                "GROUP_CHUNKS": "constexpr",
                "CHUNK": "constexpr",
            },
            {"CHUNKS_PAD": pad} | shape,
            warps,
        ),
        (
            "triton_sampling",
            "_threshold_kernel",
            {
                "chunk_max_ptr": "*fp32",
                "group_max_ptr": "*fp32",
                "group_sum_ptr": "*fp32",
                "top_k_ptr": "*i32",
            }
            | {"threshold_ptr": "*fp32", "row_max_ptr": "*fp32", "row_sum_ptr": "*fp32", "vocab": "i32"}
            | {"num_chunks": "i32", "num_groups": "i32"}
            | dict.fromkeys(("CHUNKS_PAD", "GROUPS_PAD", "DEFAULT_K"), "constexpr"),
            {"CHUNKS_PAD": pad, "GROUPS_PAD": groups_pad, "DEFAULT_K": sampling.CANDIDATES_WITHOUT_TOP_K},
            warps,
        ),
        (
            "triton_sampling",
            "_gather_kernel",
            {"logits_ptr": "*fp32", "temperature_ptr": "*fp32", "threshold_ptr": "*fp32", "count_ptr": "*i32"}
            | {"cand_value_ptr": "*fp32", "cand_index_ptr": "*i32", "vocab": "i32"}
            | dict.fromkeys(("CAPACITY", "GROUP_CHUNKS", "CHUNK"), "constexpr"),
            {"CAPACITY": sampling.CAPACITY} | shape,
            warps,
        ),
        (
            "triton_sampling",
            "_pick_kernel",
            {"logits_ptr": "*fp32", "temperature_ptr": "*fp32", "top_k_ptr": "*i32", "top_p_ptr": "*fp32"}
            | {
                "uniform_ptr": "*fp32",
                "count_ptr": "*i32",
                "cand_value_ptr": "*fp32",
                "cand_index_ptr": "*i32",
            }
            | {
                "group_max_ptr": "*fp32",
                "group_sum_ptr": "*fp32",
                "row_max_ptr": "*fp32",
                "row_sum_ptr": "*fp32",
            }
            | {"out_ptr": "*i64", "vocab": "i32", "num_groups": "i32"}
            | dict.fromkeys(("CAPACITY", "GROUPS_PAD", "GROUP_CHUNKS", "CHUNK"), "constexpr"),
            {"CAPACITY": sampling.CAPACITY, "GROUPS_PAD": groups_pad} | shape,
            warps,
        ),
        (
            "triton_moe",
            "_align_kernel",
            {"ids_ptr": "*i32", "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "cursor_ptr": "*i32"}
            | {"total_ptr": "*i32", "entries": "i32", "num_experts": "i32", "max_sorted": "i32"}
            | {"max_blocks": "i32", "EXPERTS": "constexpr", "BLOCK_M": "constexpr", "TILE": "constexpr"},
            {"EXPERTS": 64, "BLOCK_M": 64, "TILE": 1024},
            {},
        ),
        (
            "triton_moe",
            "_scatter_kernel",
            {
                "ids_ptr": "*i32",
                "sorted_ptr": "*i32",
                "cursor_ptr": "*i32",
                "entries": "i32",
                "num_experts": "i32",
                "TILE": "constexpr",
            },
            {"TILE": 1024},
            {},
        ),
    ]


def _quant_specialisations(dtype: str, arch: int) -> list[Launch]:
    """The quantised matmul (`triton_quant`) for each weight format at a decode (skinny, split-K)
    and a prefill (tiled) launch of a 4096 x 4096 weight on a 132-SM GPU, FP8 where the
    architecture has e4m3 (sm_89+); and the fused MoE GEMM over wint8 / wint4 (/ FP8) experts."""
    t = "*" + _TRITON_DTYPES[dtype]
    precision = "ieee" if dtype == "float32" else "tf32"
    specs: list[Launch] = []
    for name in ("wint8", "wint4", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "fp8"):
        if name == "fp8" and arch < 89:
            continue
        weight = "*i8" if name == "wint8" else "*u8"
        scales = "*u8" if name.startswith("Q") else "*fp32"
        for rows in (1, 2048):
            launch = triton_quant.matmul_config(name, rows, 4096, 4096, 132, dtype == "float32", 128)
            out = "*fp32" if launch["SPLIT_K"] > 1 else t
            specs.append(
                (
                    "triton_quant",
                    "_quant_matmul_kernel",
                    {"x_ptr": t, "w_ptr": weight, "s_ptr": scales, "out_ptr": out}
                    | dict.fromkeys(("m_size", "n_size", "k_size", "x_stride", "w_row_bytes"), "i32")
                    | {"k_per_split": "i32"}
                    | dict.fromkeys(("FORMAT", "GROUP", "BLOCK_M", "BLOCK_N", "BLOCK_K"), "constexpr")
                    | {"SPLIT_K": "constexpr", "PRECISION": "constexpr"},
                    {"FORMAT": triton_quant.FORMATS[name], "GROUP": 128, "PRECISION": precision}
                    | {key: value for key, value in launch.items() if key.isupper()},
                    {key: value for key, value in launch.items() if key.startswith("num_")},
                )
            )
    # the fused MoE GEMM with wint8, wint4 and (sm_89+) FP8 experts (ERNIE-4.5-21B-A3B, 4096
    # tokens' tiles)
    launch = gemm_config(24576, 64, dtype == "float32", SHARED_MEMORY_LIMIT[arch])
    config = {k: v for k, v in launch.items() if not k.startswith("num_")}
    for w_format, weight in ((1, "*i8"), (2, "*u8"), (3, "*u8"))[: 3 if arch >= 89 else 2]:
        specs.append(
            (
                "triton_moe",
                "_gemm_kernel",
                {"a_ptr": t, "w_ptr": weight, "c_ptr": t, "sorted_ptr": "*i32", "block_expert_ptr": "*i32"}
                | {"total_ptr": "*i32", "routing_ptr": "*fp32", "scale_ptr": "*fp32", "entries": "i32"}
                | {"n_size": "i32", "k_size": "i32"}
                | dict.fromkeys(("TOP_K", "A_PER_ENTRY", "MUL_ROUTING", "PRECISION"), "constexpr")
                | dict.fromkeys(("W_FORMAT", "GROUP"), "constexpr")
                | dict.fromkeys(config, "constexpr"),
                {"TOP_K": 6, "A_PER_ENTRY": True, "MUL_ROUTING": True, "PRECISION": precision}
                | {"W_FORMAT": w_format, "GROUP": 128}
                | config,
                {k: v for k, v in launch.items() if k.startswith("num_")},
            )
        )
    return specs


DTYPES = ("float32", "bfloat16", "float16")


def _compile_one(arch: int, dtype: str, spec: Launch) -> CompiledKernel:
    module, name, signature, constexprs, options = spec
    kernel = getattr(importlib.import_module(f"fastdeploy.backends.cuda.{module}"), name)
    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    where = f"{name} ({dtype}, sm_{arch}, {constexprs}, {options or 'default launch options'})"
    try:
        binary = triton.compile(
            ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32), options=options
        )
    except Exception as exc:
        raise RuntimeError(f"{where} does not compile: {exc}") from exc
    shared = int(binary.metadata.shared)
    limit = SHARED_MEMORY_LIMIT.get(arch)
    if limit is not None and shared > limit:  # the launch would fail with OutOfResources on the GPU
        raise RuntimeError(f"{where} needs {shared} B of shared memory; sm_{arch} allows {limit} B")
    return CompiledKernel(name, arch, dtype, len(binary.asm["ptx"]), len(binary.asm["cubin"]), shared)


def compile_kernels(
    archs: tuple[int, ...] = (80, 90), dtypes: tuple[str, ...] = DTYPES, group: str = "core"
) -> list[CompiledKernel]:
    """Compile every kernel of `group` ("core": attention, element-wise, sampling, MoE; "quant":
    the quantised matmuls) for each arch (e.g. 80, 90) and dtype, on all cores; raises on an error."""
    if group == "quant":
        jobs = [
            (arch, dtype, spec)
            for arch in archs
            for dtype in dtypes
            for spec in _quant_specialisations(dtype, arch)
        ]
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return list(pool.map(_compile_one, *zip(*jobs, strict=True)))
    jobs = [
        (arch, dtype, spec)
        for arch in archs
        for dtype in dtypes
        for spec in _specialisations(dtype, SHARED_MEMORY_LIMIT[arch])
    ]
    jobs += [(arch, "float32", spec) for arch in archs for spec in _dtype_free_specialisations()]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(_compile_one, *zip(*jobs, strict=True)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastdeploy.backends.cuda.aot")
    parser.add_argument(
        "archs", nargs="*", type=int, default=[80, 90], help="compute capabilities, e.g. 80 90"
    )
    parser.add_argument(
        "--dtypes",
        type=lambda text: tuple(text.split(",")),
        default=DTYPES,
        help=f"storage dtypes, comma-separated (default {','.join(DTYPES)})",
    )
    parser.add_argument(
        "--group",
        choices=("core", "quant"),
        default="core",
        help="core: attention, element-wise, sampling and MoE kernels (default); quant: the quantised matmuls",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.dtypes) - set(DTYPES))
    if unknown:
        parser.error(f"--dtypes: unknown {', '.join(unknown)}; choose from {', '.join(DTYPES)}")
    for kernel in compile_kernels(tuple(args.archs), args.dtypes, args.group):
        sys.stdout.write(
            f"sm_{kernel.arch} {kernel.dtype:8} {kernel.name:22} ptx {kernel.ptx_bytes:7d} B, "
            f"cubin {kernel.cubin_bytes:7d} B, shared {kernel.shared_bytes:6d} B\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
