"""Generation behaviour: stop conditions, bans, seeds, n, batch invariance, preemption."""

import os

import pytest

from fastdeploy import LLM, SamplingParams

PROMPT = "The capital of France is"


def greedy(max_tokens=32, **kwargs):
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def only(outputs):
    (output,) = outputs
    assert output.error_code == 200, output.error_msg
    return output.outputs


def test_stop_string_ends_generation_and_is_excluded(llm):
    full = only(llm.generate(PROMPT, greedy(), use_tqdm=False))
    assert full.text.startswith(" Paris.\n\n")
    cut = only(llm.generate(PROMPT, greedy(stop=["\n"]), use_tqdm=False))
    assert cut.text == " Paris." and cut.finish_reason == "stop"
    kept = only(llm.generate(PROMPT, greedy(stop=["\n"], include_stop_str_in_output=True), use_tqdm=False))
    assert kept.text == " Paris.\n"
    # a stop string spanning several tokens
    multi = only(llm.generate(PROMPT, greedy(stop=["answer is"]), use_tqdm=False))
    assert multi.text == full.text[: full.text.index("answer is")]


def test_stop_token_ids_and_eos(llm):
    full = only(llm.generate(PROMPT, greedy(), use_tqdm=False))
    stop_at = full.token_ids[2]
    cut = only(llm.generate(PROMPT, greedy(stop_token_ids=[stop_at]), use_tqdm=False))
    assert cut.token_ids == full.token_ids[:3] and cut.finish_reason == "stop"
    # the reference output ends with EOS (id 2); ignore_eos keeps going until max_tokens
    assert full.token_ids[-1] == 2 and full.finish_reason == "stop"
    longer = only(
        llm.generate(PROMPT, greedy(max_tokens=len(full.token_ids) + 5, ignore_eos=True), use_tqdm=False)
    )
    assert len(longer.token_ids) == len(full.token_ids) + 5 and longer.finish_reason == "length"
    assert longer.token_ids[: len(full.token_ids)] == full.token_ids


def test_min_tokens_suppresses_eos(llm):
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    plain = only(llm.chat(chat, greedy(), use_tqdm=False))
    assert plain.token_ids[-1] == 2
    forced = only(llm.chat(chat, greedy(min_tokens=len(plain.token_ids) + 3), use_tqdm=False))
    assert 2 not in forced.token_ids[: len(plain.token_ids) + 3]
    assert forced.token_ids[: len(plain.token_ids) - 1] == plain.token_ids[:-1]


def test_bad_words_are_never_generated(llm):
    plain = only(llm.generate(PROMPT, greedy(max_tokens=8), use_tqdm=False))
    assert "Paris" in plain.text
    banned = only(llm.generate(PROMPT, greedy(max_tokens=8, bad_words=["Paris"]), use_tqdm=False))
    assert "Paris" not in banned.text


def test_max_tokens_bounds_the_output(llm):
    out = only(llm.generate(PROMPT, greedy(max_tokens=3), use_tqdm=False))
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=16)
    alone = only(llm.generate(PROMPT, params, use_tqdm=False))
    again = only(llm.generate(PROMPT, params, use_tqdm=False))
    assert alone.token_ids == again.token_ids
    crowd = ["Once upon a time", "def add(a, b):", PROMPT, "1, 2, 3,"]
    others = [SamplingParams(temperature=1.0, max_tokens=20) for _ in crowd]
    outputs = llm.generate(crowd, [others[0], others[1], params, others[3]], use_tqdm=False)
    assert outputs[2].outputs.token_ids == alone.token_ids
    different_seed = only(
        llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=8, max_tokens=16), use_tqdm=False)
    )
    assert different_seed.token_ids != alone.token_ids


def test_n_samples(llm):
    (output,) = llm.generate(
        PROMPT, SamplingParams(n=3, seed=3, max_tokens=8, temperature=1.0), use_tqdm=False
    )
    samples = list(output.outputs)
    assert len(output.outputs) == 3 and [s.index for s in samples] == [0, 1, 2]
    assert output.outputs is samples[0] and output.outputs[2] is samples[2]
    assert len({tuple(s.token_ids) for s in samples}) > 1


def test_greedy_request_is_batch_invariant(llm):
    target = PROMPT
    alone = only(llm.generate(target, greedy(max_tokens=24), use_tqdm=False))
    texts = ["Once upon a time, in a small village,", "def fibonacci(n):", "1, 2, 3, 4, 5,", "Hello"]
    prompts, params = [], []
    for i in range(31):
        prompts.append(texts[i % 4] * (1 + i % 3))
        params.append(
            SamplingParams(temperature=0.8, seed=i, max_tokens=8 + i) if i % 2 else greedy(max_tokens=5 + i)
        )
    prompts.insert(13, target)
    params.insert(13, greedy(max_tokens=24))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert len(outputs) == 32 and all(o.error_code == 200 for o in outputs)
    assert outputs[13].outputs.token_ids == alone.token_ids


def test_preemption_completes_every_request_correctly(llm):
    prompts = [f"Story number {i}: Once upon a time" for i in range(6)]
    expected = [
        o.outputs.token_ids
        for o in llm.generate(prompts, greedy(max_tokens=40, ignore_eos=True), use_tqdm=False)
    ]
    # 6 blocks of 16 tokens: each request needs 4 blocks by the end, so they cannot all run at once
    small = LLM(max_model_len=64, block_size=16, num_gpu_blocks_override=6, max_num_seqs=6)
    outputs = small.generate(prompts, greedy(max_tokens=40, ignore_eos=True), use_tqdm=False)
    assert small.llm_engine.scheduler.num_preemptions > 0
    assert [o.outputs.token_ids for o in outputs] == expected
    assert small.llm_engine.block_manager.num_free_blocks == 6


def test_profile_line_is_logged(llm):
    with open(os.path.join(os.environ["FD_LOG_DIR"], "fastdeploy.log"), encoding="utf-8") as log:
        text = log.read()
    assert "Doing profile, the total_block_num:" in text


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"model": "/no/such/model"}, FileNotFoundError, "neither an existing path nor an embedded model"),
        (
            {"tensor_parallel_size": 2},
            ValueError,
            "tensor_parallel_size=2 does not divide the 9 attention heads of SmolLM2-135M-Instruct; "
            "sizes this model allows: 1, 3, 9",
        ),
        (
            {"tensor_parallel_size": 16},
            ValueError,
            "tensor_parallel_size=16 is larger than the 9 attention heads",
        ),
        (
            {"pipeline_parallel_size": 31},
            ValueError,
            "pipeline_parallel_size=31 is larger than the 30 decoder layers",
        ),
        (
            {"data_parallel_size": 0},
            ValueError,
            "data_parallel_size must be an int >= 1 (engine replicas), got 0",
        ),
        (
            {
                "tensor_parallel_size": 3,
                "pipeline_parallel_size": 2,
                "ips": "127.0.0.1,203.0.113.1,203.0.113.2,203.0.113.3",
            },
            ValueError,
            "tensor_parallel_size x pipeline_parallel_size = 3 x 2 = 6 ranks cannot be split evenly over the 4 hosts",
        ),
        ({"device": "tpu"}, ValueError, "device 'tpu' is not a registered backend"),
        ({"bogus_option": 1}, ValueError, "unsupported argument(s): bogus_option"),
        ({"block_size": 48}, ValueError, "block_size must be a power of two"),
        ({"max_num_seqs": 0}, ValueError, "max_num_seqs must be a positive int"),
        (
            {"reasoning_parser": "no-such-parser"},
            ValueError,
            "reasoning_parser 'no-such-parser' is not registered",
        ),
        ({"num_gpu_blocks_override": 1, "max_model_len": 512}, ValueError, "fewer than max_model_len=512"),
        # 10**9 blocks of SmolLM2's 30 layers x 3 KV heads x 64 dims: petabytes, not a crash
        ({"num_gpu_blocks_override": 10**9}, ValueError, "num_gpu_blocks_override=1000000000 asks for"),
        ({"kv_cache_memory": 2**60}, ValueError, "more than the"),
        ({"max_model_len": 10**12}, ValueError, "of rotary tables alone"),
        ({"chat_template": "{% for %}"}, ValueError, "chat template is not valid Jinja (line 1)"),
        ({"gpu_memory_utilization": "0.5"}, ValueError, "gpu_memory_utilization must be a number in (0, 1]"),
        ({"gpu_memory_utilization": True}, ValueError, "gpu_memory_utilization must be a number"),
        ({"seed": 2**64}, ValueError, "seed must be an int in [0, 2**63)"),
        ({"mm_processor_kwargs": 5}, ValueError, "mm_processor_kwargs must be a dict"),
        ({"ips": 5}, ValueError, "ips must be a comma list or a list of host addresses"),
        ({"allowed_local_media_path": 5}, ValueError, "allowed_local_media_path must be a directory"),
    ],
)
def test_bad_construction_arguments(kwargs, error, fragment, monkeypatch):
    monkeypatch.delenv("FD_NODE_RANK", raising=False)
    with pytest.raises(error) as info:
        LLM(**kwargs)
    assert fragment in str(info.value)
