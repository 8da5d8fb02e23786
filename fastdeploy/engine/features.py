"""The engine's step features, built in the order their hooks run: fault isolation (checks the
logits first), prompt logprobs, speculative decoding (when configured), guided decoding, beams.

Each lives in its own module (`engine/step_feature.py` says what the hooks are); adding one is a
class there and a line here, never a change to the core loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from fastdeploy.backends.capabilities import Capability
from fastdeploy.config import EngineConfig
from fastdeploy.engine.beam_search import BeamSearchFeature
from fastdeploy.engine.builder import EngineSetup, LoadedModel
from fastdeploy.engine.fault_isolation import FaultIsolation
from fastdeploy.engine.guided.decoder import GuidedDecoder
from fastdeploy.engine.kv_transfer import KVExport, KVImport
from fastdeploy.engine.prompt_logprobs import PromptLogprobs
from fastdeploy.engine.sampler import BannedTokens
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.sequence import Sequence
from fastdeploy.engine.spec_decode.decoder import SpeculativeDecoder, build_speculative_decoder
from fastdeploy.engine.spec_decode.proposal import ProposerContext
from fastdeploy.engine.step_feature import StepFeature
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.tokenizer import Tokenizer
from fastdeploy.kv_layout import KVLayout
from fastdeploy.model_executor.model_runner import ModelRunner
from fastdeploy.model_resolver import DEFAULT_MODEL


@dataclass
class Features:
    """The engine's step features; `ordered` is the order their hooks run in."""

    fault_isolation: FaultIsolation
    prompt_logprobs: PromptLogprobs
    spec: SpeculativeDecoder | None
    guided: GuidedDecoder
    beams: BeamSearchFeature
    ordered: list[StepFeature]
    #: prefill/decode disaggregation: the side this instance plays (None when mixed)
    kv_transfer: KVExport | KVImport | None = None


@dataclass
class FeatureNeeds:
    """What the features need of the engine besides its setup."""

    scheduler: Scheduler
    tokenizer: Tokenizer
    eos_token_ids: frozenset[int]
    reasoning_end: list[int] | None
    #: a new sequence for a beam forked from the given one, queued where that one is
    spawn: Callable[[Sequence], Sequence]
    #: the bans of the rows at the given sampling indices of a batch's sequences
    bans: Callable[[list[Sequence], list[int]], list[BannedTokens]]


def build_features(
    config: EngineConfig, setup: EngineSetup, loaded: LoadedModel, needs: FeatureNeeds
) -> Features:
    manager = loaded.block_manager
    spec_decoder = None
    if config.speculative_config is not None:
        context = ProposerContext(
            setup.backend,
            setup.registry,
            setup.max_model_len,
            manager.block_size,
            manager.num_blocks,
            setup.model_config.vocab_size,
            setup.checkpoint,
            loaded.executor if isinstance(loaded.executor, ModelRunner) else None,
        )
        spec_decoder = build_speculative_decoder(config.speculative_config, context, manager)
    guided = GuidedDecoder(
        config.guided_decoding_backend,
        needs.tokenizer,
        setup.model_config.vocab_size,
        sorted(needs.eos_token_ids),
        needs.reasoning_end,
        config.guided_decoding_disable_any_whitespace,
    )
    beams = BeamSearchFeature(manager, needs.scheduler.finish, needs.spawn, needs.bans)
    needs.scheduler.seats = beams
    # a dead rank raises WorkerFailedError: only an in-process model has a probe
    fault_isolation = FaultIsolation(setup.backend, loaded.executor.probe)
    prompt_logprobs = PromptLogprobs()
    needs.scheduler.prompt_scoring = prompt_logprobs
    if spec_decoder is not None:
        needs.scheduler.drafts = spec_decoder.drafts
    ordered = [fault_isolation, prompt_logprobs, *([spec_decoder] if spec_decoder else []), guided, beams]
    kv_transfer = build_kv_transfer(config, setup, loaded)
    if kv_transfer is not None:
        ordered.append(kv_transfer)
    return Features(fault_isolation, prompt_logprobs, spec_decoder, guided, beams, ordered, kv_transfer)


def build_kv_transfer(
    config: EngineConfig, setup: EngineSetup, loaded: LoadedModel
) -> KVExport | KVImport | None:
    """The disaggregation side of a prefill or decode instance (None for a mixed one)."""
    role = config.splitwise_role
    if role == "mixed":
        return None
    if not setup.backend.supports(Capability.KV_BLOCK_TRANSFER):
        raise InvalidArgumentError(
            f"--splitwise-role {role}: the {setup.backend.name} backend cannot read or write KV blocks "
            "(Capability.KV_BLOCK_TRANSFER)"
        )
    spec, kv_caches = loaded.kv_cache_spec, loaded.executor.kv_caches
    if loaded.kv_groups is not None:
        windows = ", ".join(str(group.window or "whole context") for group in loaded.kv_groups)
        raise InvalidArgumentError(
            f"--splitwise-role {role}: {setup.model_config.architecture} keeps its KV cache in "
            f"{len(loaded.kv_groups)} layer groups (sliding windows: {windows}), whose blocks "
            "disaggregation's KV transfer cannot carry yet; serve this model as a mixed instance, "
            "or with max_model_len within its sliding window (one group)"
        )
    if spec.kind != "kv":
        raise InvalidArgumentError(
            f"--splitwise-role {role}: a {spec.kind} KV cache (multi-head latent attention) cannot be "
            "transferred yet; serve this model as a mixed instance"
        )
    layout = KVLayout(
        os.path.basename(os.path.normpath(config.model or DEFAULT_MODEL)),
        spec.dtype,
        spec.block_size,
        spec.num_layers,
        spec.num_kv_heads,
        spec.head_dim,
    )
    if role == "prefill":
        return KVExport(setup.backend, kv_caches, layout, config.kv_transfer_timeout)
    return KVImport(setup.backend, kv_caches, loaded.block_manager, layout, config.kv_transfer_timeout)
