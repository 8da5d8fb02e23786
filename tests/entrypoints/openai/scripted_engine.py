"""A scripted stand-in for `LLMEngine` (no model), for tests of the layers above the engine."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from fastdeploy.engine.prefix_cache_stats import PrefixCacheStats
from fastdeploy.engine.request import CompletionOutput, RequestMetrics, RequestOutput
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.processor import InputProcessor


class ScriptedEngine:
    """Adds one token per step to every request; `gate` (when set) must be open for a step to run."""

    def __init__(self, max_num_seqs: int = 4) -> None:
        self.config = SimpleNamespace(max_num_seqs=max_num_seqs, runner="generate")
        self.requests: dict[str, dict] = {}
        self.block_manager = SimpleNamespace(
            usage=lambda: len(self.requests) / 8, num_free_blocks=8, num_blocks=8
        )
        self.gate: threading.Event | None = None
        self.fail_next_step = False
        self.aborted: list[str] = []
        self.fault_isolation = SimpleNamespace(faults_in_step=[])
        self.tokenizer = None
        self.max_model_len = 64
        self.input_processor = InputProcessor(None, vocab_size=100, max_model_len=64)
        self.generation_defaults: dict = {}

    @property
    def scheduler(self):
        return SimpleNamespace(
            running=[SimpleNamespace(request_id=r) for r in self.requests],
            prefix_cache_stats=PrefixCacheStats(),
        )

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def add_request(self, request_id, prompt_token_ids, params, **_):
        if prompt_token_ids == [-1]:
            raise InvalidArgumentError("prompt token ids must be in [0, 100)")
        self.requests[request_id] = {"prompt": prompt_token_ids, "tokens": [], "max": params.max_tokens}

    def _output(self, request_id, finish_reason=None):
        state = self.requests[request_id]
        sample = CompletionOutput(
            0, 0, list(state["tokens"]), "x" * len(state["tokens"]), finish_reason=finish_reason
        )
        return RequestOutput(
            request_id,
            None,
            state["prompt"],
            sample,
            finish_reason is not None,
            RequestMetrics(arrival_time=0.0),
        )

    def abort_request(self, request_id):
        if request_id not in self.requests:
            return None
        self.aborted.append(request_id)
        output = self._output(request_id, "abort")
        del self.requests[request_id]
        return output

    def step(self):
        if self.gate is not None:
            assert self.gate.wait(30), "test never opened the gate"
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("simulated step failure")
        outputs = []
        for request_id, state in list(self.requests.items()):
            state["tokens"].append(len(state["tokens"]))
            done = len(state["tokens"]) >= state["max"]
            outputs.append(self._output(request_id, "length" if done else None))
            if done:
                del self.requests[request_id]
        return outputs
