"""Draft-model proposals: a small model with its own KV cache drafts tokens for the large one.

The draft model is loaded like any model (`speculative_config["model"]`: a path or an embedded
name) on the target's backend, and must share the target's vocabulary. It keeps its own paged KV
cache and block manager, with as many blocks of the same size as the target's cache. Each
speculating sequence has a `DraftSequence` here: the tokens the draft model has seen and how many
of them are in its cache. Every step first catches the draft up with the target's tokens (the
whole prompt the first time, afterwards the tokens verified since), then runs `k` one-token
passes, all speculating sequences batched together, each drawing a draft token: the argmax for
greedy requests, else a sample from the request's own temperature / top-k / top-p distribution
q, which the rejection sampler needs.

Rollback: a rejected draft's position no longer matches the target's tokens, so at the next
step the draft's computed count is cut back to the longest prefix it shares with the target's
tokens and the blocks past it are released.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.sampler import filtered_distribution
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sequence import Sequence
from fastdeploy.engine.spec_decode.proposal import Proposal, ProposerContext, register_proposer
from fastdeploy.engine.spec_decode.rejection import draw
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.model_loader import build_model, inspect_checkpoint
from fastdeploy.model_executor.model_runner import ModelRunner
from fastdeploy.model_resolver import resolve_model
from fastdeploy.plugins.registry import PluginRegistry
from fastdeploy.speculative_config import SpeculativeConfig


@dataclass
class DraftSequence:
    """The draft model's view of one target sequence (what `build_layout` and `BlockManager` read)."""

    seq_id: int
    rng: np.random.Generator
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0
    #: the draft model is text-only: a multimodal prompt's placeholder ids reach it as plain tokens
    extra_inputs: None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def draft_token(
    logits: np.ndarray, params: SamplingParams, rng: np.random.Generator, vocab_size: int
) -> tuple[int, np.ndarray | None]:
    """A draft token from a proposer's logits row: the argmax for greedy requests, else a draw
    from the request's own temperature / top-k / top-p distribution, returned with it (dense
    [vocab_size]) for the rejection sampler."""
    if params.greedy:
        return int(np.argmax(logits)), None
    candidates, weights = filtered_distribution(logits, params)
    dense = np.zeros(vocab_size)
    dense[candidates] = weights
    return int(candidates[draw(weights, rng)]), dense


def _common_prefix(a: list[int], b: list[int]) -> int:
    length = min(len(a), len(b))
    mismatch = np.flatnonzero(np.asarray(a[:length]) != np.asarray(b[:length]))
    return int(mismatch[0]) if mismatch.size else length


class DraftModelProposer:
    """Loads the draft model and drafts for batches of target sequences."""

    def __init__(
        self,
        model: str,
        backend: Backend,
        registry: PluginRegistry,
        max_model_len: int,
        block_size: int,
        num_blocks: int,
        vocab_size: int,
    ) -> None:
        checkpoint = inspect_checkpoint(resolve_model(model), registry)
        config = checkpoint.config
        if config.vocab_size != vocab_size:
            raise InvalidArgumentError(
                f"speculative_config.model {model!r} has a vocabulary of {config.vocab_size} tokens; the "
                f"draft model must share the target's ({vocab_size})"
            )
        self.vocab_size = vocab_size
        draft = build_model(checkpoint, backend, max_model_len, registry)
        spec = draft.kv_cache_spec(num_blocks, block_size, "float32")
        self.runner = ModelRunner(draft, backend, backend.allocate_kv_cache(spec), block_size)
        self.blocks = BlockManager(num_blocks, block_size)
        self._states: dict[int, DraftSequence] = {}

    def forget_except(self, live: set[int]) -> None:
        """Release the cache of sequences that no longer run."""
        for seq_id in [seq_id for seq_id in self._states if seq_id not in live]:
            self.blocks.free(self._states.pop(seq_id))

    def _sync(self, seq: Sequence) -> DraftSequence:
        """The draft state of `seq`, cut back to the prefix it shares with the target's tokens."""
        state = self._states.get(seq.seq_id)
        if state is None:
            state = DraftSequence(seq.seq_id, seq.rng.spawn(1)[0])
            self._states[seq.seq_id] = state
        valid = _common_prefix(state.token_ids, seq.token_ids)
        state.num_computed_tokens = min(state.num_computed_tokens, valid)
        self.blocks.truncate(state)
        state.token_ids = list(seq.token_ids)
        return state

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> list[Proposal]:
        """Up to `lengths[i]` draft tokens for each of `seqs` (fewer if the draft cache is full)."""
        states = [self._sync(seq) for seq in seqs]
        proposals = [Proposal([]) for _ in seqs]
        probs: list[list[np.ndarray]] = [[] for _ in seqs]
        active = list(range(len(seqs)))
        for round_index in range(max(lengths, default=0)):
            active = [i for i in active if lengths[i] > round_index]
            batch = ScheduledBatch()
            for i in list(active):
                state = states[i]
                count = state.num_tokens - state.num_computed_tokens
                if not self.blocks.can_allocate(state, count):
                    active.remove(i)  # no room in the draft cache: fewer drafts this step
                    continue
                self.blocks.allocate(state, count)
                batch.add(state, count)
            if not batch.seqs:
                break
            device_logits, _, _ = self.runner.execute(batch)  # every state samples: batch order
            logits = self.runner.backend.to_numpy(device_logits)
            for row, (i, state) in enumerate(zip(active, batch.seqs, strict=True)):
                state.num_computed_tokens = state.num_tokens
                token, dense = draft_token(logits[row], seqs[i].params, state.rng, self.vocab_size)
                if dense is not None:
                    probs[i].append(dense)
                state.token_ids.append(token)
                proposals[i].token_ids.append(token)
        for proposal, rows in zip(proposals, probs, strict=True):
            if rows:
                proposal.probs = np.stack(rows)
        return proposals


@register_proposer("draft_model")
def build_draft_model_proposer(config: SpeculativeConfig, context: ProposerContext) -> DraftModelProposer:
    return DraftModelProposer(
        config.model,
        context.backend,
        context.registry,
        context.max_model_len,
        context.block_size,
        context.num_blocks,
        context.vocab_size,
    )
