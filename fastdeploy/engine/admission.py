"""Admitting a request whose prompt was checked: its settings against the engine's limits, its
samples as sequences (seeded, queued), and the features it uses started for them."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fastdeploy.engine.features import Features
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sampling_rules import EngineLimits, check_engine_limits
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.sequence import EngineRequest, Sequence
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.detokenizer import IncrementalDetokenizer
from fastdeploy.input.tokenizer import Tokenizer
from fastdeploy.model_executor.lora import LoRAManager, LoRARequest


class Admission:
    """Turns requests into queued sequences; numbers sequences and requests (their seeds)."""

    def __init__(
        self,
        seed: int,
        tokenizer: Tokenizer,
        scheduler: Scheduler,
        requests: Mapping[str, EngineRequest],
        eos_token_ids: frozenset[int],
        limits: EngineLimits,
        features: Features,
        loras: LoRAManager | None = None,
    ) -> None:
        self.seed = seed
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.requests = requests
        self.eos_token_ids = eos_token_ids
        self.limits = limits
        #: the engine's LoRA adapters (`enable_lora`), None without
        self.loras = loras
        self._guided, self._prompt_logprobs, self._beams = (
            features.guided,
            features.prompt_logprobs,
            features.beams,
        )
        self.next_seq_id = 0
        self.request_counter = 0

    def check(self, params: SamplingParams) -> None:
        """Raise InvalidArgumentError if this engine's limits rule out `params`."""
        check_engine_limits(params, self.limits)

    def admit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None,
        arrival_time: float | None,
        stream: bool,
        thinking_enabled: bool,
        multimodal: Any,
        lora: LoRARequest | None = None,
    ) -> EngineRequest:
        """The request, its samples (or first beam) queued; raises (nothing queued) if it cannot run."""
        self.check(params)
        self._check_lora(lora)
        grammar = self._guided.compile(params.guided_decoding) if params.guided_decoding else None
        room = self.limits.max_model_len - len(prompt_token_ids)
        request = EngineRequest(
            request_id,
            prompt,
            list(prompt_token_ids),
            params,
            time.time() if arrival_time is None else arrival_time,
            # best_of and beam requests choose their outputs at the end: nothing to stream before
            stream=stream and params.num_samples == params.n and not params.use_beam_search,
            thinking_enabled=thinking_enabled,
            multimodal=multimodal,
            max_output_tokens=min(params.max_tokens, room) if params.max_tokens is not None else room,
            lora=lora,
        )
        request.bad_words_ids = self._bad_words_ids(params.bad_words)
        self.request_counter += 1
        for index in range(1 if params.use_beam_search else params.num_samples):
            seq = self.new_sequence(request, index)
            if index == 0 and params.prompt_logprobs is not None:
                self._prompt_logprobs.start(seq)
            if grammar is not None:
                self._guided.add(seq, grammar, thinking_enabled)
            self.scheduler.add(seq)
        if params.use_beam_search:
            self._beams.start(
                request.seqs[0], params.num_samples, self._stop_token_ids(params), request.max_output_tokens
            )
        return request

    def _check_lora(self, lora: LoRARequest | None) -> None:
        """An adapter must be a `LoRARequest` this engine can run (read now, so a bad one fails
        its request alone, before anything is queued)."""
        if lora is None:
            return
        if not isinstance(lora, LoRARequest):
            raise InvalidArgumentError(
                f"lora_request must be a LoRARequest or None, got {type(lora).__name__}"
            )
        if self.loras is None:
            raise InvalidArgumentError(
                f"lora_request {lora.lora_name!r} needs an engine built with enable_lora=True"
            )
        self.loras.check(lora)

    def new_sequence(self, request: EngineRequest, index: int) -> Sequence:
        """Sample `index` of `request`, seeded from the request's seed (or the engine's) and `index`."""
        params = request.params
        seed = (params.seed, index) if params.seed is not None else (self.seed, self.request_counter, index)
        seq = Sequence(
            seq_id=self.next_seq_id,
            request_id=request.request_id,
            sample_index=index,
            prompt_token_ids=request.prompt_token_ids,
            params=params,
            max_output_tokens=request.max_output_tokens,
            rng=np.random.default_rng(list(seed)),
            arrival_time=request.arrival_time,
            detokenizer=IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
            # beams take no text (their outputs decode the hypotheses), and a sequence reused for
            # another beam gets that beam's tokens: only plain samples detokenize, late when unread
            defer_text=not request.stream and not params.stop and not params.use_beam_search,
            extra_inputs=request.multimodal,
            lora=request.lora,
        )
        ranked = params.num_samples > params.n and not params.use_beam_search
        if ranked or params.logprobs is not None:
            seq.cumulative_logprob = 0.0  # best_of ranks the samples by it
        self.next_seq_id += 1
        request.seqs.append(seq)
        return seq

    def spawn_beam(self, parent: Sequence) -> Sequence:
        """A new sequence for a beam forked from `parent`, queued where the parent is."""
        request = self.requests[parent.request_id]
        child = self.new_sequence(request, len(request.seqs))
        child.first_scheduled_time = parent.first_scheduled_time
        self.scheduler.add_fork(child, parent)
        return child

    def _stop_token_ids(self, params: SamplingParams) -> frozenset[int]:
        """Tokens inside the vocabulary that end a sample: EOS (unless ignore_eos) and stop_token_ids."""
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        return frozenset(token for token in stops if token < self.limits.vocab_size)

    def _bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """Token sequences of each bad word, alone and after a space (how it appears mid-text)."""
        sequences: list[list[int]] = []
        for word in words:
            for variant in (word, " " + word.lstrip()):
                ids = self.tokenizer.encode(variant, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        return sequences
