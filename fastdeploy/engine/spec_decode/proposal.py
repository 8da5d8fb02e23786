"""What a proposer hands the verifier, the interface proposers implement, and their registry.

Each proposer module registers a builder under its `speculative_config.method` name
(`register_proposer`); `spec_decode/decoder.py` builds the configured one from `PROPOSERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.engine.sequence import Sequence
from fastdeploy.model_executor.model_loader import CheckpointInfo
from fastdeploy.model_executor.model_runner import ModelRunner
from fastdeploy.plugins.registry import PluginRegistry
from fastdeploy.speculative_config import SpeculativeConfig


@dataclass
class Proposal:
    """Draft tokens of one sequence and, when they were sampled, the distributions they came from."""

    token_ids: list[int]
    #: [len(token_ids), vocab] probabilities q the drafts were drawn from; None for drafts that are
    #: certain (prompt lookup, greedy draft models): the verifier then accepts them while they equal
    #: the target's own tokens
    probs: np.ndarray | None = None


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], lengths: list[int]) -> list[Proposal]:
        """Up to `lengths[i]` draft tokens to follow `seqs[i].token_ids`."""

    def forget_except(self, live: set[int]) -> None:
        """Drop any state kept for sequences whose ids are not in `live`."""


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer may need of the engine it drafts for."""

    backend: Backend | None
    registry: PluginRegistry
    max_model_len: int
    #: the target's KV block size and number of blocks (a draft model's cache mirrors them)
    block_size: int
    num_blocks: int
    vocab_size: int
    #: the target's checkpoint, for proposers built from its weights (MTP layers)
    checkpoint: CheckpointInfo | None = None
    #: the target's in-process model runner (None when the model runs in rank processes), for
    #: proposers that read its hidden states
    target: ModelRunner | None = None


ProposerBuilder = Callable[[SpeculativeConfig, ProposerContext], Proposer]

#: speculative_config.method -> the builder of its proposer
PROPOSERS: dict[str, ProposerBuilder] = {}


def register_proposer(method: str) -> Callable[[ProposerBuilder], ProposerBuilder]:
    """Decorator: build the proposer of `speculative_config.method == method` with this function."""

    def register(builder: ProposerBuilder) -> ProposerBuilder:
        PROPOSERS[method] = builder
        return builder

    return register
