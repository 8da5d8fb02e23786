"""`fastdeploy chat [MODEL]`: an interactive conversation, the reply streamed as it is generated.

Reads one user message per line from stdin; a line starting with `/` is a command (`/help` lists
them; `//text` sends `/text` as a message). It drives the engine's stream mode directly, so no
server is needed; prompts are rendered by the same code as `LLM.chat` and the server, so a
greedy reply here equals theirs. A reply cut by `--max-tokens` or the context length is followed
by a `[truncated: ...]` line saying which limit it hit. With `--tools FILE` the model may call
those functions: each call is printed as `[tool call ID] NAME(ARGUMENTS)` after the reply, and
`/tool RESULT` answers the oldest unanswered call (once all are answered the model goes on).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastdeploy.cli.sampling_args import add_sampling_arguments, sampling_params_from
from fastdeploy.engine_args import add_engine_arguments, engine_kwargs
from fastdeploy.errors import InvalidArgumentError

# The engine side (LLM, prompts, tools, streaming) is imported where it is used: `fastdeploy
# --help` and `fastdeploy env` import this module to list the command, and those imports take a
# second or more.
if TYPE_CHECKING:
    from fastdeploy.tool_calling.request import ToolPlan

_AUTO_HINT = "pass --tool-call-parser NAME (hermes, qwen3, ernie-x1) or a --tool-choice that forces a call"

HELP = """Commands:
  /help    show this help
  /clear   forget the conversation (the --system message stays)
  /exit    quit (also /quit, or Ctrl+D)
  /tool R  answer the oldest tool call still waiting for its result with R (with --tools)
Any other line is sent as your message; start it with // to send a message beginning with /.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with a model interactively, replies streamed",
        description="Chat with a model: one message per line, replies streamed. /help lists the commands.",
    )
    add_engine_arguments(parser)
    parser.add_argument("--system", default=None, help="system message that starts the conversation")
    add_sampling_arguments(parser, max_tokens=512)
    parser.add_argument(
        "--enable-thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pass enable_thinking to the chat template (models with a thinking mode)",
    )
    parser.add_argument(
        "--show-reasoning",
        action="store_true",
        help="also print the reasoning part (with --reasoning-parser)",
    )
    parser.add_argument(
        "--tools",
        default=None,
        metavar="FILE",
        help="JSON file holding a list of OpenAI function tools the model may call",
    )
    parser.add_argument(
        "--tool-choice",
        default=None,
        metavar="CHOICE",
        help="auto, none, required or a function name to force (default: auto with "
        "--tool-call-parser, else none)",
    )
    parser.set_defaults(func=run)


def read_tools(path: str) -> list[Any]:
    """The `--tools` file's list (checked later, with the request rules of `tools`)."""
    try:
        tools = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidArgumentError(f"--tools: cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"--tools: {path} is not JSON: {exc}") from exc
    return tools


def tool_choice(value: str | None) -> str | dict[str, Any] | None:
    """`--tool-choice` as the request field: a mode, or a function name as a named choice."""
    if value is None or value in ("auto", "none", "required"):
        return value
    return {"type": "function", "function": {"name": value}}


class ChatSession:
    """One conversation against an `LLMEngine`, streaming each reply to `out`."""

    def __init__(
        self,
        engine: Any,
        params: Any,
        template_kwargs: dict[str, Any],
        show_reasoning: bool,
        tools: ToolPlan | None = None,
    ) -> None:
        from fastdeploy.entrypoints.offline_tools import constrain_offline
        from fastdeploy.input.conversation import with_tools

        self.engine = engine
        #: renders the conversation into the prompt, as `LLM.chat` and the server do
        self.inputs = engine.input_processor
        self.tools = tools
        self.params = params if tools is None else constrain_offline(params, tools)[0]
        self.template_kwargs = template_kwargs if tools is None else with_tools(template_kwargs, tools.tools)
        self.show_reasoning = show_reasoning
        self.history: list[dict[str, Any]] = []
        #: ids of the last reply's tool calls that have no `/tool` result yet
        self.unanswered: list[str] = []
        self._ids = itertools.count()

    def reply(self, user_text: str, out: Any) -> str | None:
        """Stream the answer to `user_text`; returns it, or None if the request was refused."""
        return self._answer([*self.history, {"role": "user", "content": user_text}], out)

    def tool_result(self, content: str, out: Any) -> str | None:
        """Answer the oldest unanswered tool call with `content`; once none is left, the model's
        reply is streamed and returned (None until then, or if the request was refused)."""
        if not self.unanswered:
            sys.stderr.write("error: /tool answers a tool call, and no call is waiting for its result\n")
            return None
        call_id = self.unanswered.pop(0)
        self.history = [*self.history, {"role": "tool", "tool_call_id": call_id, "content": content}]
        if self.unanswered:
            return None
        return self._answer(self.history, out)

    def _answer(self, conversation: list[dict[str, Any]], out: Any) -> str | None:
        from fastdeploy.entrypoints.streaming import DeltaTracker
        from fastdeploy.tool_calling.request import template_messages

        request_id = f"chat-{next(self._ids)}"
        try:
            prompt = self.inputs.render(template_messages(conversation), template_kwargs=self.template_kwargs)
            self.engine.add_request(
                request_id,
                prompt.token_ids or [],
                self.params,
                prompt=prompt.text,
                stream=True,
                thinking_enabled=prompt.thinking_enabled,
            )
        except InvalidArgumentError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return None
        tracker = DeltaTracker()
        answer, thinking, finish_reason, generated = "", False, None, 0
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.request_id != request_id:
                        continue
                    if output.error_code != 200:
                        sys.stderr.write(f"\nerror: {output.error_msg}\n")
                        return None
                    finish_reason, generated = output.outputs.finish_reason, len(output.outputs.token_ids)
                    delta = tracker.update(output.outputs)
                    if self.show_reasoning and delta.reasoning_content:
                        if not thinking:
                            out.write("<think>")
                            thinking = True
                        out.write(delta.reasoning_content)
                    if delta.text:
                        if thinking:
                            out.write("</think>\n")
                            thinking = False
                        out.write(delta.text)
                        answer += delta.text
                    out.flush()
        except KeyboardInterrupt:
            self.engine.abort_request(request_id)
            out.write(" [interrupted]")
        out.write("\n")
        if finish_reason == "length":
            out.write(self._truncation_note(generated) + "\n")
        self.history = [*conversation, self._assistant_message(answer, out)]
        out.flush()
        return answer

    def _assistant_message(self, answer: str, out: Any) -> dict[str, Any]:
        """The reply as the conversation keeps it; its tool calls (if any) are printed to `out`."""
        from fastdeploy.tool_calling.request import finish_answer

        if self.tools is None:
            return {"role": "assistant", "content": answer}
        content, calls = finish_answer(self.tools, answer, None)
        for call in calls or []:
            function = call["function"]
            out.write(f"[tool call {call['id']}] {function['name']}({function['arguments']})\n")
        self.unanswered = [call["id"] for call in calls or []]
        return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}

    def _truncation_note(self, generated: int) -> str:
        """Which limit cut the reply: the reply's own (--max-tokens) or the context's."""
        if self.params.max_tokens is not None and generated >= self.params.max_tokens:
            return f"[truncated: the reply reached --max-tokens ({self.params.max_tokens}); raise it for longer replies]"
        return (
            f"[truncated: the conversation reached the context length ({self.inputs.max_model_len} tokens, "
            "--max-model-len); /clear starts a new one]"
        )

    def clear(self, system: str | None) -> None:
        self.history = [{"role": "system", "content": system}] if system else []
        self.unanswered = []


def handle_line(session: ChatSession, line: str, system: str | None, out: Any) -> bool:
    """Act on one input line (a command or a message); False when the user asked to quit."""
    text = line.strip()
    if not text:
        return True
    if text.startswith("//"):
        session.reply(text[1:], out)
        return True
    if not text.startswith("/"):
        session.reply(text, out)
        return True
    command = text.split()[0].lower()
    if command in ("/exit", "/quit"):
        return False
    if command == "/clear":
        session.clear(system)
        out.write("(conversation cleared" + ("; the system message stays)\n" if system else ")\n"))
    elif command == "/help":
        out.write(HELP)
    elif command == "/tool":
        session.tool_result(text.removeprefix(text.split()[0]).strip(), out)
    else:
        out.write(f"unknown command {command}; /help lists the commands\n")
    out.flush()
    return True


def run(args: argparse.Namespace) -> int:
    from fastdeploy.entrypoints.llm import LLM
    from fastdeploy.tool_calling.request import parser_factory, plan_tools

    params = sampling_params_from(args)  # before the model loads: a bad flag fails at once
    tools = read_tools(args.tools) if args.tools is not None else None
    llm = LLM(**engine_kwargs(args))
    plan = None
    if tools is not None or args.tool_choice is not None:
        parser = parser_factory(llm.llm_engine.tool_parser_class, llm.input_processor.tokenizer)
        plan = plan_tools(tools, tool_choice(args.tool_choice), parser, _AUTO_HINT)
    template_kwargs = {} if args.enable_thinking is None else {"enable_thinking": args.enable_thinking}
    session = ChatSession(llm.llm_engine, params, template_kwargs, args.show_reasoning, plan)
    session.clear(args.system)
    interactive = sys.stdin.isatty()
    if interactive:
        sys.stdout.write("Type a message and press Enter; /help lists the commands, /exit or Ctrl+D quits.\n")
    while True:
        if interactive:
            sys.stdout.write("> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or not handle_line(session, line, args.system, sys.stdout):
            break
    return 0
