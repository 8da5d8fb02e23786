"""Multi-token-prediction ("mtp") drafts: the target checkpoint's own MTP layer proposes.

DeepSeek-V3 checkpoints carry a module trained to predict the token after next from the main
model's final hidden state h_i and the next token t_{i+1} (the target model's `mtp_model()`,
e.g. `models.deepseek_v3.DeepseekV3MTP`). It runs in this process on the target's backend with
a one-layer KV cache of its own (blocks of the target's size, a block manager of its own), and
the target's model runner hands it every pass's hidden states (`ModelRunner.hidden_listener`):
they are kept per sequence and position until the MTP layer has consumed them.

MTP position i of a sequence computes from (h_i, t_{i+1}); the MTP's view of a sequence is
therefore its tokens shifted by one. Each step, for a sequence whose target has computed
positions 0..n-2 (n tokens): the MTP layer catches up over the positions it has not seen, up
to n-2, and its logits there give draft 1 (for t_n). Draft j > 1 comes from position n-3+j,
whose h is the MTP layer's own output at the position before (the same layer applied again),
and whose next token is draft j-1. Those positions stand on guesses, so afterwards the MTP cache
is cut back to position n-2: they are computed again from the target's hidden states once the
target has verified the tokens.

Positions whose hidden state the target never computed (a prompt prefix found in the prefix
cache) enter with a zero h: only the drafts' quality suffers, never the output, which the
verification fixes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.sequence import Sequence
from fastdeploy.engine.spec_decode.draft_model import DraftSequence, draft_token
from fastdeploy.engine.spec_decode.proposal import Proposal, ProposerContext, register_proposer
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.model_loader import CheckpointInfo
from fastdeploy.model_executor.model_runner import ModelRunner, build_layout
from fastdeploy.speculative_config import SpeculativeConfig


class TargetHiddenStates:
    """The target's final hidden states by sequence and position, from its passes."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._rows: dict[int, dict[int, np.ndarray]] = {}

    def record(self, batch: ScheduledBatch, hidden: Any) -> None:
        """`ModelRunner.hidden_listener`: keep each row under its sequence and position (a later
        pass over a position, after rejected drafts, replaces it)."""
        host = self.backend.to_numpy(hidden)
        row = 0
        for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
            rows = self._rows.setdefault(seq.seq_id, {})
            start = seq.num_computed_tokens
            # a copy: a backend may reuse its output buffers in the next pass
            block = np.array(host[row : row + count], dtype=np.float32)
            for offset in range(count):
                rows[start + offset] = block[offset]
            row += count

    def take(self, seq_id: int, positions: range, width: int) -> np.ndarray:
        """[len(positions), width] hidden states (zero where none was computed), forgetting those
        and every earlier one."""
        rows = self._rows.get(seq_id, {})
        zero = np.zeros(width, np.float32)
        out = np.stack([rows.get(p, zero) for p in positions]) if len(positions) else np.zeros((0, width))
        for position in [p for p in rows if p < positions.stop]:
            del rows[position]
        return out.astype(np.float32)

    def forget_except(self, live: set[int]) -> None:
        for seq_id in [seq_id for seq_id in self._rows if seq_id not in live]:
            del self._rows[seq_id]


class MTPProposer:
    """Drafts with the target's MTP layer; see the module doc."""

    def __init__(
        self,
        target: ModelRunner,
        checkpoint: CheckpointInfo,
        block_size: int,
        num_blocks: int,
        vocab_size: int,
    ) -> None:
        build = getattr(target.model, "mtp_model", None)
        if build is None:
            raise InvalidArgumentError(
                f"speculative_config method 'mtp' needs a model with multi-token-prediction layers "
                f"(DeepSeek-V3); {checkpoint.config.architecture} has none"
            )
        self.model = build()
        self.model.load_weights(checkpoint.loader.load_tensors(checkpoint.path))
        self.backend = target.backend
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.width = checkpoint.config.hidden_size
        spec = self.model.kv_cache_spec(num_blocks, block_size, "float32")
        self.kv_caches = self.backend.allocate_kv_cache(spec)
        self.blocks = BlockManager(num_blocks, block_size)
        self.hidden = TargetHiddenStates(self.backend)
        target.hidden_listener = self.hidden.record
        self._states: dict[int, DraftSequence] = {}

    def forget_except(self, live: set[int]) -> None:
        for seq_id in [seq_id for seq_id in self._states if seq_id not in live]:
            self.blocks.free(self._states.pop(seq_id))
        self.hidden.forget_except(live)

    def _state(self, seq: Sequence) -> DraftSequence:
        """The MTP view of `seq`: its tokens from the second on, the cache cut back to the
        positions computed from the target's hidden states."""
        state = self._states.get(seq.seq_id)
        if state is None:
            state = DraftSequence(seq.seq_id, seq.rng.spawn(1)[0])
            self._states[seq.seq_id] = state
        state.token_ids = list(seq.token_ids[1:])
        state.num_computed_tokens = min(state.num_computed_tokens, seq.num_computed_tokens - 1)
        self.blocks.truncate(state)
        return state

    def _pass(self, batch: ScheduledBatch, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(logits [seqs, vocab], MTP outputs [seqs, hidden]) at each sequence's last position."""
        backend = self.backend
        layout, _ = build_layout(batch, self.block_size)
        out = self.model.forward(
            backend.from_numpy(layout.input_ids),
            backend.from_numpy(layout.positions),
            backend.prepare_batch(layout),
            self.kv_caches,
            backend.from_numpy(previous),
        )
        rows = backend.gather_rows(out, backend.from_numpy(layout.logits_indices))
        logits = backend.to_numpy(self.model.compute_logits(rows))
        return np.asarray(logits), np.asarray(backend.to_numpy(rows), dtype=np.float32)

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> list[Proposal]:
        proposals = [Proposal([]) for _ in seqs]
        probs: list[list[np.ndarray]] = [[] for _ in seqs]
        states = [self._state(seq) for seq in seqs]
        batch, inputs, active = ScheduledBatch(), [], []
        for i, state in enumerate(states):
            count = state.num_tokens - state.num_computed_tokens
            if count < 1 or not self.blocks.can_allocate(state, count):
                continue
            self.blocks.allocate(state, count)
            batch.add(state, count)
            positions = range(state.num_computed_tokens, state.num_tokens)
            inputs.append(self.hidden.take(state.seq_id, positions, self.width))
            active.append(i)
        rounds = max(lengths, default=0)
        for round_index in range(rounds):
            if not batch.seqs:
                break
            logits, outputs = self._pass(batch, np.concatenate(inputs))
            batch, inputs, still = ScheduledBatch(), [], []
            for row, i in enumerate(active):
                state = states[i]
                state.num_computed_tokens = state.num_tokens
                token, dense = draft_token(logits[row], seqs[i].params, state.rng, self.vocab_size)
                proposals[i].token_ids.append(token)
                if dense is not None:
                    probs[i].append(dense)
                if round_index + 1 < lengths[i] and self.blocks.can_allocate(state, 1):
                    state.token_ids.append(token)
                    self.blocks.allocate(state, 1)
                    batch.add(state, 1)
                    inputs.append(outputs[row : row + 1])
                    still.append(i)
            active = still
        for seq, state in zip(seqs, states, strict=True):  # positions past n-2 stood on guesses
            state.num_computed_tokens = min(state.num_computed_tokens, seq.num_tokens - 1)
            self.blocks.truncate(state)
        for proposal, rows in zip(proposals, probs, strict=True):
            if rows:
                proposal.probs = np.stack(rows)
        return proposals


@register_proposer("mtp")
def build_mtp_proposer(config: SpeculativeConfig, context: ProposerContext) -> MTPProposer:
    if context.target is None or context.checkpoint is None:
        raise InvalidArgumentError(
            "speculative_config method 'mtp' needs the model in this process (tensor and pipeline "
            "parallel sizes of 1)"
        )
    return MTPProposer(
        context.target, context.checkpoint, context.block_size, context.num_blocks, context.vocab_size
    )
