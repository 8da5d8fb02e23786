"""`fastdeploy chat`: interactive turns from stdin, streamed replies equal to `LLM.chat`'s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from fastdeploy import SamplingParams
from fastdeploy.cli import main
from fastdeploy.cli.chat import HELP, ChatSession, handle_line, read_tools, tool_choice
from fastdeploy.input.chat_template import load_chat_template
from fastdeploy.tool_calling.request import parser_factory, plan_tools

SYSTEM = "You are a concise geography assistant."
TOOLS_TEMPLATE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tools_chat_template.jinja"


def greedy_output(llm, conversation, max_tokens):
    (output,) = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    assert output.error_code == 200, output.error_msg
    return output.outputs


def greedy_reply(llm, conversation, max_tokens):
    return greedy_output(llm, conversation, max_tokens).text


def shown(output, max_tokens):
    """What the chat command prints for one reply: the text, and a marker if it was cut."""
    marker = ""
    if output.finish_reason == "length":
        marker = f"[truncated: the reply reached --max-tokens ({max_tokens}); raise it for longer replies]\n"
    return f"{output.text}\n{marker}"


def test_chat_command_keeps_the_conversation(llm):
    first, second = "What is the capital of France?", "And of Germany?"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastdeploy",
            "chat",
            "--max-model-len",
            "1024",
            "--max-tokens",
            "10",
            "--system",
            SYSTEM,
        ],
        input=f"{first}\n\n{second}\n/exit\nnever read\n",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
    reply1 = greedy_output(llm, history, 10)
    history += [{"role": "assistant", "content": reply1.text}, {"role": "user", "content": second}]
    reply2 = greedy_output(llm, history, 10)
    assert done.stdout == shown(reply1, 10) + shown(reply2, 10)


class Recorder:
    def __init__(self):
        self.writes = []

    def write(self, text):
        self.writes.append(text)

    def flush(self):
        pass


def test_chat_session_streams_piece_by_piece(llm):
    session = ChatSession(
        llm.llm_engine, SamplingParams(temperature=0, max_tokens=12), {}, show_reasoning=False
    )
    out = Recorder()
    answer = session.reply("What is the capital of France?", out)
    assert answer == greedy_reply(llm, [{"role": "user", "content": "What is the capital of France?"}], 12)
    assert "".join(out.writes) == answer + "\n"
    assert len([w for w in out.writes if w.strip()]) > 3  # written as it was generated
    assert [m["role"] for m in session.history] == ["user", "assistant"]
    assert session.reply("x" * 5000, Recorder()) is None  # too long: refused, conversation kept
    assert len(session.history) == 2


def test_a_reply_cut_by_max_tokens_is_marked_and_a_finished_one_is_not(llm):
    session = ChatSession(
        llm.llm_engine, SamplingParams(temperature=0, max_tokens=3), {}, show_reasoning=False
    )
    out = Recorder()
    answer = session.reply("What is the capital of France?", out)
    reference = greedy_output(llm, [{"role": "user", "content": "What is the capital of France?"}], 3)
    assert reference.finish_reason == "length" and answer == reference.text
    assert "".join(out.writes) == shown(reference, 3)
    session = ChatSession(
        llm.llm_engine, SamplingParams(temperature=0, max_tokens=64), {}, show_reasoning=False
    )
    out = Recorder()
    session.reply("What is the capital of France?", out)
    reference = greedy_output(llm, [{"role": "user", "content": "What is the capital of France?"}], 64)
    assert reference.finish_reason == "stop"
    assert "".join(out.writes) == reference.text + "\n"


def test_a_reply_cut_by_the_context_length_says_so():
    from fastdeploy import LLM

    small = LLM(max_model_len=64, max_num_seqs=2)
    session = ChatSession(small.llm_engine, SamplingParams(temperature=0), {}, show_reasoning=False)
    out = Recorder()
    session.reply("Write a long story about a dragon.", out)
    assert "".join(out.writes).endswith(
        "\n[truncated: the conversation reached the context length (64 tokens, --max-model-len); "
        "/clear starts a new one]\n"
    )


class FakeSession:
    """Records what `handle_line` asks of the session."""

    def __init__(self):
        self.messages, self.cleared = [], []

    def reply(self, text, out):
        self.messages.append(text)

    def clear(self, system):
        self.cleared.append(system)


def test_commands_are_not_sent_to_the_model():
    session, out = FakeSession(), Recorder()
    assert handle_line(session, "/help\n", None, out)
    assert "".join(out.writes) == HELP and "/clear" in HELP and "/exit" in HELP
    out = Recorder()
    assert handle_line(session, "/clear", "Be brief.", out)
    assert session.cleared == ["Be brief."] and out.writes == [
        "(conversation cleared; the system message stays)\n"
    ]
    out = Recorder()
    assert handle_line(session, "/clear", None, out) and out.writes == ["(conversation cleared)\n"]
    out = Recorder()
    assert handle_line(session, "/hlep", None, out)
    assert out.writes == ["unknown command /hlep; /help lists the commands\n"]
    assert session.messages == []
    assert handle_line(session, "//etc is a directory", None, Recorder())
    assert handle_line(session, "  hello  ", None, Recorder())
    assert handle_line(session, "   ", None, Recorder())
    assert session.messages == ["/etc is a directory", "hello"]
    assert not handle_line(session, "/exit", None, Recorder())
    assert not handle_line(session, "/quit", None, Recorder())


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "minLength": 1, "maxLength": 30}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def test_chat_session_calls_a_tool_and_takes_its_result(llm, monkeypatch):
    """A forced call is printed and kept in the conversation; `/tool` answers it. Both turns send
    the prompt `LLM.chat` renders for the same messages and tools (a template that shows tools,
    calls and results), and get the same call."""
    engine = llm.llm_engine
    monkeypatch.setattr(engine.tokenizer, "chat_template", load_chat_template(str(TOOLS_TEMPLATE)))
    prompts = []
    add_request = engine.add_request

    def recording_add_request(*args, **kwargs):
        prompts.append(kwargs["prompt"])
        return add_request(*args, **kwargs)

    monkeypatch.setattr(engine, "add_request", recording_add_request)
    choice = tool_choice("get_time")
    greedy = SamplingParams(temperature=0, max_tokens=32)
    session = ChatSession(
        engine,
        greedy,
        {},
        False,
        plan_tools([TIME_TOOL], choice, parser_factory(engine.tool_parser_class, engine.tokenizer), ""),
    )
    out = Recorder()
    question = [{"role": "user", "content": "What time is it in Tokyo?"}]
    session.reply(question[0]["content"], out)
    (call,) = session.history[-1]["tool_calls"]
    monkeypatch.setattr(engine, "add_request", add_request)
    (first,) = llm.chat(question, greedy, use_tqdm=False, tools=[TIME_TOOL], tool_choice=choice)
    assert prompts == [first.prompt] and '"name": "get_time"' in first.prompt
    assert call["function"] == first.outputs.tool_calls[0]["function"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), TIME_TOOL["function"]["parameters"])
    printed = "".join(out.writes)
    assert printed.endswith(f"\n[tool call {call['id']}] get_time({call['function']['arguments']})\n")
    assert session.unanswered == [call["id"]]

    monkeypatch.setattr(engine, "add_request", recording_add_request)
    assert handle_line(session, "/tool 09:15", None, out)
    assert session.history[-2] == {"role": "tool", "tool_call_id": call["id"], "content": "09:15"}
    monkeypatch.setattr(engine, "add_request", add_request)
    (second,) = llm.chat(session.history[:-1], greedy, use_tqdm=False, tools=[TIME_TOOL], tool_choice=choice)
    assert prompts[1] == second.prompt and "09:15" in second.prompt
    assert session.history[-1]["tool_calls"][0]["function"] == second.outputs.tool_calls[0]["function"]


def test_tool_result_without_a_waiting_call_is_refused(llm, capsys):
    session = ChatSession(llm.llm_engine, SamplingParams(max_tokens=4), {}, show_reasoning=False)
    assert session.tool_result("09:15", Recorder()) is None
    assert "no call is waiting" in capsys.readouterr().err
    assert session.history == []


def test_tools_flags(tmp_path, capsys):
    assert tool_choice("get_time") == {"type": "function", "function": {"name": "get_time"}}
    assert tool_choice("required") == "required" and tool_choice(None) is None
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([TIME_TOOL]))
    assert read_tools(str(path)) == [TIME_TOOL]
    path.write_text("[{")
    assert main(["chat", "--tools", str(path)]) == 2
    assert f"error: --tools: {path} is not JSON" in capsys.readouterr().err
    assert main(["chat", "--tools", str(tmp_path / "missing.json")]) == 2
    assert "--tools: cannot read" in capsys.readouterr().err
