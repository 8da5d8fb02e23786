"""Prompt logprobs (`SamplingParams.prompt_logprobs=k`): how likely the model found each prompt token.

The logits at position p score token p+1, so every prefill chunk that computes positions
[start, end) of the prompt scores tokens start+1 .. end (the last prompt position's logits
sample the first output token instead). The feature records entries in order, per scoring
sequence, starting with None for the first prompt token (nothing precedes it); the scheduler asks
it which positions are still missing (`scoring_range`) and puts them in the batch, so a position
is recorded only once, even when a preempted sequence recomputes its prompt.

A prompt token served from the prefix cache has no logits, so a sequence still collecting prompt
logprobs does not read the prefix cache (it still registers its blocks for later requests).
Only the first sample of a request collects them: every sample has the same prompt. The pass
returns the logits of the positions it scores after its sampling rows
(`model_runner.extra_logits_rows`), and such a sequence prefills at most
`scheduler.PROMPT_LOGPROBS_CHUNK` tokens per step, which bounds those logits.
"""

from __future__ import annotations

import numpy as np

from fastdeploy.engine.pass_logits import PassLogits
from fastdeploy.engine.sampler import log_softmax
from fastdeploy.engine.sequence import Sequence
from fastdeploy.engine.step_feature import StepFeature
from fastdeploy.model_executor.batch import ScheduledBatch

#: rows whose log-softmax is taken at once ([rows, vocab] float64 on the host)
_ROWS_PER_SLICE = 128


def top_logprob_entries(logprobs: np.ndarray, chosen: np.ndarray, count: int) -> list[dict[int, float]]:
    """Per row of `logprobs` [rows, vocab]: {token: logprob} of its `count` most likely tokens and
    of `chosen[row]`."""
    rows = np.arange(logprobs.shape[0])
    if count >= logprobs.shape[1]:
        best = np.broadcast_to(np.arange(logprobs.shape[1]), logprobs.shape)
    elif count:
        best = np.argpartition(-logprobs, count - 1, axis=1)[:, :count]
    else:
        best = np.empty((logprobs.shape[0], 0), dtype=np.int64)
    entries = []
    for row in rows:
        entry = {int(token): float(logprobs[row, token]) for token in best[row]}
        entry[int(chosen[row])] = float(logprobs[row, chosen[row]])
        entries.append(entry)
    return entries


class PromptLogprobs(StepFeature):
    """The step feature: the entries of the first sample of each scoring request, recorded from
    each pass's rows."""

    def __init__(self) -> None:
        #: per scoring sequence id: {token_id: logprob} per prompt token so far (None first)
        self._entries: dict[int, list[dict[int, float] | None]] = {}

    def start(self, seq: Sequence) -> None:
        """Make `seq` collect its prompt's logprobs (the first prompt token has none)."""
        self._entries[seq.seq_id] = [None]

    def entries(self, seq: Sequence) -> list[dict[int, float] | None] | None:
        """`seq`'s prompt logprobs so far, or None when it does not collect them."""
        return self._entries.get(seq.seq_id)

    def scoring_range(self, seq: Sequence) -> tuple[int, int] | None:
        """Positions [first, last) whose logits score the prompt tokens still missing, or None."""
        entries = self._entries.get(seq.seq_id)
        if entries is None or len(entries) >= seq.num_prompt_tokens:
            return None
        return len(entries) - 1, seq.num_prompt_tokens - 1

    def read_logits(self, logits: PassLogits, batch: ScheduledBatch) -> None:
        """Append the prompt logprobs this pass computed to each batch sequence that collects them."""
        for extra in logits.extras:
            if extra.index not in batch.scored:
                continue
            seq = batch.seqs[extra.index]
            entries = self._entries[seq.seq_id]
            prompt = np.asarray(seq.prompt_token_ids, dtype=np.int64)
            for begin in range(0, extra.positions.size, _ROWS_PER_SLICE):
                positions = extra.positions[begin : begin + _ROWS_PER_SLICE]
                rows = logits.host_rows(np.arange(positions.size) + extra.offset + begin)
                entries.extend(
                    top_logprob_entries(log_softmax(rows), prompt[positions + 1], seq.params.prompt_logprobs)
                )

    def release(self, request_id: str, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._entries.pop(seq.seq_id, None)
