"""KV-cache memory of a model with sliding and global layers, with one block table for every layer
against one per layer group (`engine/kv_groups.py`), from the engine's own planner.

By default Gemma 3 1B's shape (26 layers: 22 sliding over 512 positions, 4 global; 1 KV head of
256) at a 32k context with 2048-token prefill chunks: per sequence, the tokens and bytes each
group holds at most, and how many full-length sequences a budget holds either way.

    python benchmarks/kv_groups.py [--max-model-len 32768] [--chunk 2048] [--budget-gib 8] [--dtype float32]

No weights are loaded: the model class is built from the config alone for its layer groups.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("FD_LOG_LEVEL", "WARNING")

from fastdeploy.backends.base import BackendOptions  # noqa: E402
from fastdeploy.backends.selection import create_backend  # noqa: E402
from fastdeploy.config import ModelConfig  # noqa: E402
from fastdeploy.model_executor.kv_cache_planner import split_blocks, tokens_held  # noqa: E402
from fastdeploy.models.gemma3 import Gemma3ForCausalLM  # noqa: E402
from fastdeploy.plugins.registry import get_registry  # noqa: E402

#: Gemma 3 1B's config.json, the fields the cache depends on
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": 262144,
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--budget-gib", type=float, default=8.0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "int8"])
    parser.add_argument("--max-num-seqs", type=int, default=64)
    args = parser.parse_args()
    backend = create_backend("cpu", BackendOptions(threads=1), get_registry())
    model = Gemma3ForCausalLM(ModelConfig.from_hf_dict(GEMMA3_1B), backend, args.max_model_len)
    groups = model.kv_cache_groups()
    whole = model.kv_cache_spec(0, args.block_size, args.dtype)
    per_layer_position = whole.bytes_per_position() // whole.num_layers
    print(
        f"Gemma 3 1B shape, max_model_len {args.max_model_len}, chunks of {args.chunk}, "
        f"{args.dtype} cache ({per_layer_position} bytes a layer and position), blocks of {args.block_size}"
    )
    print("| group | layers | tokens a sequence holds | MiB a sequence |")
    print("|---|---|---|---|")
    held, per_block, seq_bytes = [], [], 0
    for group in groups:
        tokens = tokens_held(group.window, args.max_model_len, args.chunk, args.block_size)
        blocks = -(-tokens // args.block_size)
        size = len(group.layers) * per_layer_position * args.block_size
        held.append(blocks)
        per_block.append(size)
        seq_bytes += blocks * size
        kind = f"sliding {group.window}" if group.window else "global"
        print(f"| {kind} | {len(group.layers)} | {tokens} | {blocks * size / 2**20:.0f} |")
    one_table = -(-args.max_model_len // args.block_size) * whole.bytes_per_block()
    print(f"| one table for all | {whole.num_layers} | {args.max_model_len} | {one_table / 2**20:.0f} |")
    budget = int(args.budget_gib * 2**30)
    counts = split_blocks(budget, per_block, held, args.max_num_seqs)
    shared = budget // whole.bytes_per_block()
    split = ", ".join(
        f"{count} blocks ({count * size / 2**30:.2f} GiB)"
        for count, size in zip(counts, per_block, strict=True)
    )
    print(
        f"\nper sequence: {seq_bytes / 2**20:.0f} MiB in groups against {one_table / 2**20:.0f} MiB ({one_table / seq_bytes:.1f}x)"
    )
    print(
        f"a {args.budget_gib:g} GiB cache, max_num_seqs {args.max_num_seqs}: groups get {split}; one table {shared} blocks"
    )
    for length in (args.max_model_len, args.chunk):
        blocks = -(-length // args.block_size)
        needs = [min(blocks, count) for count in held]
        in_groups = min(count // need for count, need in zip(counts, needs, strict=True))
        print(
            f"  sequences of {length} tokens at once: {min(in_groups, args.max_num_seqs)} in groups, "
            f"{min(shared // blocks, args.max_num_seqs)} with one table"
        )


if __name__ == "__main__":
    main()
