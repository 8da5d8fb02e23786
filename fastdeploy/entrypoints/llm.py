"""`LLM`: offline inference with FastDeploy's API (`generate`, `chat`), and `embed` with the
pooling runner (`LLM(model, runner="pooling")`).

All prompts of a call are queued at once and the engine batches them continuously; outputs come
back in input order. A prompt that cannot be served (empty, too long, malformed) gets a
`RequestOutput` with `error_code`/`error_msg` while the others run.
"""

from __future__ import annotations

import inspect
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from fastdeploy.config import EngineConfig, check_data_parallel_size
from fastdeploy.engine.engine import error_output
from fastdeploy.engine.pooling_request import EmbeddingRequestOutput, PoolingParams, embedding_error_output
from fastdeploy.engine.request import INVALID_REQUEST, RequestOutput
from fastdeploy.engine.runners import build_engine
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine_args import option_fields, options_table
from fastdeploy.entrypoints.offline_tools import constrain_offline, fill_tool_calls, plan_offline
from fastdeploy.errors import EngineStoppedError, FastDeployError, InvalidArgumentError
from fastdeploy.executor.placement import is_master_host
from fastdeploy.executor.startup import serve_follower
from fastdeploy.input.chat_template import load_chat_template
from fastdeploy.input.conversation import with_tools
from fastdeploy.input.multimodal.parts import extract_media
from fastdeploy.input.processor import InputProcessor
from fastdeploy.input.prompts import PromptItem, normalize_prompts
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.lora import LoRARequest
from fastdeploy.plugins.registry import get_registry
from fastdeploy.tool_calling.request import parser_factory, template_messages

logger = get_logger(__name__)

#: FastDeploy engine arguments that configure parts this engine does not have (serving ports,
#: multi-process queues, warm-up); accepted so FastDeploy code runs unchanged, and logged.
_ACCEPTED_WITHOUT_EFFECT = frozenset(
    {
        "port",
        "metrics_port",
        "cache_queue_port",
        "pod_ips",
        "use_warmup",
        "enable_chunked_prefill",
        "kv_cache_ratio",
        "enable_mm",
        "trust_remote_code",
        "disable_log_stats",
    }
)


class LLM:
    """An offline engine over one model.

    `model` is a local directory (config.json + safetensors + tokenizer files), a `.gguf` file, the
    name of an embedded model, or a hub id (`org/name`, `org/name:QUANT`) downloaded into the hub's
    cache; None loads the embedded default, SmolLM2-135M-Instruct.
    """

    def __init__(self, model: str | None = None, **options: Any) -> None:
        """Load `model` and build its engine. `options` are the engine options (`EngineArgs`: the
        table below); FastDeploy arguments this engine does not need are accepted and logged.
        """
        option_names = {item.name for item in option_fields()}
        unknown = sorted(set(options) - option_names - _ACCEPTED_WITHOUT_EFFECT)
        if unknown:
            raise InvalidArgumentError(f"LLM() got unsupported argument(s): {', '.join(unknown)}")
        for name in sorted(set(options) - option_names):
            logger.info("LLM argument %s=%r has no effect in this engine", name, options.pop(name))
        data_parallel_size = options.get("data_parallel_size", 1)
        if data_parallel_size != 1:
            check_data_parallel_size(data_parallel_size)
            raise InvalidArgumentError(
                f"data_parallel_size={data_parallel_size}: replicas are served by `fastdeploy serve "
                "--data-parallel-size N`; offline, LLM runs one replica (use data_parallel_size=1)"
            )
        config = EngineConfig(model=model, **options)
        self._request_ids = itertools.count()
        #: one generate / chat at a time: the engine is stepped by its caller and is not thread-safe,
        #: so a call from a second thread waits for the first to finish
        self._calls = threading.Lock()
        self._shut_down = False
        self._is_master = is_master_host(config)
        #: on a host other than the master: the exit status of this host's ranks
        self.follower_status: int | None = None
        if not self._is_master:
            # another host's engine drives this host's ranks; return once it has shut them down
            self.follower_status = serve_follower(config, get_registry())
            return
        #: an `LLMEngine`, or a `PoolingEngine` with runner="pooling"
        self.llm_engine = build_engine(config)
        #: how this LLM's prompts and conversations become the engine's inputs
        self.input_processor: InputProcessor = self.llm_engine.input_processor

    def _check_master(self) -> bool:
        """Whether this process is the master of a multi-host run (always, on one host): only the
        master generates; on the other hosts `LLM()` returns when the master has finished."""
        return self._is_master

    def shutdown(self) -> None:
        """Stop the engine's rank processes now (they also stop when this process exits); later
        calls to `generate` / `chat` raise `EngineStoppedError`."""
        if self._is_master:
            with self._calls:
                self._shut_down = True
                self.llm_engine.shutdown()

    def get_tokenizer(self) -> Any:
        return self.input_processor.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What a call without `sampling_params` samples with: SamplingParams' defaults, overridden
        by the checkpoint's generation_config.json (unless `generation_config="none"`)."""
        return SamplingParams(**self.llm_engine.generation_defaults)

    # --- public API -------------------------------------------------------------------------
    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (str, token ids or {"prompt"/"prompt_token_ids": ...} dicts).

        `lora_request` (with `enable_lora=True`): the LoRA adapter of every prompt, or a list with
        one per prompt (None: the base model); see docs/lora.md."""
        arrival = time.time()
        self._require_runner("generate", "generate")
        items = normalize_prompts(prompts)
        params = self._params_per_prompt(sampling_params, len(items))
        return self._run(items, params, use_tqdm, arrival, _adapters_per_prompt(lora_request, len(items)))

    def embed(
        self,
        prompts: Any,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        prompt_name: str | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """Embed each prompt (str, token ids, or a list of either) with the pooling runner;
        `output.outputs.embedding` is the vector (docs/embeddings.md).

        `prompt_name` puts one of the model's named prompts (config_sentence_transformers.json,
        e.g. an instruction for queries) before each text prompt, as sentence-transformers'
        `encode(prompt_name=...)` does; unset, the model's default prompt if it names one. A
        checkpoint saved by sentence-transformers 6 with a chat template embeds each text as a
        chat message, the prompt as its system message (input/embedding_text.py).
        Token-id prompts are embedded as given.
        """
        arrival = time.time()
        self._require_runner("pooling", "embed")
        pooling = self.llm_engine.pooling
        prompt = pooling.prompt(prompt_name)
        items = normalize_prompts(prompts)
        if pooling_params is None:
            params = [PoolingParams() for _ in items]
        else:
            params = _one_per_prompt(pooling_params, PoolingParams, len(items), "pooling_params")

        def inputs(item: PromptItem) -> tuple[list[int], None]:
            return self.input_processor.embedding_token_ids(item, prompt, pooling.rendering), None

        return self._run(items, params, use_tqdm, arrival, inputs=inputs, rejected=embedding_error_output)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Reply to one conversation (a list of messages) or a batch of them, via the chat template.

        `tools` (OpenAI function tools) reach the template; with `tool_choice` "required" or a
        named function, or "auto" and a `tool_call_parser`, the calls land in
        `CompletionOutput.tool_calls` (see docs/tool_calling.md). `lora_request` as in `generate`
        (one per conversation when a list).
        """
        arrival = time.time()
        self._require_runner("generate", "chat")
        if not isinstance(messages, list) or not messages:
            raise InvalidArgumentError("messages must be a non-empty list of messages or of conversations")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise InvalidArgumentError(
                f"chat_template_kwargs must be a dict, got {type(chat_template_kwargs).__name__}"
            )
        conversations = messages if all(isinstance(m, list) for m in messages) else [messages]
        template = load_chat_template(chat_template) if chat_template is not None else None
        parser = parser_factory(self.llm_engine.tool_parser_class, self.input_processor.tokenizer)
        plan, tool_error = plan_offline(parser, tools, tool_choice)
        template_kwargs = with_tools(chat_template_kwargs, plan.tools)
        items = [
            self._render(
                template_messages(conversation), index, template, add_generation_prompt, template_kwargs
            )
            for index, conversation in enumerate(conversations)
        ]
        params = self._params_per_prompt(sampling_params, len(items))
        for index, item in enumerate(items):
            params[index], error = constrain_offline(params[index], plan)
            item.error = item.error or tool_error or error
        outputs = self._run(items, params, use_tqdm, arrival, _adapters_per_prompt(lora_request, len(items)))
        fill_tool_calls(outputs, plan)
        return outputs

    # --- internals --------------------------------------------------------------------------
    def _require_runner(self, runner: str, call: str) -> None:
        """Refuse a call the engine's runner does not serve, naming the one that does."""
        actual = self.llm_engine.config.runner
        if actual == runner:
            return
        instead = "embed()" if actual == "pooling" else "generate() or chat()"
        raise InvalidArgumentError(
            f"LLM.{call}() needs runner={runner!r}, but this LLM was built with runner={actual!r}: "
            f"use {instead}, or build LLM(model, runner={runner!r})"
        )

    def _render(
        self,
        conversation: Any,
        index: int,
        template: str | None,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any],
    ) -> PromptItem:
        try:
            media = extract_media(conversation)
            item = self.input_processor.render(
                conversation,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                template_kwargs=template_kwargs,
            )
        except InvalidArgumentError as exc:
            return PromptItem(error=f"conversation {index}: {exc}")
        if media:
            # re-encoded by the multimodal processor, which knows the placeholder tokens
            item.media, item.token_ids = media, None
        return item

    def _params_per_prompt(
        self, sampling_params: SamplingParams | Sequence[SamplingParams] | None, count: int
    ) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params() for _ in range(count)]
        return _one_per_prompt(sampling_params, SamplingParams, count, "sampling_params")

    def _run(
        self,
        items: list[PromptItem],
        params: list[Any],
        use_tqdm: bool,
        arrival: float,
        adapters: list[LoRARequest | None] | None = None,
        inputs: Callable[[PromptItem], tuple[list[int], Any]] | None = None,
        rejected: Callable[..., Any] = error_output,
    ) -> list[Any]:
        """Queue every prompt (with its LoRA adapter, if any; `inputs` makes its token ids, by
        default the generation path's) and step until all finish; a prompt refused before
        queueing gets `rejected`'s output."""
        if not isinstance(use_tqdm, bool):
            raise InvalidArgumentError(f"use_tqdm must be a bool, got {use_tqdm!r}")
        with self._calls:
            return self._run_alone(
                items,
                params,
                use_tqdm,
                arrival,
                adapters or [None] * len(items),
                inputs or self.input_processor.prompt_inputs,
                rejected,
            )

    def _run_alone(
        self,
        items: list[PromptItem],
        params: list[Any],
        use_tqdm: bool,
        arrival: float,
        adapters: list[LoRARequest | None],
        inputs: Callable[[PromptItem], tuple[list[int], Any]],
        rejected: Callable[..., Any],
    ) -> list[Any]:
        if self._shut_down:
            raise EngineStoppedError("this LLM has been shut down (LLM.shutdown()); build a new one")
        engine = self.llm_engine
        results: dict[str, Any] = {}
        order: list[str] = []
        try:
            for item, item_params, adapter in zip(items, params, adapters, strict=True):
                request_id = str(next(self._request_ids))
                order.append(request_id)
                if item.error is None:
                    try:
                        token_ids, multimodal = inputs(item)
                        engine.add_request(
                            request_id,
                            token_ids,
                            item_params,
                            prompt=item.text,
                            arrival_time=arrival,
                            thinking_enabled=item.thinking_enabled,
                            multimodal=multimodal,
                            lora_request=adapter,
                        )
                        continue
                    except FastDeployError as exc:
                        item.error = str(exc)
                logger.warning("request %s rejected: %s", request_id, item.error)
                results[request_id] = rejected(request_id, item.text, item.error, arrival, INVALID_REQUEST)
        except BaseException:
            # a bug or an interrupt while queueing: the requests queued so far must not run on
            # into the next call (their caller is gone)
            for request_id in order:
                engine.abort_request(request_id)
            raise
        self._drive(results, len(order), use_tqdm)
        return [results[request_id] for request_id in order]

    def _drive(self, results: dict[str, Any], total: int, use_tqdm: bool) -> None:
        """Step the engine until every queued request has finished."""
        engine = self.llm_engine
        bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True, disable=not use_tqdm)
        bar.update(len(results))
        start = time.perf_counter()
        prompt_tokens = generated_tokens = 0
        try:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    results[output.request_id] = output
                    prompt_tokens += len(output.prompt_token_ids)
                    generated_tokens += sum(len(sample.token_ids) for sample in output.outputs)
                    bar.update(1)
                    elapsed = time.perf_counter() - start
                    bar.set_postfix_str(
                        f"input: {prompt_tokens / elapsed:.1f} toks/s, output: {generated_tokens / elapsed:.1f} toks/s"
                    )
        finally:
            bar.close()


def _one_per_prompt(value: Any, kind: type, count: int, name: str, none_allowed: bool = False) -> list[Any]:
    """`value` (one `kind`, or a list of one per prompt) as one per prompt; with `none_allowed`
    (a `lora_request`: None is the base model) None stands for itself, alone or in the list."""

    def accepted(item: Any) -> bool:
        return isinstance(item, kind) or (none_allowed and item is None)

    if accepted(value):
        return [value] * count
    if isinstance(value, (list, tuple)) and all(accepted(item) for item in value):
        entries = f"{name} entries" if none_allowed else name
        if len(value) != count:
            raise InvalidArgumentError(
                f"got {len(value)} {entries} for {count} prompts; pass one, or one per prompt"
            )
        return list(value)
    also = " (None for the base model) or None" if none_allowed else ""
    raise InvalidArgumentError(
        f"{name} must be a {kind.__name__} or a list of them{also}, got {type(value).__name__}"
    )


def _adapters_per_prompt(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, count: int
) -> list[LoRARequest | None]:
    """One adapter (or None: the base model) per prompt from a call's `lora_request`."""
    return _one_per_prompt(lora_request, LoRARequest, count, "lora_request", none_allowed=True)


def _document_options() -> None:
    """`LLM(...)`'s signature and docstring list the engine options, from `EngineConfig`."""
    init = LLM.__init__
    signature = inspect.signature(init)
    keywords = [
        inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=item.default)
        for item in option_fields()
        if item.name != "model"
    ]
    self_and_model = list(signature.parameters.values())[:2]
    accepted = inspect.Parameter("fastdeploy_arguments", inspect.Parameter.VAR_KEYWORD)
    init.__signature__ = signature.replace(parameters=[*self_and_model, *keywords, accepted])
    init.__doc__ = (init.__doc__ or "") + "\n" + options_table() + "\n"


_document_options()
