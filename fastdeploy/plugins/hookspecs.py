"""Hook specifications: the only seams through which fastdeploy finds its components.

Who calls them: `fastdeploy.plugins.registry.PluginRegistry`, never the engine directly. The
registry is built once per process (on the first `LLM(...)`, server start or `fastdeploy env`)
from the `fastdeploy.plugins` entry-point group; each hook is called on every loaded plugin the
first time that kind of component is needed, and the answers are merged.

What they return: plain data. "Named" hooks return a mapping of names to classes (or template
strings); "ranked" hooks return a list of loader objects that carry `name` and `priority`.
Returning None or an empty mapping means "nothing to add".

Conflicts: for named hooks, two plugins registering the same name is a `PluginError` naming
both plugins and the name, unless the two entries declare different explicit priorities: a
class (or object) attribute `plugin_priority` (int, default 0). The higher priority wins and
the registry logs which plugin's entry replaced which. This is how a plugin deliberately
overrides a built-in (e.g. a faster `LlamaForCausalLM`): it sets `plugin_priority = 10`.
Equal priorities are never resolved silently. For ranked hooks, loaders are asked in
descending `priority`; two loaders with the same `name` are a `PluginError` naming both.

Built-in components are plugins too and register through the same entry-point group (entry
points of the `fastdeploy` distribution), so the plugin path runs on every `LLM()`.

Every class named below is importable from `fastdeploy.plugins.api`, the one module plugin
authors import from (docs/plugins.md documents it).
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT_NAME = "fastdeploy"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def fastdeploy_model_architectures() -> dict[str, type]:
    """Model classes by architecture name (named hook).

    Called by: `model_executor.model_loader.build_model`, when an `LLM` (or server) is built,
    after the weight loader has read the checkpoint's config.
    Names: the first entry of `architectures` in the checkpoint's config.json (e.g.
    "LlamaForCausalLM", "GPT2LMHeadModel"); GGUF files are mapped to such names by their loader.
    Returns: {name: class}; the class is a `CausalLM` subclass built as
    `cls(config: ModelConfig, backend: Backend, max_positions: int)`, then `load_weights` once.
    It must compute only through the backend's ops so it runs on every device.
    """


@hookspec
def fastdeploy_weight_loaders() -> list[Any]:
    """Checkpoint readers (ranked hook): `WeightLoader` instances.

    Called by: `model_executor.model_loader.inspect_checkpoint`, when a model is loaded.
    Returns: a list of loaders. They are asked in descending `priority`; the first whose
    `can_load(path)` is true reads the config (as a config.json-style dict) and the tensors
    (under transformers' names). A plugin that needs to translate a format the built-in
    safetensors loader also accepts gives its loader a higher priority and a narrow `can_load`.
    Conflicts: two loaders with the same `name` are a `PluginError`.
    """


@hookspec
def fastdeploy_tokenizer_loaders() -> list[Any]:
    """Tokenizer factories (ranked hook): `TokenizerLoader` instances.

    Called by: the engine, when a model is loaded (for `tokenizer=` or the model path).
    Returns: a list of loaders, asked in descending `priority`; the first whose `can_load(path)`
    is true builds the `Tokenizer`. Conflicts: two loaders with the same `name` are an error.
    """


@hookspec
def fastdeploy_chat_templates() -> dict[str, str]:
    """Jinja chat templates by architecture name (named hook).

    Called by: the input layer, when a model's tokenizer files carry no chat template of their
    own (a checkpoint's `tokenizer_config.json` / `chat_template.jinja` / GGUF metadata always
    win, and so does `chat_template=` given by the user).
    Returns: {architecture name: template source}, rendered as Hugging Face renders templates
    (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`).
    """


@hookspec
def fastdeploy_multimodal_processors() -> dict[str, Any]:
    """Multimodal processor factories by architecture name (named hook).

    Called by: the engine, when it loads a model whose class sets `supports_multimodal = True`
    (e.g. "Ernie4_5_VLMoeForConditionalGeneration").
    Returns: {architecture name: factory}; `factory(tokenizer, model_config, options)` builds the
    processor once per engine, where `options` is a `fastdeploy.plugins.api.ProcessorOptions`
    (`limit_mm_per_prompt`, `mm_processor_kwargs`, the `MediaPolicy`). The processor's
    `process(token_ids, images, videos, mm_processor_kwargs, labels=...)` turns one request's
    prompt (placeholders not yet expanded) and media into a `MultiModalPrompt`, raising
    `MediaError` (an `InvalidArgumentError`) naming the bad part (`labels` gives each item's name,
    e.g. "message 0 content part 1"). The model receives that object per sequence as
    its extra inputs (see docs/plugins.md, "A vision-language model").
    """


@hookspec
def fastdeploy_reasoning_parsers() -> dict[str, type]:
    """Reasoning parser classes by the name users pass as `reasoning_parser=` (named hook).

    Called by: the engine when an `LLM` or server is built with `reasoning_parser=name`; an
    unknown name is an error listing the registered ones.
    Returns: {name: class}; the class subclasses `ReasoningParser`, is built once per engine
    with the model's tokenizer, and splits each output's text into `reasoning_content` and the
    answer.
    """


@hookspec
def fastdeploy_tool_call_parsers() -> dict[str, type]:
    """Tool-call parser classes by name (named hook).

    Called by: the engine when an `LLM` or server is built with `tool_call_parser=name`
    (`--tool-call-parser name`); an unknown name is an error listing the registered ones.
    Returns: {name: class}; the class subclasses `ToolCallParser` (fastdeploy.plugins.api), is
    built with the model's tokenizer for chat requests whose `tool_choice` is "auto", and reads
    the function calls (name and JSON arguments) out of the answer text, whole or streamed.
    """


@hookspec
def fastdeploy_device_backends() -> dict[str, type]:
    """Device backend classes by device name (named hook).

    Called by: `backends.selection` when an `LLM` or server is built (to resolve `device=`,
    `FD_DEVICE` or `--device`), and by `fastdeploy env` to list them.
    Returns: {device name: class}; the class subclasses `Backend`.
    Its classmethod `unavailable_reason()` says (without building anything heavy) why it cannot
    run on this machine, or None; `device="auto"` picks the available backend with the highest
    `auto_priority`. Registering a backend that is not implemented yet (a stub) is allowed: its
    `unavailable_reason()` explains that, and asking for it fails at `LLM` construction.
    """


@hookspec
def fastdeploy_communicators() -> dict[str, type]:
    """Collective-communication runtimes by name (named hook).

    Called by: `fastdeploy.executor` (rank processes) when a model runs on more than one rank
    (`tensor_parallel_size` or `pipeline_parallel_size` above 1), in every rank process, and by
    the engine beforehand to check the runtime is installed.
    Names: what a backend's `communicator` class attribute (or `FD_COMMUNICATOR`) asks for;
    built in: "paddle" (paddle.distributed: gloo on the CPU, NCCL on GPUs) and "torch"
    (torch.distributed). A device plugin registers its own (e.g. HCCL for Ascend NPUs).
    Returns: {name: class}; the class subclasses
    `fastdeploy.parallel.communicator.Communicator`, is built as `cls(backend, rendezvous)`
    and reports a missing runtime through its classmethod `unavailable_reason()`.
    """


@hookspec
def fastdeploy_kv_transports() -> dict[str, type]:
    """KV-block transports of prefill/decode disaggregation by name (named hook).

    Called by: the OpenAI server (`fastdeploy serve --splitwise-role prefill|decode`) at start-up.
    Names: what `--kv-transport` asks for; built in: "zmq" (ZeroMQ over TCP). A device plugin
    registers its own (RDMA, NVLink, HCCL).
    Returns: {name: class}; the class subclasses `fastdeploy.parallel.kv_transfer.KVTransport`
    and is built as `cls()`: `serve(host, port, receiver)` on a decode instance,
    `send(address, offer, arrays, timeout)` on a prefill instance (docs/plugins.md).
    """
