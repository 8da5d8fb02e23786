"""`gpt-oss` (alias `harmony`): GPT-OSS's harmony output format, read from the generated tokens.

GPT-OSS answers in messages, each a header and a body between special tokens. The prompt ends
with `<|start|>assistant`, so the output reads

    <|channel|>analysis<|message|>the reasoning<|end|>
    <|start|>assistant<|channel|>final<|message|>the answer<|return|>

or, for a function call (the recipient may also follow the channel name),

    <|channel|>analysis<|message|>...<|end|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}<|call|>

The control tokens are special tokens, which the text of an output leaves out by default, so
this parser decodes the token ids itself with them kept (`split_output`). The `analysis`
channel's bodies become `reasoning_content`, the `final` channel's the answer `content`, and
every complete message addressed to `functions.NAME` a tool call (OpenAI-style, filled once the
output is finished; its body is the arguments). Preambles (`commentary` without a recipient)
are shown as content too. Output without any harmony header (a model that ignored the format)
is all answer. Every part only grows as tokens arrive, so streamed deltas are differences.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fastdeploy.reasoning.base import ReasoningParser, ReasoningSplit
from fastdeploy.reasoning.tool_calls import tool_call

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
RETURN = "<|return|>"
CALL = "<|call|>"
CONSTRAIN = "<|constrain|>"
#: the tokens that end a message body
TERMINATORS = (END, RETURN, CALL)
#: every harmony control token (none of them is shown in a part)
CONTROL_TOKENS = (START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN)
FUNCTIONS_PREFIX = "functions."

_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")


@dataclass(frozen=True)
class HarmonyMessage:
    """One message of an output: its channel, recipient (None: the user), body, and whether it ended."""

    channel: str | None
    recipient: str | None
    body: str
    complete: bool


def _header(text: str) -> tuple[str | None, str | None]:
    channel = _CHANNEL_NAME.search(text)
    recipient = _RECIPIENT.search(text)
    return (channel.group(1) if channel else None, recipient.group(1) if recipient else None)


def parse_messages(text: str) -> list[HarmonyMessage]:
    """The messages of an assistant output written after `<|start|>assistant` (the last may be open).

    A header still being written (no `<|message|>` yet) is left out: its channel is not known.
    """
    messages: list[HarmonyMessage] = []
    pos = 0
    while pos < len(text):
        opening = text.find(MESSAGE, pos)
        if opening < 0:
            break
        channel, recipient = _header(text[pos:opening])
        body_start = opening + len(MESSAGE)
        ends = [(text.find(mark, body_start), mark) for mark in TERMINATORS]
        ends = [(at, mark) for at, mark in ends if at >= 0]
        if not ends:
            messages.append(HarmonyMessage(channel, recipient, text[body_start:], complete=False))
            break
        at, mark = min(ends)
        messages.append(HarmonyMessage(channel, recipient, text[body_start:at], complete=True))
        pos = at + len(mark)
        if text.startswith(START, pos):
            pos += len(START)
    return messages


def _plain(text: str) -> str:
    for token in CONTROL_TOKENS:
        text = text.replace(token, "")
    return text


def split_harmony(text: str, finished: bool) -> ReasoningSplit:
    """Reasoning, answer and (once `finished`) function calls of a harmony output text."""
    if MESSAGE not in text:
        # no message header yet: a header may still be under way, unless the output has ended
        return ReasoningSplit(None, _plain(text) if finished else "")
    reasoning: list[str] = []
    answer: list[str] = []
    calls: list[dict] = []
    for message in parse_messages(text):
        if message.recipient is not None:
            if message.recipient.startswith(FUNCTIONS_PREFIX) and (message.complete or finished):
                calls.append(tool_call(message.recipient[len(FUNCTIONS_PREFIX) :], message.body.strip()))
        elif message.channel == "analysis":
            reasoning.append(message.body)
        else:
            answer.append(message.body)
    return ReasoningSplit(
        "\n".join(reasoning) if reasoning else None,
        "\n".join(answer),
        calls if calls and finished else None,
    )


class HarmonyReasoningParser(ReasoningParser):
    """Splits GPT-OSS outputs by harmony channel (see the module docstring)."""

    def split(self, text: str, *, thinking_enabled: bool, finished: bool) -> ReasoningSplit:
        """`text` must keep the control tokens (`skip_special_tokens=False`)."""
        return split_harmony(text, finished)

    def split_output(
        self, token_ids: Sequence[int], text: str, *, thinking_enabled: bool, finished: bool
    ) -> ReasoningSplit:
        kept = self.tokenizer.decode(list(token_ids), skip_special_tokens=False)
        return split_harmony(kept, finished)
