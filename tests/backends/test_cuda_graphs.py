"""Decode CUDA graphs: bucketing, padding, capture and replay, checked on the CPU.

A fake graph stands in for `torch.cuda.CUDAGraph`: capture runs the step once and keeps its
output tensors, replay re-runs the captured closure and writes the result into those same
tensors, which is what a replay does to captured memory. Everything else is the real code: the
torch-cpu backend with the Triton kernels (interpreted), static input buffers, padded rows, the
split-KV decode kernel with the bucket's split count, the model runner's seam, and the engine
with prefix caching and preemption.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.cuda.cuda_graphs import batch_buckets, bucket_for

torch = pytest.importorskip("torch", reason="the torch-cpu backend needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")

from device_doubles import FakeGraph  # noqa: E402


def test_buckets_cover_every_batch_size_up_to_max_num_seqs():
    assert batch_buckets(256)[:6] == [1, 2, 4, 8, 16, 24] and batch_buckets(256)[-1] == 256
    assert batch_buckets(5) == [1, 2, 4, 5]
    for max_num_seqs in (1, 3, 64, 100, 300):
        buckets = batch_buckets(max_num_seqs)
        for count in range(1, max_num_seqs + 1):
            size = bucket_for(count, buckets)
            assert size is not None and count <= size <= max_num_seqs
        assert bucket_for(max_num_seqs + 1, buckets) is None


def test_graph_replays_give_the_eager_tokens_under_prefix_caching_and_preemption(tmp_path, monkeypatch):
    from fastdeploy import LLM, SamplingParams
    from fastdeploy.backends.conformance import numpy_reference as ref
    from fastdeploy.backends.conformance.checkpoint import tiny_llama
    from fastdeploy.backends.cuda.cuda_graphs import DecodeGraphs

    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    config, weights = tiny_llama(str(tmp_path))
    # 10 blocks of 4 tokens: three 19-token sequences cannot all fit, so one is preempted
    llm = LLM(
        model=str(tmp_path),
        device="torch-cpu",
        max_model_len=32,
        block_size=4,
        num_gpu_blocks_override=10,
        max_num_seqs=4,
        enable_prefix_caching=True,
    )
    engine = llm.llm_engine
    assert engine.runner.graphs is None  # no GPU: the backend captures nothing itself
    runner = engine.runner
    graphs = DecodeGraphs(engine.backend, runner.model, runner.kv_caches, 4, 4, 32, new_graph=FakeGraph)
    graphs.capture()
    assert sorted(graphs.graphs) == [1, 2, 4]
    runner.graphs = graphs

    shared = [72, 101, 108, 108]  # one full block every prompt starts with (a prefix-cache hit)
    prompts = [shared + [111, 44, 32], shared + [87, 111, 114], shared + [100, 33, 9]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)  # fills the prefix cache
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    assert graphs.replays > 0
    assert engine.scheduler.num_preemptions > 0
    assert any(output.num_cached_tokens >= 4 for output in outputs)
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = ref.greedy_tokens(lambda ids: ref.llama_logits(weights, config, ids), prompt, 12)
        assert list(output.outputs.token_ids) == expected


def test_mixed_and_oversized_steps_run_eagerly():
    from fastdeploy.backends.base import BatchLayout
    from fastdeploy.backends.cuda.cuda_graphs import is_decode_only

    def layout(query_lens):
        n = len(query_lens)
        return BatchLayout(
            input_ids=np.zeros(sum(query_lens), np.int64),
            positions=np.zeros(sum(query_lens), np.int64),
            slot_mapping=np.zeros(sum(query_lens), np.int64),
            query_lens=np.array(query_lens, np.int64),
            context_lens=np.ones(n, np.int64),
            block_tables=np.zeros((n, 1), np.int64),
            logits_indices=np.zeros(n, np.int64),
            block_size=4,
        )

    assert is_decode_only(layout([1, 1, 1]))
    assert not is_decode_only(layout([1, 5, 1]))
    assert not is_decode_only(layout([]))


def test_a_one_token_prompt_chunk_is_not_a_graph_decode():
    """A step whose sequences all compute one token is replayed only if every one samples: a
    one-token chunk in the middle of a prompt (budget left over by chunked prefill) samples
    nothing, so the graph's logits rows would not be the step's samplers."""
    from fastdeploy.backends.cuda.cuda_graphs import is_decode_only
    from fastdeploy.engine.sampling_params import SamplingParams
    from fastdeploy.engine.scheduler import ScheduledBatch
    from fastdeploy.engine.sequence import Sequence
    from fastdeploy.model_executor.model_runner import build_layout

    def sequence(seq_id, prompt, computed):
        seq = Sequence(seq_id, str(seq_id), 0, prompt, SamplingParams(), 8, np.random.default_rng(0), 0.0)
        seq.num_computed_tokens = computed
        seq.block_table = [seq_id]
        return seq

    decoding = sequence(0, [5, 6, 7], 2)  # its last prompt token: samples
    batch = ScheduledBatch()
    batch.add(decoding, 1)
    assert is_decode_only(build_layout(batch, 4)[0])
    batch.add(sequence(1, [1, 2, 3, 4], 1), 1)  # token 2 of 4: samples nothing
    layout, sampling = build_layout(batch, 4)
    assert sampling == [0] and not is_decode_only(layout)


def test_a_sliding_window_model_replays_its_window_past_it(monkeypatch):
    """Phi-3 with a 20-position window on every layer (llama.cpp's GGUF of the tiny family
    checkpoint) on the Triton kernels: 16-token prefill chunks, then graph decodes far past the
    window, in 8 blocks of 8 slots for 94 positions (the blocks the window left behind are
    released and reused, so their table entries alias live ones). The window is a kernel
    argument of the captured launches; the tokens are still transformers' (the committed
    references of tests/models)."""
    import json
    from pathlib import Path

    from fastdeploy import LLM, SamplingParams
    from fastdeploy.backends.cuda.cuda_graphs import DecodeGraphs

    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    fixtures = Path(__file__).parents[1] / "fixtures"
    references = json.loads((fixtures / "tiny_family_references.json").read_text(encoding="utf-8"))
    prompt_set = references["models"]["phi3_window"]["prompt_sets"]["long"]
    (case,) = prompt_set["cases"]
    prompt, expected = case["prompt_token_ids"], case["output_token_ids"]
    assert len(prompt) + len(expected) > 8 * 8
    max_model_len = prompt_set["max_model_len"]
    llm = LLM(
        model=str(fixtures / "gguf" / "tiny-phi3-window-f32.gguf"),
        device="torch-cpu",
        dtype="float32",
        max_model_len=max_model_len,
        block_size=8,
        max_num_batched_tokens=16,
        num_gpu_blocks_override=8,
    )
    engine = llm.llm_engine
    runner = engine.runner
    assert [layer.attention.window for layer in runner.model.layers] == [20] * len(runner.model.layers)
    graphs = DecodeGraphs(
        engine.backend, runner.model, runner.kv_caches, 8, 2, max_model_len, new_graph=FakeGraph
    )
    graphs.capture()
    runner.graphs = graphs
    params = SamplingParams(temperature=0, max_tokens=len(expected), ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    assert graphs.replays == len(expected) - 1  # every token after the prefill's first
    assert list(output.outputs.token_ids) == expected
