"""The named points of an engine step where a decoding feature plugs in.

A step is schedule -> execute -> update (`engine/engine.py`). Features (beam search, speculative
decoding, prompt logprobs, guided decoding, fault isolation) subclass `StepFeature`, override
the hooks they need and keep their per-sequence state themselves, keyed by sequence or request.
The engine calls, at each point, only the features that override that hook, in the order of
its feature list; a feature with nothing to do returns at once, so an idle feature costs O(1)
per step.

    before_schedule(running)     before the scheduler runs (speculation proposes drafts)
    read_logits(logits, batch)   after the pass, before sampling: read rows (prompt logprobs,
                                 beam rows, draft verification, the finiteness check), claim
                                 the rows the feature decides itself (`PassLogits.claim`) and
                                 return the tokens it emits
    mask(backend, rows, seqs)    the rows about to be sampled (grammar masks)
    refusals(bans)               rows whose request must be refused after masking and bans
    after_pass(batch)            after the core advanced the batch's computed counts
                                 (rejected drafts are rolled back)
    after_emit(emitted, live)    after new tokens were appended (verified drafts committed,
                                 grammar states advanced, beam searches stepped); returns the
                                 ids of requests it finished
    release(request_id, seqs)    a request left the engine (finished, aborted or failed)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastdeploy.backends.base import Backend
from fastdeploy.engine.pass_logits import PassLogits
from fastdeploy.engine.sampler import BannedTokens
from fastdeploy.engine.sequence import Sequence
from fastdeploy.model_executor.batch import ScheduledBatch

#: tokens a feature emits from a pass: the sequences, and per sequence a tuple of tokens
Emitted = tuple[list[Sequence], list[tuple[int, ...]]]

HOOKS = ("before_schedule", "read_logits", "mask", "refusals", "after_pass", "after_emit", "release")


class StepFeature:
    """A decoding feature; every hook is a no-op until overridden."""

    def before_schedule(self, running: list[Sequence]) -> None:
        return None

    def read_logits(self, logits: PassLogits, batch: ScheduledBatch) -> Emitted | None:
        return None

    def mask(self, backend: Backend, rows: Any, seqs: list[Sequence]) -> Any:
        return rows

    def refusals(self, bans: list[BannedTokens]) -> dict[int, str]:
        return {}

    def after_pass(self, batch: ScheduledBatch) -> None:
        return None

    def after_emit(self, emitted: list[Sequence], live: Mapping[str, Any]) -> list[str]:
        return []

    def release(self, request_id: str, seqs: list[Sequence]) -> None:
        return None


def hooks(features: list[StepFeature], name: str) -> list[Any]:
    """The bound `name` hooks of the features that override it, in order."""
    default = getattr(StepFeature, name)
    return [getattr(feature, name) for feature in features if getattr(type(feature), name) is not default]
