"""Speculative decoding in the engine's step: drafts before scheduling, one verify pass, rollback.

Before each schedule, every running sequence in its decode phase may get up to
`num_speculative_tokens` draft tokens (`drafts`, by sequence id, which the scheduler reads and
shortens to what fits; the batch carries them to the layout). The scheduler then gives it
1 + len(drafts) query positions (its last token and the drafts) in the same forward pass as
every other sequence; the paged attention treats them like a prefill chunk. The logits of those
k + 1 positions verify the drafts (`rejection.py`): the accepted drafts and one more token are
emitted. The rejected drafts are rolled back: the sequence's computed count stops after the
last accepted draft (their KV slots are overwritten by later tokens before anything reads them)
and blocks holding only rejected positions go back to the block manager.

Which sequences speculate: decoding ones (not mid-prefill) whose sampling does not depend on the
tokens before each position in ways the verify pass cannot see: no repetition / frequency /
presence penalties, no bad words, `min_tokens` already reached, no `reasoning_max_tokens`, no
guided decoding (its mask for each position depends on the tokens before it). Beam search never
speculates. Drafts stay within `max_model_len` and `max_tokens`.

Back-off: a sequence whose drafts were all rejected waits before drafting again, 0, 1, 3, 7, ...
(at most `MAX_BACKOFF_STEPS`) steps for each further consecutive miss; an accepted draft resets
it. Open-ended text, where lookups rarely match and matches rarely hold, then costs almost
nothing over plain decoding.

Verifying changes nothing but the sequences' generators: `verify` notes each sequence's outcome
and `commit` applies it (logprobs, statistics, back-off) once the engine keeps the pass, so a pass
that fault isolation runs again (`engine/fault_isolation.py`) is verified again from scratch.

A proposer that raises (a draft model's pass failing) costs only speculation: that step has no
drafts, the proposer's state is dropped, and its sequences wait the longest back-off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.pass_logits import PassLogits
from fastdeploy.engine.sampler import filtered_distribution, record_logprobs, sample_row
from fastdeploy.engine.sampling_rules import speculation_allowed
from fastdeploy.engine.sequence import Sequence, SequenceStatus
from fastdeploy.engine.spec_decode import draft_model, mtp, ngram  # noqa: F401  (they register their proposers)
from fastdeploy.engine.spec_decode.proposal import PROPOSERS, Proposer, ProposerContext
from fastdeploy.engine.spec_decode.rejection import accept_matching, rejection_sample
from fastdeploy.engine.step_feature import Emitted, StepFeature
from fastdeploy.engine.totals import summed_fields
from fastdeploy.errors import EngineDeadError
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.speculative_config import SpeculativeConfig

logger = get_logger(__name__)

MAX_BACKOFF_STEPS = 32


@dataclass
class SpecDecodeStats:
    """Totals over all sequences since the engine started (for /metrics)."""

    #: verify passes that carried at least one draft
    num_verify_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    #: tokens the verify passes emitted (accepted drafts plus one each)
    num_emitted_tokens: int = 0

    @classmethod
    def summed(cls, parts: Iterable[SpecDecodeStats | None]) -> SpecDecodeStats | None:
        """The totals of several engines (data-parallel replicas); None when none speculates."""
        present = [part for part in parts if part is not None]
        if not present:
            return None
        return summed_fields(cls, present)


@dataclass
class _Backoff:
    misses: int = 0
    #: steps left before the sequence drafts again
    wait: int = 0


@dataclass
class _Outcome:
    """One sequence's verification, until the engine commits it."""

    seq: Sequence
    num_drafts: int
    emitted: list[int]
    #: the target's logits at the position of each emitted token [len(emitted), vocab]
    logits: np.ndarray
    #: the sequence's output tokens before the engine appends the emitted ones
    num_outputs_before: int


def _speculates(seq: Sequence) -> bool:
    """Whether `seq`'s next tokens can be verified from one pass's logits (see the module doc)."""
    return (
        seq.status is SequenceStatus.RUNNING
        and seq.num_computed_tokens == seq.num_tokens - 1
        and seq.num_output_tokens >= seq.params.min_tokens
        and speculation_allowed(seq.params)
    )


class SpeculativeDecoder(StepFeature):
    """Drafts, verifies and rolls back for the engine; one per engine (a step feature)."""

    def __init__(
        self,
        proposer: Proposer,
        num_speculative_tokens: int,
        max_model_len: int,
        block_manager: BlockManager | None = None,
    ) -> None:
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        self.max_model_len = max_model_len
        #: the target's blocks (rejected drafts' blocks go back to it)
        self.block_manager = block_manager
        self.stats = SpecDecodeStats()
        #: per request: [verify passes, drafts, accepted drafts] (its `RequestMetrics`)
        self._counts: dict[str, list[int]] = {}
        self._backoff: dict[int, _Backoff] = {}
        #: the distributions sampled drafts came from, by sequence id, until the next proposal
        self._draft_probs: dict[int, np.ndarray] = {}
        #: verified sequences' outcomes, by sequence id, until committed
        self._outcomes: dict[int, _Outcome] = {}
        #: this step's draft tokens, by sequence id (the scheduler reads them)
        self.drafts: dict[int, list[int]] = {}

    # --- before scheduling ------------------------------------------------------------------------
    def propose(self, running: list[Sequence]) -> None:
        """Propose `drafts` for the running sequences that speculate this step."""
        live = {seq.seq_id for seq in running}
        for seq_id in [seq_id for seq_id in self._backoff if seq_id not in live]:
            del self._backoff[seq_id]
        self.proposer.forget_except(live)
        self._draft_probs.clear()
        self._outcomes.clear()  # those of requests that failed after their pass
        self.drafts.clear()
        drafting, lengths = [], []
        for seq in running:
            backoff = self._backoff.setdefault(seq.seq_id, _Backoff())
            if backoff.wait:
                backoff.wait -= 1
                continue
            room = min(
                self.num_speculative_tokens,
                self.max_model_len - seq.num_tokens,
                seq.max_output_tokens - seq.num_output_tokens - 1,
            )
            if room > 0 and _speculates(seq):
                drafting.append(seq)
                lengths.append(room)
        try:
            proposals = self.proposer.propose(drafting, lengths)
        except EngineDeadError:
            raise
        except Exception as exc:  # drafts are an optimisation: the target decodes without them
            self._after_failed_proposal(drafting, exc)
            return
        for seq, proposal in zip(drafting, proposals, strict=True):
            if proposal.token_ids:
                self.drafts[seq.seq_id] = list(proposal.token_ids)
            if proposal.probs is not None:
                self._draft_probs[seq.seq_id] = proposal.probs

    def _after_failed_proposal(self, drafting: list[Sequence], exc: Exception) -> None:
        """The proposer raised (a draft model's pass failed): no drafts this step, its state
        dropped (it may be half updated; the draft model catches up again from the tokens), and
        the sequences it was drafting for wait the longest back-off before drafting again."""
        logger.warning(
            "the %s proposer failed (%s: %s); %d sequences decode without drafts for now",
            type(self.proposer).__name__,
            type(exc).__name__,
            exc,
            len(drafting),
            exc_info=exc,
        )
        for seq in drafting:  # they have no drafts yet
            self._backoff[seq.seq_id].wait = MAX_BACKOFF_STEPS
        self._draft_probs.clear()
        self.proposer.forget_except(set())

    # --- step hooks -------------------------------------------------------------------------------
    def before_schedule(self, running: list[Sequence]) -> None:
        self.propose(running)

    def read_logits(self, logits: PassLogits, batch: ScheduledBatch) -> Emitted | None:
        """Claim the drafted sequences' rows and emit their verified runs."""
        drafts = batch.drafts
        picked = [index for index in logits.sampling if index in drafts]
        if not picked:
            return None
        logits.claim(picked)
        return self.verify(logits, batch, picked)

    def after_pass(self, batch: ScheduledBatch) -> None:
        """Only each drafted sequence's last token and accepted drafts stand: its computed count
        drops the rejected ones and the blocks that held only those go back."""
        for index in batch.drafts:
            seq = batch.seqs[index]
            seq.num_computed_tokens -= self.num_rejected(seq)
            self.block_manager.truncate(seq)
            self.drafts.pop(seq.seq_id, None)

    def after_emit(self, emitted: list[Sequence], live: Mapping[str, Any]) -> list[str]:
        """Commit the verification of every drafted sequence whose request is still running."""
        if self._outcomes:
            for seq in [outcome.seq for outcome in self._outcomes.values()]:
                if seq.request_id in live:
                    self.commit(seq)
            self._outcomes.clear()
        return []

    def release(self, request_id: str, seqs: list[Sequence]) -> None:
        self._counts.pop(request_id, None)

    def request_counts(self, request_id: str) -> tuple[int, int, int]:
        """(verify passes, drafts, accepted drafts) of a request so far."""
        counts = self._counts.get(request_id)
        return (0, 0, 0) if counts is None else (counts[0], counts[1], counts[2])

    # --- after the forward pass -----------------------------------------------------------------
    def verify(self, logits: PassLogits, batch: ScheduledBatch, picked: list[int]) -> Emitted:
        """The verified tokens of the sequences at `picked` (they carried drafts). Nothing is
        recorded yet: the engine commits each outcome (`commit`) once the pass stands."""
        verified: Emitted = ([], [])
        rows: list[int] = []
        for index in picked:  # each sequence: its last token's and each draft's rows, in order
            extra = logits.extra(index)
            rows.extend(range(extra.offset, extra.offset + extra.positions.size))
            rows.append(logits.sampling_row(index))
        host = logits.host_rows(rows)
        offset = 0
        for index in picked:
            seq, drafts = batch.seqs[index], batch.drafts[index]
            seq_logits = host[offset : offset + len(drafts) + 1]
            offset += len(drafts) + 1
            emitted = self._verify_one(seq, drafts, seq_logits)
            self._outcomes[seq.seq_id] = _Outcome(
                seq, len(drafts), emitted, seq_logits[: len(emitted)], seq.num_output_tokens
            )
            verified[0].append(seq)
            verified[1].append(tuple(emitted))
        return verified

    def num_rejected(self, seq: Sequence) -> int:
        """How many of `seq`'s verified drafts were rejected (their positions do not stand)."""
        outcome = self._outcomes[seq.seq_id]
        return outcome.num_drafts + 1 - len(outcome.emitted)

    def commit(self, seq: Sequence) -> None:
        """Apply `seq`'s verification once the engine appended its emitted tokens (fewer when one
        of them finished the sequence): the logprobs of the tokens taken, the statistics and the
        back-off."""
        outcome = self._outcomes.pop(seq.seq_id)
        taken = seq.num_output_tokens - outcome.num_outputs_before
        for row, token in zip(outcome.logits[:taken], outcome.emitted[:taken], strict=True):
            record_logprobs(seq, row, token)
        self._account(seq, outcome.num_drafts, len(outcome.emitted) - 1)

    def _verify_one(self, seq: Sequence, drafts: list[int], logits: np.ndarray) -> list[int]:
        """The tokens `seq` emits given the target's logits at its last token and each draft."""
        draft_probs = self._draft_probs.get(seq.seq_id)
        if draft_probs is None:  # certain drafts: accept while the target's own tokens agree
            greedy = seq.params.greedy
            return accept_matching(
                drafts,
                lambda position: (
                    int(logits[position].argmax()) if greedy else sample_row(logits[position], seq)
                ),
            )
        target_probs = np.zeros((len(drafts) + 1, logits.shape[1]))
        for position, row in enumerate(logits):
            candidates, probs = filtered_distribution(row, seq.params)
            target_probs[position, candidates] = probs
        return rejection_sample(target_probs, draft_probs[: len(drafts)], drafts, seq.rng)

    def _account(self, seq: Sequence, drafted: int, accepted: int) -> None:
        stats = self.stats
        stats.num_verify_steps += 1
        stats.num_draft_tokens += drafted
        stats.num_accepted_tokens += accepted
        stats.num_emitted_tokens += accepted + 1
        counts = self._counts.setdefault(seq.request_id, [0, 0, 0])
        counts[0] += 1
        counts[1] += drafted
        counts[2] += accepted
        backoff = self._backoff.setdefault(seq.seq_id, _Backoff())
        if accepted:
            backoff.misses = 0
        else:
            backoff.misses += 1
            backoff.wait = min(2 ** (backoff.misses - 1) - 1, MAX_BACKOFF_STEPS)


def build_speculative_decoder(
    config: SpeculativeConfig, context: ProposerContext, block_manager: BlockManager
) -> SpeculativeDecoder:
    """The decoder for `config`, its proposer built by the builder registered for its method."""
    proposer = PROPOSERS[config.method](config, context)
    return SpeculativeDecoder(proposer, config.num_speculative_tokens, context.max_model_len, block_manager)
