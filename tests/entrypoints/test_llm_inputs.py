"""LLM.generate / LLM.chat input forms, output structure and per-request errors."""

import pytest

from fastdeploy import SamplingParams
from fastdeploy.engine.request import CompletionOutput, RequestMetrics, RequestOutput
from fastdeploy.errors import InvalidArgumentError

GREEDY = SamplingParams(temperature=0, max_tokens=6)


def test_all_prompt_forms_in_input_order(llm):
    tok = llm.get_tokenizer()
    text_a, text_b = "The capital of France is", "def fibonacci(n):"
    ids_a, ids_b = tok.encode(text_a), tok.encode(text_b)
    expected_a = llm.generate(text_a, GREEDY, use_tqdm=False)[0].outputs.token_ids
    expected_b = llm.generate(text_b, GREEDY, use_tqdm=False)[0].outputs.token_ids
    forms = [
        ([text_a, text_b], [expected_a, expected_b]),
        (ids_a, [expected_a]),
        ([ids_b, ids_a], [expected_b, expected_a]),
        ({"prompt": text_b}, [expected_b]),
        ([{"prompt": text_a}, {"prompt_token_ids": ids_b}], [expected_a, expected_b]),
    ]
    for prompts, expected in forms:
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [o.outputs.token_ids for o in outputs] == expected, prompts


def test_output_fields_as_documented(llm):
    (output,) = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert isinstance(output, RequestOutput) and isinstance(output.outputs, CompletionOutput)
    assert isinstance(output.request_id, str) and output.prompt == "Hello"
    assert output.prompt_token_ids == llm.get_tokenizer().encode("Hello")
    assert output.finished and output.error_code == 200 and output.error_msg is None
    assert output.num_cached_tokens == 0
    completion = output.outputs
    assert completion.index == 0 and completion.send_idx == 4 and len(completion.token_ids) == 4
    assert completion.text == llm.get_tokenizer().decode(completion.token_ids)
    assert completion.reasoning_content is None and completion.finish_reason == "length"
    # vLLM-style access works too
    assert (
        output.outputs[0] is completion and len(output.outputs) == 1 and list(output.outputs) == [completion]
    )
    metrics = output.metrics
    assert isinstance(metrics, RequestMetrics)
    assert metrics.inference_start_time >= metrics.arrival_time > 0
    assert 0 <= metrics.time_in_queue <= metrics.first_token_time <= metrics.model_execute_time
    assert 0 < metrics.model_forward_time <= metrics.model_execute_time


def test_one_sampling_params_per_prompt(llm):
    outputs = llm.generate(
        ["a", "b"],
        [SamplingParams(temperature=0, max_tokens=2), SamplingParams(temperature=0, max_tokens=5)],
        use_tqdm=False,
    )
    assert [len(o.outputs.token_ids) for o in outputs] == [2, 5]


def test_bad_prompts_fail_alone(llm):
    too_long = "hello " * 1100
    prompts = ["The capital of France is", "", too_long, 42, {"prompt_token_ids": [10**9]}, "def f(x):"]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert len(outputs) == len(prompts)
    good = [outputs[0], outputs[5]]
    assert all(o.error_code == 200 and len(o.outputs.token_ids) == 6 for o in good)
    errors = {i: outputs[i] for i in (1, 2, 3, 4)}
    assert all(o.error_code == 400 and o.finished and o.outputs.token_ids == [] for o in errors.values())
    assert "empty" in errors[1].error_msg
    assert "max_model_len=1024" in errors[2].error_msg
    assert "must be a str, a list of token ids" in errors[3].error_msg
    assert "token ids must be in [0, 49152)" in errors[4].error_msg


def test_multimodal_data_on_a_text_model_fails_alone(llm):
    outputs = llm.generate(
        [{"prompt": "describe", "multimodal_data": {"image": ["x"]}}, "Hi"], GREEDY, use_tqdm=False
    )
    assert outputs[0].error_code == 400 and "text only" in outputs[0].error_msg
    assert outputs[1].error_code == 200


@pytest.mark.parametrize(
    ("prompts", "params", "fragment"),
    [
        (3.5, None, "prompts must be a str"),
        (None, None, "prompts must be a str"),
        (["a", "b"], [SamplingParams()], "got 1 sampling_params for 2 prompts"),
        ("a", {"temperature": 0}, "sampling_params must be a SamplingParams"),
    ],
)
def test_wrong_argument_types_raise(llm, prompts, params, fragment):
    with pytest.raises(InvalidArgumentError, match=fragment):
        llm.generate(prompts, params, use_tqdm=False)


def test_empty_batch_returns_nothing(llm):
    assert llm.generate([], use_tqdm=False) == []


def test_chat_single_and_batch(llm):
    conversation = [{"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(temperature=0, max_tokens=8)
    (single,) = llm.chat(conversation, params, use_tqdm=False)
    batch = llm.chat(
        [conversation, [{"role": "system", "content": "Be brief."}, *conversation]], params, use_tqdm=False
    )
    assert len(batch) == 2
    assert batch[0].outputs.token_ids == single.outputs.token_ids
    assert batch[1].prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert single.prompt.endswith("<|im_start|>assistant\n")


def test_chat_bad_conversation_fails_alone(llm):
    good = [{"role": "user", "content": "Hi"}]
    outputs = llm.chat([good, [{"content": "no role"}]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert outputs[0].error_code == 200
    assert outputs[1].error_code == 400 and "conversation 1" in outputs[1].error_msg


def test_chat_template_override_and_kwargs(llm):
    template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if enable_thinking %}<think>{% endif %}|"
    )
    (output,) = llm.chat(
        [{"role": "user", "content": "Hello"}],
        SamplingParams(max_tokens=1),
        use_tqdm=False,
        chat_template=template,
        chat_template_kwargs={"enable_thinking": True},
    )
    assert output.prompt == "Hello<think>|"


def test_progress_bar_reports_requests_and_throughput(llm, capsys):
    llm.generate(["a", "b"], SamplingParams(max_tokens=3), use_tqdm=True)
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "2/2" in err and "output:" in err and "toks/s" in err


def test_a_prompt_that_is_not_valid_unicode_fails_alone(llm):
    """A lone surrogate: the tokenizer's own TypeError aborted the batch and left the prompts
    queued before it to run on into the next call."""
    (alone,) = llm.generate("The capital of France is", GREEDY, use_tqdm=False)
    good, bad = llm.generate(["The capital of France is", "caf\ud800"], GREEDY, use_tqdm=False)
    assert good.outputs.token_ids == alone.outputs.token_ids
    assert (
        bad.error_code == 400 and "not valid Unicode" in bad.error_msg and "at character 3" in bad.error_msg
    )
    (chat,) = llm.chat([{"role": "user", "content": "\ud800"}], GREEDY, use_tqdm=False)
    assert chat.error_code == 400 and "not valid Unicode" in chat.error_msg
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_failure_while_queueing_leaves_nothing_queued(llm, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug while queueing")

    engine = llm.llm_engine
    original = engine.add_request
    calls = []

    def add_then_break(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            broken()
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "add_request", add_then_break)
    with pytest.raises(RuntimeError, match="a bug while queueing"):
        llm.generate(["one", "two", "three"], GREEDY, use_tqdm=False)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("key", ["add_generation_prompt", "chat_template", "messages"])
def test_chat_template_kwargs_cannot_set_the_renderers_own_arguments(llm, key):
    (output,) = llm.chat(
        [{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False, chat_template_kwargs={key: 5}
    )
    assert output.error_code == 400 and f"chat_template_kwargs cannot set '{key}'" in output.error_msg


def test_calls_from_two_threads_take_turns(llm):
    """The engine is stepped by its caller: two threads' calls must not interleave their steps."""
    import threading

    prompts = {"a": ["The capital of France is"] * 4, "b": ["1, 2, 3,"] * 4}
    alone = {name: llm.generate(batch, GREEDY, use_tqdm=False) for name, batch in prompts.items()}
    got: dict[str, list] = {}
    threads = [
        threading.Thread(
            target=lambda n=name: got.__setitem__(n, llm.generate(prompts[n], GREEDY, use_tqdm=False))
        )
        for name in prompts
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for name in prompts:
        assert [o.outputs.token_ids for o in got[name]] == [o.outputs.token_ids for o in alone[name]]
        assert all(o.error_code == 200 for o in got[name])


def test_generate_after_shutdown_says_so():
    from fastdeploy import LLM
    from fastdeploy.errors import EngineStoppedError

    llm = LLM(max_model_len=256, max_num_seqs=2)
    assert llm.generate("Hi", GREEDY, use_tqdm=False)[0].error_code == 200
    llm.shutdown()
    with pytest.raises(EngineStoppedError, match=r"has been shut down \(LLM.shutdown\(\)\)"):
        llm.generate("Hi", GREEDY, use_tqdm=False)
    with pytest.raises(EngineStoppedError):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)


def test_token_ids_as_numpy_ints_or_a_tuple_and_malformed_token_lists(llm):
    import numpy as np

    ids = llm.get_tokenizer().encode("The capital of France is")
    (expected,) = llm.generate(ids, GREEDY, use_tqdm=False)
    for form in (tuple(ids), [np.int64(i) for i in ids], [[np.int32(i) for i in ids]]):
        (output,) = llm.generate(form, GREEDY, use_tqdm=False)
        assert output.outputs.token_ids == expected.outputs.token_ids, type(form)
    (bad,) = llm.generate([1, 2, True], GREEDY, use_tqdm=False)
    assert (
        bad.error_code == 400
        and bad.error_msg == "token ids must be ints; item 2 of the list is a bool (True)"
    )
    good, bad = llm.generate([ids, [1, 2, 3.0]], GREEDY, use_tqdm=False)
    assert good.outputs.token_ids == expected.outputs.token_ids
    assert bad.error_msg == "prompt 1: token ids must be ints; item 2 of the list is a float (3.0)"


def test_flags_must_be_bools(llm):
    chat = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidArgumentError, match="use_tqdm must be a bool, got 'yes'"):
        llm.generate("hi", GREEDY, use_tqdm="yes")
    (output,) = llm.chat(chat, GREEDY, use_tqdm=False, add_generation_prompt=5)
    assert output.error_code == 400 and "add_generation_prompt must be a bool, got 5" in output.error_msg
    (output,) = llm.chat(chat, GREEDY, use_tqdm=False, chat_template_kwargs={"enable_thinking": "no"})
    assert output.error_code == 400 and "enable_thinking must be a bool, got 'no'" in output.error_msg


def test_a_text_that_cannot_fit_is_refused_from_a_prefix(llm):
    from fastdeploy.errors import PromptTooLongError
    from fastdeploy.input.conversation import check_text_fits

    tokenizer = llm.get_tokenizer()
    words = "hello " * 20_000  # 120,000 characters, ~20,000 tokens
    with pytest.raises(PromptTooLongError, match=r"its first 8000 of 120000 characters alone are \d+ tokens"):
        check_text_fits(tokenizer, words, 1000)
    runs = "=" * 9_000  # over the probe's 8,000 characters, but runs of "=" are few tokens
    assert len(tokenizer.encode(runs, add_special_tokens=False)) < 1000
    check_text_fits(tokenizer, runs, 1000)  # the probe does not refuse what may fit
