"""The Responses API's pieces without a model: input items -> chat messages (and the 400s naming
the item), tools / text.format in their chat forms, the bounded store, and the event sequence
of the output builder checked against OpenAI's documented order."""

from __future__ import annotations

import pytest

from fastdeploy.engine.request import CompletionOutput
from fastdeploy.entrypoints.openai.errors import OpenAIError
from fastdeploy.entrypoints.openai.responses_input import (
    ResponsesRequest,
    chat_request,
    chat_tool_choice,
    chat_tools,
    input_messages,
    response_format,
)
from fastdeploy.entrypoints.openai.responses_output import OutputItems, reasoning_tokens
from fastdeploy.entrypoints.openai.responses_store import ResponseStore, StoredResponse
from fastdeploy.errors import InvalidArgumentError


def test_string_input_is_one_user_message():
    assert input_messages("hi") == ([{"role": "user", "content": "hi"}], ["input"])


def test_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "call_2", "name": "look", "arguments": '{"x": 2}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "a cat"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "a dog"}],
        },
    ]
    messages, sources = input_messages(items)
    # the part labels of each message: the assistant turn's calls joined the message of input[3]
    assert sources == [
        "input[0].content",
        "input[1].content",
        "input[3].content",
        "input[6].output",
        "input[7].output",
    ]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Let me look."}],
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": '{"x": 1}'}},
                {"id": "call_2", "type": "function", "function": {"name": "look", "arguments": '{"x": 2}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "a dog"}]},
    ]


def test_a_call_without_a_message_before_it_opens_an_assistant_turn():
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    ]
    assert input_messages(items)[0][1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        (["hello"], "input[0] must be an object"),
        ([{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}], "input[1].role"),
        ([{"role": "user", "content": 5}], "input[0].content must be"),
        ([{"role": ["user"], "content": "x"}], "input[0].role must be one of"),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_audio"}]}],
            "input[0].content[1].type",
        ),
        (
            [{"role": "user", "content": [{"type": "input_image"}]}],
            "input[0].content[0]: an input_image part needs",
        ),
        ([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}], "file_id"),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": 3}]}],
            "input[0].content[0].text must be a string",
        ),
        ([{"role": "user", "content": "a"}, {"type": "function_call", "name": "f"}], "input[1].call_id"),
        (
            [{"role": "user", "content": "a"}, {"type": "function_call_output", "call_id": "c"}],
            "input[1].output",
        ),
        (
            [{"role": "user", "content": "a"}, {"type": "item_reference", "id": "x"}],
            "input[1].type 'item_reference'",
        ),
        ([{"type": "reasoning", "summary": []}], "at least one message"),
        (42, "input must be a string or a list"),
    ],
)
def test_malformed_items_are_400_naming_the_item(items, fragment):
    with pytest.raises(OpenAIError) as caught:
        input_messages(items)
    assert caught.value.status == 400 and caught.value.param == "input"
    assert fragment in caught.value.message


def test_tools_tool_choice_and_text_format_take_the_chat_forms():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    tools = [{"type": "function", "name": "f", "description": "d", "parameters": schema, "strict": True}]
    assert chat_tools(tools) == [
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": schema, "strict": True},
        }
    ]
    assert chat_tool_choice({"type": "function", "name": "f"}) == {
        "type": "function",
        "function": {"name": "f"},
    }
    assert chat_tool_choice("required") == "required"
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}}
    assert response_format(fmt) == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": schema, "strict": True},
    }
    assert response_format({"format": {"type": "json_object"}}) == {"type": "json_object"}
    with pytest.raises(OpenAIError, match=r"tools\[0\]: only tools of type 'function'"):
        chat_tools([{"type": "web_search"}])
    with pytest.raises(OpenAIError, match="'schema' is missing"):
        response_format({"format": {"type": "json_schema", "name": "n"}})


def test_chat_request_puts_instructions_first_and_maps_the_fields():
    request = ResponsesRequest(
        input="hi",
        instructions="Be brief.",
        max_output_tokens=7,
        temperature=0.5,
        top_p=0.9,
        reasoning={"effort": "low"},
        seed=3,
    )
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    chat = chat_request(request, [*history, *input_messages(request.input)[0]])
    assert chat.messages == [
        {"role": "system", "content": "Be brief."},
        *history,
        {"role": "user", "content": "hi"},
    ]
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p, chat.seed) == (7, 0.5, 0.9, 3)
    assert chat.chat_template_kwargs == {"reasoning_effort": "low"} and chat.stream is False


def test_store_forgets_the_least_recently_used():
    store = ResponseStore(2)
    for name in "abc"[:2]:
        store.put(name, StoredResponse({"id": name}, []))
    assert store.get("a") is not None  # a is now more recent than b
    store.put("c", StoredResponse({"id": "c"}, []))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert store.delete("a") and not store.delete("a") and len(store) == 1
    empty = ResponseStore(0)
    assert not empty.put("x", StoredResponse({}, [])) and empty.get("x") is None
    with pytest.raises(InvalidArgumentError, match="responses_store_size"):
        ResponseStore(-1)


def test_events_follow_openais_order_with_consecutive_sequence_numbers():
    items = OutputItems(first_sequence=2)
    events = [
        *items.reasoning("Thinking"),
        *items.reasoning(" hard"),
        *items.content("Hel"),
        *items.content("lo"),
        *items.call(
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
        ),
        *items.call({"index": 0, "function": {"arguments": '{"a":'}}),
        *items.call({"index": 0, "function": {"arguments": " 1}"}}),
        *items.finish(),
    ]
    assert [event["type"] for event in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [event["sequence_number"] for event in events] == list(range(2, 2 + len(events)))
    assert [event["output_index"] for event in events if event["type"].endswith(".done")] == [
        0,
        0,
        0,
        1,
        1,
        1,
        2,
        2,
    ]
    reasoning, message, call = items.items
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Thinking hard"}]
    assert message["content"][0]["text"] == "Hello" and message["role"] == "assistant"
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_1", "f", '{"a": 1}')
    assert all(item["status"] == "completed" for item in items.items)
    assert items.messages() == [
        {
            "role": "assistant",
            "content": "Hello",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        }
    ]


def test_an_empty_output_is_one_empty_message_and_a_cut_one_is_incomplete():
    empty = OutputItems()
    empty.finish()
    assert [(item["type"], item["content"][0]["text"]) for item in empty.items] == [("message", "")]
    cut = OutputItems()
    cut.whole("partial", "thought", None)
    cut.finish("incomplete")
    assert [item["status"] for item in cut.items] == ["completed", "incomplete"]


def test_reasoning_tokens_are_those_before_the_end_marker():
    sample = CompletionOutput(0, 0, [5, 6, 7, 90, 91, 8, 9], "x", reasoning_content="r")
    assert reasoning_tokens(sample, [90, 91]) == 3
    assert reasoning_tokens(CompletionOutput(0, 0, [5, 6], "x", reasoning_content="r"), [90, 91]) == 2
    assert reasoning_tokens(CompletionOutput(0, 0, [5, 6], "x"), [90, 91]) == 0
