"""Sliding windows and attention sinks on a GPU (issues 28 and 29 on the cuda backend).

- the compiled prefill and split-KV decode kernels against float64 attention on the GPU, in
  bfloat16 and float32, with grouped heads, windows that start inside blocks and tiles, sinks
  (some large: a head attending to almost nothing) and soft-capped scores (Gemma 2);
- the window's cost: over a 32k context a windowed prefill chunk and windowed decodes read only
  their window (tiles before it are skipped, not masked), so they take a fraction of the full
  context's time;
- a sliding model's greedy tokens with the backend's real CUDA graphs: Phi-3 with a 20-position
  window on every layer (the committed GGUF and transformers' tokens of tests/models), decoding
  far past its window in a cache smaller than its context.

`FD_GPU_TEST_DEVICE=torch-cpu TRITON_INTERPRET=1` runs the model test on the host (Triton
interpreted; no graphs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from fastdeploy.backends.base import BatchLayout

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("FD_GPU_TEST_DEVICE", "cuda")
FIXTURES = Path(__file__).parents[1] / "fixtures"
#: (cached positions, query tokens) per sequence: a long prefill, a chunk after a cached prefix,
#: decodes short and long
SEQUENCES = [(0, 1500), (3000, 700), (4095, 1), (300, 1), (9000, 1)]


def _kernels_or_skip():
    if DEVICE != "cuda":
        pytest.skip("compiled kernels need the GPU (tests/backends/test_triton_attention.py interprets them)")
    import torch

    from fastdeploy.backends.cuda import triton_attention as attention

    return torch, attention


def _step(torch, sequences, heads, kv_heads, head_dim, block, dtype, seed=0):
    """A step's layout, device caches (shuffled blocks), queries and each sequence's keys/values."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    contexts = [cached + new for cached, new in sequences]
    per_seq = [-(-c // block) for c in contexts]
    order = torch.randperm(sum(per_seq), generator=gen, device="cuda").cpu().numpy()
    tables = np.zeros((len(sequences), max(per_seq)), np.int32)
    key_cache = torch.zeros(sum(per_seq) * block, kv_heads, head_dim, dtype=dtype, device="cuda")
    value_cache = torch.zeros_like(key_cache)
    history, slots, positions, used = [], [], [], 0
    for seq, ((cached, _new), context) in enumerate(zip(sequences, contexts, strict=True)):
        tables[seq, : per_seq[seq]] = order[used : used + per_seq[seq]]
        used += per_seq[seq]
        pos = np.arange(context)
        seq_slots = torch.from_numpy(tables[seq, pos // block].astype(np.int64) * block + pos % block).cuda()
        keys, values = torch.randn(2, context, kv_heads, head_dim, generator=gen, device="cuda").to(dtype)
        key_cache[seq_slots], value_cache[seq_slots] = keys, values
        history.append((keys, values))
        slots.append(seq_slots[cached:].cpu().numpy())
        positions.append(pos[cached:])
    tokens = sum(new for _, new in sequences)
    layout = BatchLayout(
        input_ids=np.zeros(tokens, np.int64),
        positions=np.concatenate(positions),
        slot_mapping=np.concatenate(slots),
        query_lens=np.array([new for _, new in sequences], np.int64),
        context_lens=np.array(contexts, np.int64),
        block_tables=tables,
        logits_indices=np.zeros(0, np.int64),
        block_size=block,
    )
    q = torch.randn(tokens, heads, head_dim, generator=gen, device="cuda").to(dtype)
    return layout, q, key_cache, value_cache, history


def _expected(torch, q, history, sequences, scale, sinks, window, softcap=0.0):
    """float64 attention of each sequence's queries over its keys (the last `window` of them;
    scores capped at softcap * tanh(score / softcap) where `softcap` > 0)."""
    out, start = [], 0
    for (cached, new), (keys, values) in zip(sequences, history, strict=True):
        group = q.shape[1] // keys.shape[1]
        k = keys.double().repeat_interleave(group, 1).transpose(0, 1)  # [heads, ctx, d]
        v = values.double().repeat_interleave(group, 1).transpose(0, 1)
        scores = torch.einsum("qhd,hkd->hqk", q[start : start + new].double(), k) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        query_pos = torch.arange(cached, cached + new, device="cuda")[:, None]
        key_pos = torch.arange(cached + new, device="cuda")[None, :]
        hidden = key_pos > query_pos
        if window:
            hidden |= key_pos <= query_pos - window
        scores = scores.masked_fill(hidden, float("-inf"))
        if sinks is not None:
            column = sinks.double()[:, None, None].expand(-1, new, 1)
            weights = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]
        else:
            weights = torch.softmax(scores, -1)
        out.append(torch.einsum("hqk,hkd->qhd", weights, v))
        start += new
    return torch.cat(out)


def _launch(torch, attention, layout, q, key_cache, value_cache, sinks, window, softcap=0.0):
    from fastdeploy.backends.cuda.attention_metadata import build_host_metadata
    from fastdeploy.backends.cuda.launch import device_shared_memory

    is_float32 = q.dtype == torch.float32
    meta = build_host_metadata(layout, attention.prefill_block_m(is_float32))
    put = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    tables, starts, lens, contexts = (
        put(a) for a in (meta.block_tables, meta.seq_query_start, meta.seq_query_len, meta.seq_context_len)
    )
    tile_seq, tile_offset, tokens, seqs = (
        put(a) for a in (meta.tile_seq, meta.tile_offset, meta.decode_token, meta.decode_seq)
    )
    heads, head_dim, kv_heads = q.shape[1], q.shape[2], key_cache.shape[1]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = attention.decode_splits(tokens.shape[0], kv_heads, meta.max_context, sms)
    partial_out = torch.empty(tokens.shape[0], heads, splits, head_dim, device="cuda")
    partial_lse = torch.empty(tokens.shape[0], heads, splits, device="cuda")
    out = torch.empty_like(q)
    shared_memory = device_shared_memory()
    scale = head_dim**-0.5
    block = layout.block_size

    def prefill():
        attention.prefill_attention(
            q, key_cache, value_cache, out, tables, starts, lens, contexts, tile_seq, tile_offset,
            scale, block, shared_memory, sinks, window, softcap,
        )  # fmt: skip

    def decode():
        attention.decode_attention(
            q, key_cache, value_cache, out, tables, tokens, seqs, contexts, partial_out, partial_lse,
            scale, block, splits, sinks, window, softcap,
        )  # fmt: skip

    return out, prefill, decode


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(
    ("window", "with_sinks", "softcap"),
    [
        (0, True, 0.0),
        (128, False, 0.0),
        (1000, True, 0.0),
        (4096, True, 0.0),
        (0, False, 1.5),
        (1000, False, 1.5),
    ],
)
def test_compiled_kernels_match_float64_attention(dtype, window, with_sinks, softcap):
    torch, attention = _kernels_or_skip()
    torch_dtype = getattr(torch, dtype)
    heads, kv_heads, head_dim, block = 32, 8, 64, 16
    layout, q, key_cache, value_cache, history = _step(
        torch, SEQUENCES, heads, kv_heads, head_dim, block, torch_dtype
    )
    sinks = None
    if with_sinks:
        sinks = torch.linspace(-4.0, 9.0, heads, device="cuda")[torch.randperm(heads, device="cuda")]
    out, prefill, decode = _launch(
        torch, attention, layout, q, key_cache, value_cache, sinks, window, softcap
    )
    prefill()
    decode()
    expected = _expected(torch, q, history, SEQUENCES, head_dim**-0.5, sinks, window, softcap)
    tolerance = 1e-4 if dtype == "float32" else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_window_costs_its_window_not_the_context(phase):
    """bfloat16, 32/8 heads, d 128, 64-slot blocks, a 32768-position context, a 1024-position
    window: prefill a 2048-token chunk at its end (4 sequences), or decode 32 sequences. The
    windowed launch reads about 1/16 (prefill) or 1/32 (decode) of the keys; it must take under
    a quarter of the full-context time."""
    torch, attention = _kernels_or_skip()
    import triton.testing

    context, window = 32768, 1024
    sequences = [(context - 2048, 2048)] * 4 if phase == "prefill" else [(context - 1, 1)] * 32
    layout, q, key_cache, value_cache, _ = _step(torch, sequences, 32, 8, 128, 64, torch.bfloat16)
    times = {}
    for name, width in (("full", 0), ("windowed", window)):
        _, prefill, decode = _launch(torch, attention, layout, q, key_cache, value_cache, None, width)
        run = prefill if phase == "prefill" else decode
        times[name] = triton.testing.do_bench(run, warmup=10, rep=100, return_mode="median")
    assert times["windowed"] < 0.25 * times["full"], times


def test_a_sliding_model_gives_transformers_tokens_with_cuda_graphs(monkeypatch):
    from fastdeploy import LLM, SamplingParams

    if DEVICE != "cuda":
        monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    references = json.loads((FIXTURES / "tiny_family_references.json").read_text(encoding="utf-8"))
    prompt_set = references["models"]["phi3_window"]["prompt_sets"]["long"]
    (case,) = prompt_set["cases"]
    llm = LLM(
        model=str(FIXTURES / "gguf" / "tiny-phi3-window-f32.gguf"),
        device=DEVICE,
        dtype="float32",
        max_model_len=prompt_set["max_model_len"],
        block_size=8,
        max_num_batched_tokens=16,
        num_gpu_blocks_override=8,
        max_num_seqs=2,
    )
    params = SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"]), ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": case["prompt_token_ids"]}], params, use_tqdm=False)
    assert list(output.outputs.token_ids) == case["output_token_ids"]
    graphs = llm.llm_engine.runner.graphs
    if DEVICE == "cuda":
        assert graphs is not None and graphs.replays > 0
