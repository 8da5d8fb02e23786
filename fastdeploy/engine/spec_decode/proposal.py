"""What a proposer hands the verifier, and the interface proposers implement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fastdeploy.engine.sequence import Sequence


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
