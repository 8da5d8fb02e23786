"""Async scheduling (engine/async_scheduling.py) changes when the host reads tokens, never which.

Every case runs the same requests through an engine that overlaps its steps and through one
that steps one pass at a time (the reference: its tokens are checked against transformers in
tests/models), and compares tokens, text and finish reasons. The cpu backend runs the overlap
through the `Backend` defaults of `greedy_tokens` / `feed_tokens`; torch-cpu runs the tensor
backend's own (device-side argmax, token feed and host copies).
"""

from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.async_scheduling import PLACEHOLDER
from fastdeploy.errors import InvalidArgumentError

ENGINE = {"max_model_len": 512, "max_num_seqs": 8}
PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at", "1, 2, 3,"]


@pytest.fixture(scope="module")
def stepwise():
    return LLM(async_scheduling=False, **ENGINE)


@pytest.fixture(scope="module")
def overlapped():
    engine = LLM(async_scheduling=True, **ENGINE)
    assert engine.llm_engine.async_scheduling
    return engine


def results(outputs) -> list[tuple]:
    samples = [o.outputs if isinstance(o.outputs, list) else [o.outputs] for o in outputs]
    return [
        (o.error_code, [(s.token_ids, s.text, s.finish_reason) for s in each])
        for o, each in zip(outputs, samples, strict=True)
    ]


def generate_both(stepwise, overlapped, prompts, params) -> tuple[list, list]:
    expected = results(stepwise.generate(prompts, params, use_tqdm=False))
    got = results(overlapped.generate(prompts, params, use_tqdm=False))
    return expected, got


def greedy(**settings) -> SamplingParams:
    return SamplingParams(temperature=0, **settings)


def test_the_default_follows_the_backend():
    assert not LLM(**ENGINE).llm_engine.async_scheduling  # the cpu backend computes as it is called


def test_lengths_stop_strings_and_stop_tokens_end_where_stepwise_ends(stepwise, overlapped):
    reference = stepwise.generate(PROMPTS, greedy(max_tokens=24), use_tqdm=False)
    # a stop string inside the first answer and a stop token from the second: both end a
    # sequence on a token the host sees only after the next pass was launched
    stop = reference[0].outputs.text[6:10]
    stop_token = reference[1].outputs.token_ids[5]
    params = [
        greedy(max_tokens=24, stop=[stop]),
        greedy(max_tokens=24, stop_token_ids=[stop_token]),
        greedy(max_tokens=1),
        greedy(max_tokens=7, n=2),
        greedy(max_tokens=30, ignore_eos=True),
    ]
    expected, got = generate_both(stepwise, overlapped, PROMPTS, params)
    assert got == expected
    assert expected[0][1][0][2] == expected[1][1][0][2] == "stop"  # the cases end as intended
    blocks = overlapped.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


def test_requests_that_cannot_overlap_run_stepwise_beside_the_others(stepwise, overlapped):
    params = [
        greedy(max_tokens=12),
        SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12),
        greedy(max_tokens=12, logprobs=2),
        greedy(max_tokens=12, min_tokens=10, repetition_penalty=1.3),
        greedy(max_tokens=12, bad_words=["the"]),
    ]
    expected, got = generate_both(stepwise, overlapped, PROMPTS, params)
    assert got == expected


def test_preemption_and_prefix_caching_under_overlap():
    """A cache of 12 blocks of 16 slots for 5 sequences of up to 60 tokens: sequences are
    preempted and recomputed while passes are in flight; the shared prefix is served from
    blocks registered after their tokens landed."""
    settings = {"max_model_len": 128, "max_num_seqs": 8, "block_size": 16, "num_gpu_blocks_override": 12}
    prefix = "Here is a long shared introduction that several prompts start with, word for word: "
    prompts = [prefix + p for p in PROMPTS]
    params = greedy(max_tokens=36, ignore_eos=True)
    runs = []
    for mode in (False, True):
        engine = LLM(async_scheduling=mode, **settings)
        first = results(engine.generate(prompts, params, use_tqdm=False))
        second = results(engine.generate(prompts[::-1], params, use_tqdm=False))
        scheduler = engine.llm_engine.scheduler
        runs.append(
            (first, second, scheduler.num_preemptions > 0, scheduler.prefix_cache_stats.hit_tokens > 0)
        )
    assert runs[1] == runs[0]
    assert runs[0][2:] == (True, True)  # the case does preempt and hit the cache


def collect(engine: LLM, script: list[tuple[str, object]]) -> dict[str, list]:
    """Run `script` on the engine: ("add", (id, prompt, params, stream)), ("steps", n), ("abort", id);
    then step to the end. Every output of each request, in order."""
    llm_engine = engine.llm_engine
    tokenizer = engine.get_tokenizer()
    seen: dict[str, list] = {}

    def step() -> None:
        for output in llm_engine.step():
            seen.setdefault(output.request_id, []).append(
                (output.outputs.token_ids, output.outputs.text, output.finished, output.error_code)
            )

    for action, argument in script:
        if action == "add":
            request_id, prompt, params, stream = argument
            llm_engine.add_request(request_id, tokenizer.encode(prompt), params, prompt=prompt, stream=stream)
        elif action == "steps":
            for _ in range(argument):
                step()
        else:
            output = llm_engine.abort_request(argument)
            seen.setdefault(argument, []).append(("aborted", output is not None))
    while llm_engine.has_unfinished_requests():
        step()
    return seen


def test_streams_arrivals_and_aborts_mid_flight(stepwise, overlapped):
    script = [
        ("add", ("a", PROMPTS[0], greedy(max_tokens=20), True)),
        ("add", ("b", PROMPTS[1], greedy(max_tokens=20), False)),
        ("steps", 4),
        ("add", ("c", PROMPTS[2], greedy(max_tokens=10), True)),  # a prefill beside running decodes
        ("steps", 2),
        ("abort", "b"),
        ("add", ("d", PROMPTS[3], greedy(max_tokens=6), False)),
    ]
    overlapped_outputs = collect(overlapped, script)
    stepwise_outputs = collect(stepwise, script)
    finals = {rid: outs[-1] for rid, outs in stepwise_outputs.items()}
    assert {rid: outs[-1] for rid, outs in overlapped_outputs.items()} == finals
    for request_id in ("a", "c"):  # streamed: every step's tokens extend the last ones, all real
        streamed = [tokens for tokens, _, _, _ in overlapped_outputs[request_id]]
        assert all(PLACEHOLDER not in tokens for tokens in streamed)
        assert all(
            later[: len(earlier)] == earlier for earlier, later in zip(streamed, streamed[1:], strict=False)
        )
        assert streamed[-1] == finals[request_id][0]
    blocks = overlapped.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


def test_the_next_pass_is_launched_before_the_last_tokens_are_read(overlapped, monkeypatch):
    """What makes the overlap: pass N+1 is queued (its inputs fed from N's device tokens)
    before the host waits for N's tokens."""
    engine = overlapped.llm_engine
    events: list[str] = []
    greedy_tokens, feed_tokens = engine.backend.greedy_tokens, engine.backend.feed_tokens

    def recording_greedy_tokens(logits):
        pending = greedy_tokens(logits)
        number = events.count("launch")
        events.append("launch")
        wait = pending.wait
        pending.wait = lambda: (events.append(f"wait {number}"), wait())[1]
        return pending

    def recording_feed_tokens(input_ids, rows, pending, sources):
        events.append("feed")
        return feed_tokens(input_ids, rows, pending, sources)

    monkeypatch.setattr(engine.backend, "greedy_tokens", recording_greedy_tokens)
    monkeypatch.setattr(engine.backend, "feed_tokens", recording_feed_tokens)
    overlapped.generate(PROMPTS[:2], greedy(max_tokens=4, ignore_eos=True), use_tqdm=False)
    # prefill, then three decodes each fed from the pass before; pass k is read after k + 1 launched
    assert events == [
        "launch",
        "feed",
        "launch",
        "wait 0",
        "feed",
        "launch",
        "wait 1",
        "feed",
        "launch",
        "wait 2",
        "wait 3",
    ]


@pytest.fixture(scope="module")
def torch_cpu_default():
    """torch-cpu as a user gets it (loading takes seconds: shared)."""
    return LLM(device="torch-cpu", **ENGINE)


def test_the_tensor_backend_feeds_tokens_on_its_device(torch_cpu_default):
    """torch-cpu: argmax, feed and host copies through the runtime (the code the GPU runs)."""
    params = [greedy(max_tokens=n) for n in (9, 3, 14, 1, 6)]
    one_step_at_a_time = LLM(device="torch-cpu", async_scheduling=False, **ENGINE)
    assert one_step_at_a_time.llm_engine.async_scheduling is False
    assert torch_cpu_default.llm_engine.async_scheduling is True
    engines = (one_step_at_a_time, torch_cpu_default)
    outputs = [results(engine.generate(PROMPTS, params, use_tqdm=False)) for engine in engines]
    assert outputs[1] == outputs[0]


def test_torch_cpu_overlaps_by_default(torch_cpu_default):
    assert torch_cpu_default.llm_engine.async_scheduling


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"async_scheduling": "yes"}, "async_scheduling must be a bool or None"),
        (
            {
                "async_scheduling": True,
                "speculative_config": {"method": "ngram", "num_speculative_tokens": 2},
            },
            "cannot be combined with speculative_config",
        ),
        ({"async_scheduling": True, "tensor_parallel_size": 2}, "rank processes"),
    ],
)
def test_settings_that_cannot_overlap_are_refused(settings, message):
    with pytest.raises(InvalidArgumentError, match=message):
        LLM(**ENGINE, **settings)
