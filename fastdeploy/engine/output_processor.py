"""From sampled tokens to `RequestOutput`s: incremental text, stop conditions, a forced end of
thinking, reasoning / tool-call split, best_of and beam grouping, metrics."""

from __future__ import annotations

import time
from collections.abc import Collection

from fastdeploy.engine.beam_search import BeamSearchFeature
from fastdeploy.engine.prompt_logprobs import PromptLogprobs
from fastdeploy.engine.request import INTERNAL_ERROR, CompletionOutput, RequestMetrics, RequestOutput
from fastdeploy.engine.sequence import EngineRequest, Sequence
from fastdeploy.engine.spec_decode.decoder import SpeculativeDecoder
from fastdeploy.input.tokenizer import Tokenizer
from fastdeploy.reasoning.base import ReasoningParser
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


def error_output(
    request_id: str, prompt: str | None, message: str, arrival_time: float, code: int
) -> RequestOutput:
    """The output of a request that failed before or during generation."""
    now = time.time()
    return RequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=[],
        outputs=CompletionOutput(index=0, send_idx=0, token_ids=[], text="", finish_reason="abort"),
        finished=True,
        metrics=RequestMetrics(arrival_time=arrival_time, model_execute_time=now - arrival_time),
        error_code=code,
        error_msg=message,
    )


def fault_output(request: EngineRequest, message: str) -> RequestOutput:
    """The error output (500) of a request that failed inside the engine, with its prompt ids."""
    output = error_output(request.request_id, request.prompt, message, request.arrival_time, INTERNAL_ERROR)
    output.prompt_token_ids = request.prompt_token_ids
    return output


class OutputProcessor:
    """Appends sampled tokens to sequences and builds their requests' outputs."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        reasoning_parser: ReasoningParser | None,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        beams: BeamSearchFeature,
        spec: SpeculativeDecoder | None,
        prompt_logprobs: PromptLogprobs,
    ) -> None:
        self.tokenizer = tokenizer
        self.reasoning_parser = reasoning_parser
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self._beams = beams
        self._spec = spec
        self._prompt_logprobs = prompt_logprobs

    def append_tokens(self, seq: Sequence, tokens: tuple[int, ...], thinking_enabled: bool) -> None:
        """Append `tokens` to `seq` until one finishes it (text, stop checks, forced end of thinking)."""
        budget = seq.params.reasoning_max_tokens
        for token in tokens:
            if budget is not None:
                token = self._forced_reasoning_end(seq, token, budget, thinking_enabled)
            process_token(seq, token, self.eos_token_ids, self.max_model_len)
            if seq.finish_reason is not None:
                break

    def _forced_reasoning_end(self, seq: Sequence, token: int, budget: int, thinking_enabled: bool) -> int:
        """Past `reasoning_max_tokens` of thinking, replace samples with the end-of-thinking tokens."""
        if self.reasoning_parser is None or seq.num_output_tokens < budget or not thinking_enabled:
            return token
        end = self.reasoning_parser.reasoning_end_token_ids()
        if not end:
            return token
        outputs = seq.output_token_ids
        for start in range(len(outputs) - len(end) + 1):
            if outputs[start : start + len(end)] == end:
                return token  # thinking already ended
        # how much of the end sequence is already written at the tail
        for done in range(len(end) - 1, 0, -1):
            if outputs[-done:] == end[:done]:
                return end[done]
        return end[0]

    def request_output(self, request: EngineRequest) -> RequestOutput:
        samples = self._completion_outputs(request)
        if self.reasoning_parser is not None:
            for sample in samples:
                split = self.reasoning_parser.split_output(
                    sample.token_ids,
                    sample.text,
                    thinking_enabled=request.thinking_enabled,
                    finished=sample.finish_reason is not None,
                )
                sample.reasoning_content, sample.text = split.reasoning_content, split.content
                sample.tool_calls = split.tool_calls
        first = samples[0]
        if len(samples) > 1:
            first._samples = samples
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=first,
            finished=request.finished,
            metrics=self._metrics(request),
            num_cached_tokens=request.seqs[0].num_cached_tokens,
            num_input_image_tokens=request.multimodal.num_image_tokens if request.multimodal else 0,
            num_input_video_tokens=request.multimodal.num_video_tokens if request.multimodal else 0,
            prompt_logprobs=self._prompt_logprobs.entries(request.seqs[0]),
        )

    def _completion_outputs(self, request: EngineRequest) -> list[CompletionOutput]:
        """One output per returned sample: all samples, or the best `n` of best_of / beam search."""
        params = request.params
        search = self._beams.search(request.request_id) if params.use_beam_search else None
        if search is not None:
            aborted = request.finished and not search.done
            return [
                CompletionOutput(
                    index=index,
                    send_idx=len(hypothesis.token_ids),
                    token_ids=hypothesis.token_ids,
                    text=self.tokenizer.decode(
                        hypothesis.token_ids, skip_special_tokens=params.skip_special_tokens
                    ),
                    finish_reason="abort" if aborted else hypothesis.finish_reason if search.done else None,
                    logprobs=hypothesis.logprobs,
                    cumulative_logprob=hypothesis.cumulative_logprob,
                )
                for index, hypothesis in enumerate(search.results())
            ]
        seqs = request.seqs
        if params.num_samples > params.n and request.finished:
            seqs = sorted(seqs, key=lambda seq: -seq.cumulative_logprob)[: params.n]
        outputs = [completion_output(seq) for seq in seqs]
        for index, output in enumerate(outputs):
            output.index = index
        return outputs

    def _metrics(self, request: EngineRequest) -> RequestMetrics:
        seqs = request.seqs
        started = [seq.first_scheduled_time for seq in seqs if seq.first_scheduled_time is not None]
        first_tokens = [seq.first_token_time for seq in seqs if seq.first_token_time is not None]
        finished = [seq.finish_time for seq in seqs if seq.finish_time is not None]
        start = min(started) if started else None
        verify_steps, drafts, accepted = (
            self._spec.request_counts(request.request_id) if self._spec is not None else (0, 0, 0)
        )
        return RequestMetrics(
            arrival_time=request.arrival_time,
            inference_start_time=start,
            first_token_time=min(first_tokens) - request.arrival_time if first_tokens else None,
            time_in_queue=start - request.arrival_time if start is not None else None,
            model_forward_time=max(seq.forward_time for seq in seqs),
            model_execute_time=(max(finished) if finished else time.time()) - request.arrival_time,
            spec_num_verify_steps=verify_steps,
            spec_num_draft_tokens=drafts,
            spec_num_accepted_tokens=accepted,
        )
