"""After each sampled token: incremental text, stop conditions, and the public output objects."""

from __future__ import annotations

from collections.abc import Collection

from fastdeploy.engine.request import CompletionOutput
from fastdeploy.engine.sequence import Sequence
from fastdeploy.text_utils import partial_suffix_length


def _find_stop_string(seq: Sequence, delta_len: int) -> tuple[int, str] | None:
    """Earliest stop string that ends inside the text added by the last token."""
    stops = seq.params.stop
    longest = max(len(stop) for stop in stops)
    search_from = max(0, len(seq.text) - delta_len - longest + 1)
    found = [(index, stop) for stop in stops if (index := seq.text.find(stop, search_from)) >= 0]
    return min(found) if found else None


def process_token(seq: Sequence, token: int, eos_token_ids: Collection[int], max_model_len: int) -> None:
    """Append `token` to `seq`, extend its text, and set `finish_reason` if it must stop."""
    seq.token_ids.append(token)
    delta = ""
    if not seq.defer_text:
        delta = seq.detokenizer.add([token])
        seq.text += delta
    params = seq.params
    num_outputs = len(seq.token_ids) - len(seq.prompt_token_ids)
    if num_outputs >= params.min_tokens:
        if (not params.ignore_eos and token in eos_token_ids) or token in params.stop_token_ids:
            _finish(seq, "stop")
            return
        if params.stop and delta:
            match = _find_stop_string(seq, len(delta))
            if match is not None:
                index, stop = match
                seq.text = seq.text[: index + len(stop) if params.include_stop_str_in_output else index]
                seq.finish_reason = "stop"  # the cut text is final: no held-back bytes to flush
                return
    if num_outputs >= seq.max_output_tokens or len(seq.token_ids) >= max_model_len:
        _finish(seq, "length")


def _finish(seq: Sequence, reason: str) -> None:
    """Finish `seq`, adding any text the detokenizer still held back (an incomplete character)."""
    catch_up_text(seq)
    seq.text += seq.detokenizer.flush()
    seq.finish_reason = reason


def catch_up_text(seq: Sequence) -> None:
    """Give a sequence with deferred text the text of every output so far, in one detokenizer call.

    One call over many ids gives the text that one call per id gives: both are the full decode of
    the outputs (see IncrementalDetokenizer). Only past the detokenizer's held-back bound (a long
    run of tokens that never forms a character) can per-id text differ; late text is the full decode.
    """
    if seq.defer_text:
        pending = seq.num_output_tokens - seq.detokenizer.num_token_ids
        if pending:
            seq.text += seq.detokenizer.add(seq.token_ids[-pending:])


def streamable_text(seq: Sequence) -> str:
    """Text that can be shown now: while running, hold back what might start a stop string."""
    catch_up_text(seq)
    if seq.finish_reason is not None or not seq.params.stop:
        return seq.text
    return seq.text[: len(seq.text) - partial_suffix_length(seq.text, seq.params.stop)]


def banned_bad_word_tokens(seq: Sequence, bad_words_ids: list[list[int]]) -> list[int]:
    """Tokens that would complete a bad word given the sequence's latest output tokens."""
    outputs = seq.output_token_ids
    banned = []
    for word in bad_words_ids:
        prefix = word[:-1]
        if not prefix or (len(outputs) >= len(prefix) and outputs[-len(prefix) :] == prefix):
            banned.append(word[-1])
    return banned


def completion_output(seq: Sequence) -> CompletionOutput:
    return CompletionOutput(
        index=seq.sample_index,
        send_idx=seq.num_output_tokens,
        token_ids=seq.output_token_ids,  # a fresh slice: later tokens never show up in it
        text=streamable_text(seq),
        finish_reason=seq.finish_reason,
        logprobs=seq.logprobs,
        cumulative_logprob=seq.cumulative_logprob,
    )
