"""`fastdeploy chat [MODEL]`: an interactive conversation, the reply streamed as it is generated.

Reads one user message per line from stdin; a line starting with `/` is a command (`/help` lists
them; `//text` sends `/text` as a message). It drives the engine's stream mode directly, so no
server is needed; prompts are rendered by the same code as `LLM.chat` and the server, so a
greedy reply here equals theirs. A reply cut by `--max-tokens` or the context length is followed
by a `[truncated: ...]` line saying which limit it hit.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any

from fastdeploy.cli.engine_args import add_engine_arguments, engine_kwargs
from fastdeploy.cli.sampling_args import add_sampling_arguments, sampling_params_from

HELP = """Commands:
  /help    show this help
  /clear   forget the conversation (the --system message stays)
  /exit    quit (also /quit, or Ctrl+D)
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
    parser.set_defaults(func=run)


class ChatSession:
    """One conversation against an `LLMEngine`, streaming each reply to `out`."""

    def __init__(
        self, engine: Any, params: Any, template_kwargs: dict[str, Any], show_reasoning: bool
    ) -> None:
        self.engine = engine
        self.params = params
        self.template_kwargs = template_kwargs
        self.show_reasoning = show_reasoning
        self.history: list[dict[str, str]] = []
        self._ids = itertools.count()

    def reply(self, user_text: str, out: Any) -> str | None:
        """Stream the answer to `user_text`; returns it, or None if the request was refused."""
        from fastdeploy.entrypoints.chat_utils import render_conversation
        from fastdeploy.entrypoints.streaming import DeltaTracker
        from fastdeploy.errors import InvalidArgumentError

        conversation = [*self.history, {"role": "user", "content": user_text}]
        request_id = f"chat-{next(self._ids)}"
        try:
            prompt = render_conversation(
                self.engine.tokenizer, conversation, template_kwargs=self.template_kwargs
            )
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
        out.flush()
        self.history = [*conversation, {"role": "assistant", "content": answer}]
        return answer

    def _truncation_note(self, generated: int) -> str:
        """Which limit cut the reply: the reply's own (--max-tokens) or the context's."""
        if self.params.max_tokens is not None and generated >= self.params.max_tokens:
            return f"[truncated: the reply reached --max-tokens ({self.params.max_tokens}); raise it for longer replies]"
        return (
            f"[truncated: the conversation reached the context length ({self.engine.max_model_len} tokens, "
            "--max-model-len); /clear starts a new one]"
        )

    def clear(self, system: str | None) -> None:
        self.history = [{"role": "system", "content": system}] if system else []


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
    else:
        out.write(f"unknown command {command}; /help lists the commands\n")
    out.flush()
    return True


def run(args: argparse.Namespace) -> int:
    from fastdeploy import LLM

    params = sampling_params_from(args)  # before the model loads: a bad flag fails at once
    llm = LLM(**engine_kwargs(args))
    template_kwargs = {} if args.enable_thinking is None else {"enable_thinking": args.enable_thinking}
    session = ChatSession(llm.llm_engine, params, template_kwargs, args.show_reasoning)
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
