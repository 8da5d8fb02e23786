"""Beam search (`SamplingParams(use_beam_search=True)`), ranked and stopped as transformers does.

A beam request keeps up to `width` (= `best_of` or `n`) running beams. Each is a `Sequence` in
the scheduler, so beams batch with every other request; the first beam prefills the prompt and
the others are forked from it. After every beam of the request has its next-token logprobs (a
preempted beam may deliver its row a step later; the others wait), one search step runs:

* candidates: every running beam's score plus each token's logprob; the best
  `max(2, 1 + stop tokens) * width` are ranked (stop tokens: EOS unless `ignore_eos`, and
  `stop_token_ids`, those inside the model's vocabulary);
* a candidate among the first `width` that ends on a stop token, or reaches `max_tokens` /
  `max_model_len`, is a finished hypothesis scored `cumulative_logprob / length **
  length_penalty`; the best `width` hypotheses are kept;
* the best `width` candidates that did not finish become the next running beams: a beam chosen
  by several children is forked (`BlockManager.fork`: they share its KV blocks and only the
  partial last block is copied when they write into it), a beam chosen by none is released;
* the search ends when every candidate finished, when `early_stopping=True` and `width`
  hypotheses are kept, or when the best running beam cannot beat the worst kept hypothesis: its
  score over the current length (`early_stopping=False`, transformers' heuristic) or, with
  `"never"` and a positive `length_penalty`, over `max_tokens` (the exact bound).

The `n` best hypotheses are the request's outputs, best first, each with `cumulative_logprob`.
Unlike transformers, a search whose candidates are nearly all finished continues with fewer beams
instead of padding with impossible ones; the results are the same unless fewer than `n`
hypotheses ever finish (then the best running beams fill in, with finish reason "length").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.pass_logits import PassLogits
from fastdeploy.engine.prompt_logprobs import top_logprob_entries
from fastdeploy.engine.sampler import BannedTokens, log_softmax
from fastdeploy.engine.sequence import Sequence, SequenceStatus
from fastdeploy.engine.step_feature import StepFeature
from fastdeploy.model_executor.batch import ScheduledBatch


@dataclass
class Hypothesis:
    """A finished beam: its output tokens and scores."""

    token_ids: list[int]
    cumulative_logprob: float
    #: cumulative_logprob / len(token_ids) ** length_penalty: the rank among hypotheses
    score: float
    finish_reason: str
    logprobs: list[dict[int, float]] | None


@dataclass
class _Candidate:
    parent: int  # index into the running beams
    token: int
    cumulative_logprob: float
    finishes: bool
    #: {token: logprob} for `SamplingParams.logprobs`, else None
    logprob_entry: dict[int, float] | None = None


class BeamSearch:
    """The search state of one beam request; the engine feeds it rows and applies its steps."""

    def __init__(
        self,
        root: Sequence,
        width: int,
        stop_token_ids: frozenset[int],
        max_output_tokens: int,
    ) -> None:
        params = root.params
        self.width = width
        self.num_returned = params.n
        self.length_penalty = params.length_penalty
        self.early_stopping = params.early_stopping
        self.stop_token_ids = stop_token_ids
        self.max_output_tokens = max_output_tokens
        self.candidates_kept = max(2, 1 + len(stop_token_ids)) * width
        self.beams: list[Sequence] = [root]
        self.scores: list[float] = [0.0]
        self.hypotheses: list[Hypothesis] = []
        self.done = False
        self._rows: dict[int, np.ndarray] = {}

    # --- the search ---------------------------------------------------------------------------
    def add_row(self, seq: Sequence, logprobs: np.ndarray) -> None:
        """Record `seq`'s next-token logprobs [vocab] (log-softmax, banned tokens at -inf)."""
        self._rows[seq.seq_id] = logprobs

    @property
    def ready(self) -> bool:
        """Whether every running beam has its row, so that a step can run."""
        return not self.done and all(seq.seq_id in self._rows for seq in self.beams)

    def _ranked_candidates(self) -> list[_Candidate]:
        rows = np.stack([self._rows.pop(seq.seq_id) for seq in self.beams])
        totals = (rows + np.asarray(self.scores)[:, None]).ravel()
        count = min(self.candidates_kept, int(np.isfinite(totals).sum()))
        best = np.argpartition(-totals, count - 1)[:count] if count < totals.size else np.arange(totals.size)
        best = best[np.argsort(-totals[best], kind="stable")]
        at_limit = self.beams[0].num_output_tokens + 1 >= self.max_output_tokens
        parents, tokens = np.divmod(best, rows.shape[1])
        entries: list[dict[int, float] | None] = [None] * len(best)
        top = self.beams[0].params.logprobs
        if top is not None:
            entries = top_logprob_entries(rows[parents], tokens, top)
        return [
            _Candidate(
                int(parent),
                int(token),
                float(totals[flat]),
                at_limit or int(token) in self.stop_token_ids,
                entry,
            )
            for flat, parent, token, entry in zip(best, parents, tokens, entries, strict=True)
        ]

    def step(self) -> list[_Candidate]:
        """One search step over the recorded rows; returns the next running beams' candidates."""
        candidates = self._ranked_candidates()
        length = self.beams[0].num_output_tokens + 1
        for candidate in candidates[: self.width]:
            if candidate.finishes:
                self._keep(candidate, length)
        running = [candidate for candidate in candidates if not candidate.finishes][: self.width]
        self.scores = [candidate.cumulative_logprob for candidate in running]
        if not running:
            self.done = True
            return running
        if len(self.hypotheses) == self.width:
            if self.early_stopping is True:
                self.done = True
            bound_length = length
            if self.early_stopping == "never" and self.length_penalty > 0:
                bound_length = self.max_output_tokens
            best_possible = running[0].cumulative_logprob / bound_length**self.length_penalty
            if best_possible <= self.hypotheses[-1].score:
                self.done = True
        return running

    def _keep(self, candidate: _Candidate, length: int) -> None:
        parent = self.beams[candidate.parent]
        logprobs = None
        if candidate.logprob_entry is not None:
            logprobs = [*(parent.logprobs or []), candidate.logprob_entry]
        hypothesis = Hypothesis(
            token_ids=[*parent.output_token_ids, candidate.token],
            cumulative_logprob=candidate.cumulative_logprob,
            score=candidate.cumulative_logprob / length**self.length_penalty,
            finish_reason="stop" if candidate.token in self.stop_token_ids else "length",
            logprobs=logprobs,
        )
        self.hypotheses.append(hypothesis)
        self.hypotheses.sort(key=lambda h: -h.score)
        del self.hypotheses[self.width :]

    def results(self) -> list[Hypothesis]:
        """The `n` best hypotheses, best first (running beams fill in if too few finished)."""
        found = list(self.hypotheses)
        for seq, score in zip(self.beams, self.scores, strict=False):
            if len(found) >= self.num_returned:
                break
            length = max(seq.num_output_tokens, 1)
            found.append(
                Hypothesis(
                    list(seq.output_token_ids),
                    score,
                    score / length**self.length_penalty,
                    "length",
                    seq.logprobs,
                )
            )
        return found[: self.num_returned]

    # --- the sequences that carry the beams ------------------------------------------------------
    def apply(
        self,
        running: list[_Candidate],
        block_manager: BlockManager,
        spawn: Callable[[Sequence], Sequence],
    ) -> list[Sequence]:
        """Make the beam sequences follow a step: a parent chosen once continues as itself, each
        further child takes a released beam's sequence (or a new one from `spawn`) and forks
        the parent's KV blocks; then every beam appends its token. Returns the sequences no beam
        needs any more (the engine finishes them)."""
        old = self.beams
        continues_as: dict[int, int] = {}
        for index, candidate in enumerate(running):
            continues_as.setdefault(candidate.parent, index)
        spare = [seq for index, seq in enumerate(old) if index not in continues_as]
        beams: list[Sequence] = []
        for index, candidate in enumerate(running):
            parent = old[candidate.parent]
            if continues_as[candidate.parent] == index:
                beams.append(parent)
                continue
            child = spare.pop() if spare else spawn(parent)
            block_manager.fork(parent, child)
            child.token_ids = list(parent.token_ids)
            child.num_computed_tokens = parent.num_computed_tokens
            child.logprobs = None if parent.logprobs is None else list(parent.logprobs)
            beams.append(child)
        for seq, candidate in zip(beams, running, strict=True):
            seq.token_ids.append(candidate.token)
            if candidate.logprob_entry is not None:
                seq.logprobs = [*(seq.logprobs or []), candidate.logprob_entry]
        self.beams = beams
        return spare


class BeamSearchFeature(StepFeature):
    """The step feature: the searches of the engine's beam requests, by request and by beam.

    It claims its beams' rows of each pass (their search ranks them), steps each search once all
    its beams have rows, and counts a search as its width in the scheduler's seats (`seats_needed`,
    `seats_in_use`: the beams it may fork).
    """

    def __init__(
        self,
        block_manager: BlockManager,
        finish: Callable[[Sequence], None],
        spawn: Callable[[Sequence], Sequence],
        bans: Callable[[list[Sequence], list[int]], list[BannedTokens]],
    ) -> None:
        self._block_manager = block_manager
        self._finish = finish
        self._spawn = spawn
        self._bans = bans
        self._searches: dict[str, BeamSearch] = {}
        self._search_of: dict[int, BeamSearch] = {}
        #: searches that got rows in the latest pass, by request id
        self._fed: dict[str, BeamSearch] = {}

    def start(
        self, root: Sequence, width: int, stop_token_ids: frozenset[int], max_output_tokens: int
    ) -> None:
        search = BeamSearch(root, width, stop_token_ids, max_output_tokens)
        self._searches[root.request_id] = search
        self._search_of[root.seq_id] = search

    def search(self, request_id: str) -> BeamSearch | None:
        return self._searches.get(request_id)

    # --- the scheduler's seats --------------------------------------------------------------------
    def seats_needed(self, seq: Sequence) -> int:
        """Seats a waiting sequence takes when admitted: a search's width for its first beam, none
        for a beam joining its running search, one for any other sequence."""
        search = self._search_of.get(seq.seq_id)
        if search is None:
            return 1
        return 0 if any(beam.status is SequenceStatus.RUNNING for beam in search.beams) else search.width

    def seats_in_use(self, running: list[Sequence]) -> int:
        """Running sequences, a beam search counting as its width (the beams it may fork)."""
        if not self._search_of:
            return len(running)
        widths = {}
        plain = 0
        for seq in running:
            search = self._search_of.get(seq.seq_id)
            if search is None:
                plain += 1
            else:
                widths[id(search)] = search.width
        return plain + sum(widths.values())

    # --- step hooks -------------------------------------------------------------------------------
    def read_logits(self, logits: PassLogits, batch: ScheduledBatch) -> None:
        """Give each beam that sampled in this pass its next-token logprobs (bans applied after the
        log-softmax, as transformers' logits processors do in beam search)."""
        if not self._search_of:
            return
        seqs = batch.seqs
        indices = [index for index in logits.sampling if seqs[index].seq_id in self._search_of]
        if not indices:
            return
        logits.claim(indices)
        logprobs = log_softmax(logits.host_rows([logits.sampling_row(i) for i in indices]))
        for ban in self._bans(seqs, indices):
            logprobs[ban.row, ban.token_ids] = -np.inf
        for row, index in enumerate(indices):
            seq = seqs[index]
            search = self._search_of[seq.seq_id]
            search.add_row(seq, logprobs[row])
            self._fed[seq.request_id] = search

    def after_emit(self, emitted: list[Sequence], live: Mapping[str, Any]) -> list[str]:
        """Run a search step for each search whose beams all have their rows (beams get rows only
        from the passes they sample in); the requests whose search finished."""
        if not self._fed:
            return []
        fed, self._fed = self._fed, {}
        finished = []
        for request_id, search in fed.items():
            if request_id not in live or not search.ready:
                continue
            self._step(search)
            if search.done:
                finished.append(request_id)
        return finished

    def _step(self, search: BeamSearch) -> None:
        running = search.step()

        def spawn(parent: Sequence) -> Sequence:
            child = self._spawn(parent)
            self._search_of[child.seq_id] = search
            return child

        released = search.apply(running, self._block_manager, spawn)
        finished = released + (search.beams if search.done else [])
        now = time.time()
        for beam in search.beams:
            if beam.first_token_time is None:
                beam.first_token_time = now
        for beam in finished:
            beam.finish_reason = "length"  # bookkeeping only: outputs come from the hypotheses
            beam.finish_time = now
            self._finish(beam)

    def release(self, request_id: str, seqs: list[Sequence]) -> None:
        if self._searches.pop(request_id, None) is None:
            return
        self._fed.pop(request_id, None)
        for seq in seqs:
            self._search_of.pop(seq.seq_id, None)
