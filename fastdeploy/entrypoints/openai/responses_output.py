"""A response's `output` items, built from a sample's parts as they arrive, with the typed stream
events of each step (`response.output_item.added`, `response.output_text.delta`, ...).

Streamed and whole responses share this builder: a stream feeds it every delta and sends the
events; a whole response feeds it the finished sample once and keeps only the items. Items come
in the order the model wrote them: a `reasoning` item (with a reasoning parser), a `message`
with one `output_text` part, then one `function_call` item per call. A response with none of
them gets an empty message, so `output_text` is always there to read.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastdeploy.engine.request import CompletionOutput


def item_id(prefix: str) -> str:
    """An id in OpenAI's style (`msg_...`, `fc_...`, `rs_...`, `resp_...`)."""
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    """The output items of one response and the events that build them, numbered from
    `first_sequence` (`sequence_number`, one per event of the response's stream)."""

    def __init__(self, first_sequence: int = 0) -> None:
        self.items: list[dict[str, Any]] = []
        self.sequence = first_sequence
        #: the item being written (the last of `items`), and its kind
        self._open: dict[str, Any] | None = None
        self._kind: str | None = None
        #: call index (as the tool-call stream numbers them) -> the call's item
        self._calls: dict[int, dict[str, Any]] = {}

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """The next event of the stream: `type`, its fields and its `sequence_number`."""
        event = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return event

    # --- parts as they arrive -----------------------------------------------------------------
    def reasoning(self, delta: str) -> list[dict[str, Any]]:
        """Events for more reasoning text (opening the reasoning item on the first)."""
        if not delta:
            return []
        events = self._ensure("reasoning")
        item = self._open
        assert item is not None
        item["content"][0]["text"] += delta
        events.append(self._part_event("response.reasoning_text.delta", delta=delta))
        return events

    def content(self, delta: str) -> list[dict[str, Any]]:
        """Events for more answer text (opening the message item on the first)."""
        if not delta:
            return []
        events = self._ensure("message")
        item = self._open
        assert item is not None
        item["content"][0]["text"] += delta
        events.append(self._part_event("response.output_text.delta", delta=delta, logprobs=[]))
        return events

    def call(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        """Events for a tool-call delta in the chat stream's form (`index`; `id` and
        `function.name` on a call's first delta; `function.arguments` pieces)."""
        function = delta.get("function") or {}
        index = delta.get("index", len(self._calls))
        events: list[dict[str, Any]] = []
        item = self._calls.get(index)
        if item is None:
            events += self._close()
            item = {
                "id": item_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": delta.get("id") or item_id("call"),
                "name": function.get("name") or "",
                "arguments": "",
            }
            self._calls[index] = item
            events += self._add(item, "function_call")
        arguments = function.get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.items.index(item),
                    delta=arguments,
                )
            )
        return events

    def finish(self, status: str = "completed") -> list[dict[str, Any]]:
        """Close the last item (an empty message if there is none) with `status` ("incomplete"
        when the output was cut at `max_output_tokens`; the items before it were complete)."""
        events = [] if self.items else self._ensure("message")
        return events + self._close(status)

    def whole(self, content: str | None, reasoning: str | None, calls: list[dict[str, Any]] | None) -> None:
        """A finished sample's parts at once (a response that is not streamed)."""
        self.reasoning(reasoning or "")
        self.content(content or "")
        for index, call in enumerate(calls or []):
            self.call({"index": index, **call})

    def messages(self) -> list[dict[str, Any]]:
        """The output as chat messages (the assistant turn a later request continues from)."""
        text = "".join(item["content"][0]["text"] for item in self.items if item["type"] == "message")
        calls = [
            {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            for item in self.items
            if item["type"] == "function_call"
        ]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        return [message]

    # --- opening and closing items ------------------------------------------------------------
    def _ensure(self, kind: str) -> list[dict[str, Any]]:
        """Open an item of `kind` unless the item being written is one."""
        if self._kind == kind:
            return []
        events = self._close()
        if kind == "reasoning":
            item = {
                "id": item_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
            }
        else:
            item = {
                "id": item_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
        events += self._add(item, kind)
        return events

    def _add(self, item: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        shown = {**item, "content": []} if "content" in item else dict(item)
        self.items.append(item)
        self._open, self._kind = item, kind
        events = [self.event("response.output_item.added", output_index=len(self.items) - 1, item=shown)]
        if "content" in item:
            empty = {**item["content"][0], "text": ""}
            events.append(self._part_event("response.content_part.added", part=empty))
        return events

    def _part_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        item = self._open
        assert item is not None
        return self.event(
            kind, item_id=item["id"], output_index=len(self.items) - 1, content_index=0, **fields
        )

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, kind = self._open, self._kind
        if item is None:
            return []
        self._open = self._kind = None
        index = self.items.index(item)
        events = []
        if kind == "function_call":
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        else:
            part = item["content"][0]
            done = "response.reasoning_text.done" if kind == "reasoning" else "response.output_text.done"
            extra = {} if kind == "reasoning" else {"logprobs": []}
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(self.event(done, **common, text=part["text"], **extra))
            events.append(self.event("response.content_part.done", **common, part=dict(part)))
        item["status"] = status
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events


def reasoning_tokens(sample: CompletionOutput, end_token_ids: list[int] | None) -> int:
    """How many of the sample's tokens are reasoning: those before the reasoning parser's end
    marker (all of them while the block never closed); 0 without a reasoning part."""
    if sample.reasoning_content is None:
        return 0
    tokens = sample.token_ids
    end = end_token_ids or []
    if end:
        for start in range(len(tokens) - len(end) + 1):
            if tokens[start : start + len(end)] == end:
                return start
    return len(tokens)


def response_usage(input_tokens: int, cached: int, output_tokens: int, reasoning: int) -> dict[str, Any]:
    """OpenAI's usage object; `cached`: prompt tokens whose KV blocks the prefix cache served."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }
