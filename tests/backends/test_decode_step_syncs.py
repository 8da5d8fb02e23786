"""One device-to-host transfer per decode step: sampling inside the captured step, checked on CPU.

The torch-cpu backend runs the real code (Triton kernels interpreted, the decode graphs' static
buffers, the engine); `device_doubles` stands in for what only a GPU has: a graph whose replay
re-runs its closure into the captured outputs, and a runtime that counts device-to-host transfers
(each `to_numpy` or `copy_to_host_later`, a synchronisation on a GPU) and logs the order of
host-buffer copies, events, replays and token reads.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the torch-cpu backend needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")

from device_doubles import CountingRuntime, FakeGraph  # noqa: E402

from fastdeploy.backends.cuda.runtimes.torch_runtime import TorchRuntime  # noqa: E402
from fastdeploy.backends.cuda.step_inputs import StagedBuffers  # noqa: E402

PROMPTS = [[72, 101, 108, 108, 111, 44, 32], [87, 111, 114, 108, 100], [100, 33, 9, 40, 41, 42]]
MAX_TOKENS = 4
#: sampled runs are shorter: each sampled row sorts its candidates in the interpreted Triton
#: kernel (seconds per step on a CPU), and two replayed steps show the replay draws as well as four
SAMPLED_TOKENS = 3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from fastdeploy.backends.conformance.checkpoint import tiny_llama

    path = tmp_path_factory.mktemp("tiny_llama")
    config, weights = tiny_llama(str(path))
    return str(path), config, weights


def build(model, async_scheduling: bool):
    """An engine on torch-cpu with decode graphs captured through `FakeGraph`, its runtime
    counting transfers."""
    from fastdeploy import LLM
    from fastdeploy.backends.cuda.cuda_graphs import DecodeGraphs

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FD_CUDA_KERNELS", "triton")
        llm = LLM(
            model=model[0],
            device="torch-cpu",
            max_model_len=32,
            block_size=4,
            num_gpu_blocks_override=24,
            max_num_seqs=4,
            async_scheduling=async_scheduling,
        )
    engine = llm.llm_engine
    runtime = CountingRuntime.install(engine.backend.rt)
    runner = engine.runner
    graphs = DecodeGraphs(engine.backend, runner.model, runner.kv_caches, 4, 4, 32, new_graph=FakeGraph)
    graphs.capture()
    runner.graphs = graphs
    return llm, graphs, runtime


@pytest.fixture(scope="module")
def stepwise(model):
    """One engine stepping synchronously, shared by the tests that count transfers."""
    return build(model, False)


def without_graphs(llm, prompts, params, graphs, runtime):
    """`per_step` with the runner's graphs taken away (the engine as it ran before them)."""
    runner = llm.llm_engine.runner
    runner.graphs = None
    try:
        return per_step(llm, graphs, runtime, prompts, params)
    finally:
        runner.graphs = graphs


def per_step(llm, graphs, runtime, prompts, params):
    """Tokens of each prompt, and (transfers, replays) of every engine step."""
    engine = llm.llm_engine
    steps = []
    original = engine.step

    def counted():
        transfers, replays = runtime.transfers, graphs.replays
        outputs = original()
        steps.append((runtime.transfers - transfers, graphs.replays - replays))
        return outputs

    engine.step = counted
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        del engine.step
    return [list(o.outputs.token_ids) for o in outputs], steps


def test_staged_inputs_alternate_host_buffers_and_wait_before_rewriting_one():
    runtime = CountingRuntime.install(TorchRuntime(False))
    staged = StagedBuffers(runtime, {"ids": ([4], "int64")})
    first = staged.host_arrays()["ids"]
    first[:] = [1, 2, 3, 4]
    staged.upload()
    second = staged.host_arrays()["ids"]
    assert second is not first  # step N+1 writes while step N's copy may still be queued
    second[:] = [5, 6, 7, 8]
    staged.upload()
    assert runtime.log == [f"copy {id(first)}", "record event 1", f"copy {id(second)}", "record event 2"]
    third = staged.host_arrays()["ids"]
    assert third is first and runtime.log[-1] == "wait event 1"  # its copy is done before reuse
    assert staged.device["ids"].tolist() == [5, 6, 7, 8]
    assert runtime.transfers == 0


def test_greedy_decode_steps_replay_with_one_transfer_each(model, stepwise):
    from fastdeploy import SamplingParams
    from fastdeploy.backends.conformance import numpy_reference as ref

    llm, graphs, runtime = stepwise
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens, steps = per_step(llm, graphs, runtime, PROMPTS, params)
    _, config, weights = model
    for prompt, got in zip(PROMPTS, tokens, strict=True):
        assert got == ref.greedy_tokens(
            lambda ids: ref.llama_logits(weights, config, ids), prompt, MAX_TOKENS
        )
    replayed = [transfers for transfers, replays in steps if replays]
    assert len(replayed) >= MAX_TOKENS - 1
    assert all(transfers == 1 for transfers in replayed)  # the ids and broken flags, one copy
    assert all(transfers == 1 for transfers, _ in steps)  # eager prefill steps sample in the pass too

    # as before: the row maxima, then the argmax
    again, eager_steps = without_graphs(llm, PROMPTS, params, graphs, runtime)
    assert again == tokens and all(transfers == 2 for transfers, _ in eager_steps)


def test_sampled_decode_steps_draw_in_the_replay_with_each_sequences_uniform(stepwise):
    """A replay samples with the row's settings and the uniform its sequence's generator draws,
    so a seeded request gets the tokens of the host-driven device sampler (no graphs)."""
    from fastdeploy import SamplingParams

    llm, graphs, runtime = stepwise
    params = SamplingParams(
        temperature=0.9, top_k=40, top_p=0.9, seed=7, max_tokens=SAMPLED_TOKENS, ignore_eos=True
    )
    prompts = PROMPTS[:2]
    tokens, steps = per_step(llm, graphs, runtime, prompts, params)
    assert sum(replays for _, replays in steps) >= SAMPLED_TOKENS - 1
    assert all(transfers == 1 for transfers, _ in steps)

    expected, eager_steps = without_graphs(llm, prompts, params, graphs, runtime)
    assert tokens == expected
    assert all(transfers == 2 for transfers, _ in eager_steps)  # row maxima, then the drawn ids
    assert len({tuple(t) for t in tokens}) == len(prompts)  # replays drew different numbers


def test_a_mixed_greedy_and_sampled_batch_gives_the_same_tokens_replayed_and_eager(stepwise):
    from fastdeploy import SamplingParams

    llm, graphs, runtime = stepwise
    params = [
        SamplingParams(temperature=0, max_tokens=SAMPLED_TOKENS, ignore_eos=True),
        SamplingParams(temperature=1.2, top_p=0.8, seed=3, max_tokens=SAMPLED_TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.7, top_k=5, seed=4, max_tokens=SAMPLED_TOKENS, ignore_eos=True),
    ]
    replayed, steps = per_step(llm, graphs, runtime, PROMPTS, params)
    assert sum(replays for _, replays in steps) >= SAMPLED_TOKENS - 1
    captured, graphs.graphs = graphs.graphs, {}  # no bucket: every step eager, same device stage
    try:
        eager, eager_steps = per_step(llm, graphs, runtime, PROMPTS, params)
    finally:
        graphs.graphs = captured
    assert sum(replays for _, replays in eager_steps) == 0
    assert eager == replayed
    assert all(transfers == 1 for transfers, _ in steps + eager_steps)


def test_async_steps_queue_the_next_inputs_and_replay_before_reading_the_last_tokens(model):
    from fastdeploy import SamplingParams
    from fastdeploy.backends.conformance import numpy_reference as ref

    llm, graphs, runtime = build(model, True)
    FakeGraph.log = runtime.log
    try:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        tokens, steps = per_step(llm, graphs, runtime, PROMPTS[:2], params)
    finally:
        FakeGraph.log = None
    _, config, weights = model
    for prompt, got in zip(PROMPTS[:2], tokens, strict=True):
        assert got == ref.greedy_tokens(
            lambda ids: ref.llama_logits(weights, config, ids), prompt, MAX_TOKENS
        )
    assert all(transfers <= 1 for transfers, _ in steps)
    log = [entry.split(" ")[0] for entry in runtime.log if not entry.startswith("wait")]
    # each replay: its inputs copied (four host buffers) and an event recorded just before it
    replays = [i for i, entry in enumerate(log) if entry == "replay"]
    assert len(replays) >= MAX_TOKENS - 1
    for i in replays:
        assert log[i - 5 : i] == ["copy"] * 4 + ["record"]
    # overlap: the host reads pass N's tokens only after pass N+1's inputs are copied and its
    # replay queued. Nothing is read before the first replay (the prefill pass's tokens wait),
    # each replay is followed by one read (of the pass before it), and every pass is read once.
    reads = [i for i, entry in enumerate(log) if entry == "read"]
    assert reads[0] > replays[0]
    assert all(log[i + 1] == "read" for i in replays)
    assert len(reads) == len(replays) + 1
    copies = [entry for entry in runtime.log if entry.startswith("copy")]
    assert len(set(copies)) == 8  # two sets of four host buffers, used in turn
    waits = [entry for entry in runtime.log if entry.startswith("wait")]
    assert waits  # a set is rewritten only after waiting for its last copy's event


def test_the_roofline_counts_the_weights_of_llama_3_2_1b():
    """benchmarks/decode_roofline.py's weight bytes at the 1B shape, plus its norms (two per layer
    and the final one, read too but negligible), are Llama-3.2-1B's published 1,235,814,400
    parameters at 2 bytes each."""
    import importlib.util
    import os

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    spec = importlib.util.spec_from_file_location(
        "decode_roofline", os.path.join(root, "benchmarks", "decode_roofline.py")
    )
    roofline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roofline)
    config = {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
    }
    norms = (2 * 16 + 1) * 2048
    assert roofline.weight_bytes(config) // 2 + norms == 1_235_814_400
