"""The engine options: `LLM(...)`'s keywords and the engine flags of `fastdeploy generate / chat /
serve`, each written once, with its default, help text and flag.

`EngineArgs` lists them; `fastdeploy.config.EngineConfig` is the same fields validated (and
derived values resolved); `add_engine_arguments` / `add_option_flags` generate the flags from them, `LLM` its
signature and docstring table, and README's table is checked against `options_table()`. This
module imports nothing of fastdeploy, so the command line starts without the engine's imports.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, fields
from typing import Any

#: where requests that leave sampling settings unset take them from (see engine/generation_defaults.py)
GENERATION_CONFIG_MODES = ("auto", "none")

#: what a server does in prefill/decode disaggregation (FastDeploy's `--splitwise-role`)
SPLITWISE_ROLES = ("mixed", "prefill", "decode")
#: what an engine does with a prompt: generate tokens after it, or pool its hidden states into an
#: embedding (`engine/pooling_engine.py`)
RUNNERS = ("generate", "pooling")

#: where an option's command-line flag goes: every engine-building subcommand (`generate`,
#: `chat`, `serve`), or the server only
FLAG_GROUPS = ("engine", "server")


def option(
    default: Any, help: str, *, flag: dict[str, Any] | None = None, group: str | None = "engine"
) -> Any:
    """An `EngineArgs` field: its default, the help text the CLI, `LLM`'s docs and README's
    table show, and its command-line flag (`flag`: argparse options besides the default and the
    help; `group` None: no flag, the option is set another way)."""
    if group is not None and group not in FLAG_GROUPS:
        raise ValueError(f"unknown flag group {group!r}")
    return field(default=default, metadata={"help": help, "flag": flag or {}, "group": group})


def _json_object(text: str) -> dict[str, Any]:
    """A flag value that must be a JSON object (argparse reports the error as a usage error)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


@dataclass
class EngineArgs:
    """The engine options with their defaults (`option`); `EngineConfig` validates them.

    None means "derive it": `max_model_len` from the model, `max_num_batched_tokens` from
    `max_model_len`, the KV-cache size from free memory, `device` and `cpu_threads` from the
    environment (`FD_DEVICE`, `FD_CPU_THREADS`).
    """

    model: str | None = option(
        None,
        "a local directory (config.json + safetensors + tokenizer files), a .gguf file, an embedded "
        "model's name (default: the embedded SmolLM2-135M-Instruct) or a hub id: org/name, or "
        "org/name:QUANT for one GGUF of the repository (FD_MODEL_SOURCE picks the hub)",
        group=None,  # the positional MODEL of the commands (and --model), added with them
    )
    revision: str | None = option(
        None,
        "branch, tag or commit of a hub model (default: the repository's main branch; master on "
        "ModelScope and AIStudio)",
    )
    gguf_file: str | None = option(
        None, "the GGUF to load from a model directory or hub repository holding several (or org/name:QUANT)"
    )
    tokenizer: str | None = option(None, "tokenizer directory or model name (default: the model's own)")
    runner: str = option(
        "generate",
        "generate: complete prompts (generate, chat); pooling: embed them (embed, /v1/embeddings), "
        "one prompt pass whose hidden states are pooled, no sampling",
        flag={"choices": RUNNERS},
    )
    pooler_config: dict[str, Any] | None = option(
        None,
        'runner pooling: settings over the checkpoint\'s, JSON, e.g. \'{"pooling_type": "LAST", '
        '"normalize": true, "is_matryoshka": true}\' (see docs/embeddings.md)',
        flag={"type": _json_object},
    )
    device: str | None = option(None, "backend name or 'auto' (default: FD_DEVICE or auto)")
    max_model_len: int | None = option(
        None, "prompt + output tokens per request (default: the model's context length)", flag={"type": int}
    )
    max_num_seqs: int = option(64, "most sequences running at once", flag={"type": int})
    max_num_batched_tokens: int | None = option(
        None,
        "token budget of one forward pass; longer prompts are prefilled in chunks "
        "(default: max(max_model_len, 2048); 2048 where a sliding window binds)",
        flag={"type": int},
    )
    block_size: int = option(64, "tokens per KV-cache block (a power of two)", flag={"type": int})
    tensor_parallel_size: int = option(1, "ranks a layer is split over", flag={"type": int})
    pipeline_parallel_size: int = option(1, "pipeline stages the layers are split into", flag={"type": int})
    ips: str | list[str] | None = option(
        None, "comma list of the hosts of a multi-host run (run the same command on each)"
    )
    engine_worker_queue_port: int | str | None = option(
        None,
        "port the master engine listens on for the ranks of a multi-host run (default 8002)",
        flag={"type": int},
    )
    distributed_executor_backend: str | None = option(
        None,
        "uni: the model in the engine process (one rank); mp: in rank processes (default above one rank)",
        flag={"choices": ["uni", "mp"]},
    )
    enforce_eager: bool = option(
        False,
        "run every step eagerly: no CUDA graphs for decode steps (accelerator backends)",
        flag={"action": "store_true"},
    )
    async_scheduling: bool | None = option(
        None,
        "launch each step before the previous step's tokens are read (default: on where the "
        "backend runs passes beside the host, the cuda backend)",
        flag={"action": argparse.BooleanOptionalAction},
    )
    seed: int = option(0, "seed of the requests that set none (an int in [0, 2**63))", flag={"type": int})
    kv_cache_memory: int | None = option(None, "bytes for the KV cache", flag={"type": int})
    gpu_memory_utilization: float | None = option(
        None,
        "fraction of free device memory (after weights) the KV cache may take (default: the "
        "backend's, 0.5 on the cpu backend)",
        flag={"type": float},
    )
    num_gpu_blocks_override: int | None = option(
        None, "KV-cache blocks (overrides the sizing)", flag={"type": int}
    )
    cpu_threads: int | None = option(
        None,
        "threads of the cpu backend's kernels (default: FD_CPU_THREADS, else the usable cores)",
        flag={"type": int},
    )
    chat_template: str | None = option(None, "template string or file")
    reasoning_parser: str | None = option(
        None,
        "split replies into reasoning_content and content: ernie-45-vl, ernie-x1, gpt-oss, qwen3 or a plugin's",
    )
    max_logprobs: int = option(
        20,
        "most logprobs / prompt_logprobs a request may ask for (-1: vocabulary size; default 20)",
        flag={"type": int},
    )
    speculative_config: Any = option(
        None,
        'speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
        "(see docs/decoding.md)",
    )
    guided_decoding_backend: str = option(
        "auto",
        "grammar library for guided decoding / structured outputs (default auto: llguidance)",
        flag={"choices": ["auto", "llguidance", "xgrammar", "off"]},
    )
    guided_decoding_disable_any_whitespace: bool = option(
        False, "guided JSON outputs without optional whitespace between tokens", flag={"action": "store_true"}
    )
    tool_call_parser: str | None = option(
        None, "read tool calls of chat requests with tools: hermes, qwen3, ernie-x1, openai or a plugin's"
    )
    limit_mm_per_prompt: dict[str, int] | None = option(
        None,
        'most images/videos per request, JSON, e.g. \'{"image": 4, "video": 1}\' (multimodal models)',
        flag={"type": _json_object},
    )
    mm_processor_kwargs: dict[str, Any] | None = option(
        None,
        "multimodal processor defaults, JSON, e.g. '{\"image_max_pixels\": 802816}'",
        flag={"type": _json_object},
    )
    enable_prefix_caching: bool = option(
        True,
        "reuse the KV cache of shared prompt prefixes (default on; --no-enable-prefix-caching turns it off)",
        flag={"action": argparse.BooleanOptionalAction},
    )
    kv_cache_dtype: str = option(
        "auto", "KV-cache element type: auto (the compute dtype), float32, float16, bfloat16 or int8"
    )
    generation_config: str = option(
        "auto",
        "auto: settings a request leaves unset come from the model's generation_config.json "
        "(temperature, top_p, top_k, min_p, penalties, max_new_tokens); none: SamplingParams' defaults",
        flag={"choices": GENERATION_CONFIG_MODES},
    )
    enable_lora: bool = option(
        False,
        "serve LoRA adapters (PEFT directories, llama.cpp GGUF LoRA files) on top of the model, chosen per "
        "request (docs/lora.md)",
        flag={"action": "store_true"},
    )
    max_loras: int = option(
        4,
        "most LoRA adapters resident at once (one forward pass mixes at most this many)",
        flag={"type": int},
    )
    max_lora_rank: int = option(16, "largest LoRA rank an adapter may have", flag={"type": int})
    max_cpu_loras: int | None = option(
        None,
        "adapters kept read in host memory, least recently used evicted first (default: max_loras); "
        "an evicted adapter is read again from its path when asked for",
        flag={"type": int},
    )
    quantization: str | None = option(
        None, "weight-only quantisation of a float checkpoint: wint8, wint4 or fp8 (block-wise e4m3; cuda)"
    )
    quantization_group_size: int = option(
        128,
        "inputs per scale of wint4 on the cuda backend: 64 or 128 (must divide every layer's input width)",
        flag={"type": int},
    )
    #: the server's --data-parallel-size; offline, `LLM` runs one replica
    data_parallel_size: int = option(
        1,
        "engine replicas behind this endpoint; each request goes to the least-loaded one (default 1)",
        flag={"type": int},
        group="server",
    )
    splitwise_role: str = option(
        "mixed",
        "prefill/decode disaggregation: 'prefill' computes prompts and sends their KV blocks to the decode "
        "instance `fastdeploy router` pairs it with, 'decode' receives them and generates, 'mixed' does both",
        flag={"choices": SPLITWISE_ROLES},
        group="server",
    )
    kv_transport: str = option(
        "zmq", "how KV blocks move between prefill and decode instances: zmq or a plugin's", group="server"
    )
    kv_transfer_port: int = option(
        0,
        "decode instances: the port KV blocks arrive on (default 0: a free port, shown at /v1/disaggregation)",
        flag={"type": int},
        group="server",
    )
    kv_transfer_timeout: float = option(
        30.0,
        "seconds one KV transfer may take before its request fails; received blocks no request took "
        "are let go after as long",
        flag={"type": float},
        group="server",
    )
    #: the server's --responses-store-size; offline, `LLM` stores no responses
    responses_store_size: int = option(
        1024,
        "responses the server keeps for previous_response_id and GET /v1/responses/{id}, the least "
        "recently used forgotten first (0: none; server only)",
        flag={"type": int},
        group="server",
    )
    dtype: str = option(
        "auto",
        "weights / activations dtype: 'auto' (default: float32 on the cpu backend, bfloat16 on a GPU "
        "that has it), 'float32', 'bfloat16' or 'float16'; on the cpu backend 'bfloat16' multiplies "
        "the linear layers in bfloat16 (half the weight memory, not exact) and keeps the rest float32",
    )
    #: the server sets these from its --allowed-local-media-path and --disable-media-url-fetch,
    #: whose defaults are the safe opposite of these (requests come from the network)
    allowed_local_media_path: bool | str | None = option(
        True,
        "local media files chat requests may name: True anywhere (None too), False or '' none, or a directory",
        group=None,
    )
    allow_media_url_fetch: bool = option(
        True, "whether chat requests may name http(s) media URLs", group=None
    )
    allowed_media_domains: list[str] | None = option(
        None,
        "the only hosts media URLs may name, e.g. ['a.com', 'b.org'] (None: any host that passes the "
        "address rules; docs/multimodal.md, 'Media URLs')",
        group=None,
    )
    media_allow_private_networks: bool = option(
        False,
        "fetch media URLs from loopback, private, link-local and carrier-grade NAT addresses too "
        "(on-premise deployments)",
        group=None,
    )
    media_url_no_redirects: bool = option(
        False,
        "refuse every redirect a media URL answers with (default: up to 3, each hop checked)",
        group=None,
    )
    data_parallel_rank: int = option(
        0,
        "this replica's index among the server's data-parallel replicas (its ranks take the devices "
        "after those of the replicas before it)",
        group=None,
    )
    dist_init_timeout: float | None = option(
        None,
        "seconds a rank may take to reach the engine and the other ranks (default: FD_DIST_INIT_TIMEOUT, else 120)",
        group=None,
    )


def option_fields() -> tuple[Any, ...]:
    """The engine options, in the order the CLI and the docs list them."""
    return fields(EngineArgs)


def options_table() -> str:
    """The engine options as a Markdown table (keyword, default, meaning): `LLM`'s docstring and
    README's table, which a test keeps equal to it."""
    rows = ["| keyword | default | meaning |", "|---|---|---|"]
    for item in option_fields():
        help_text = item.metadata["help"].replace("|", "\\|")
        rows.append(f"| `{item.name}` | `{item.default!r}` | {help_text} |")
    return "\n".join(rows)


def flag_name(name: str) -> str:
    """`max_num_seqs` -> `--max-num-seqs`."""
    return "--" + name.replace("_", "-")


def add_option_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, group: str) -> None:
    """The flags of the options in `group` (see `fastdeploy.engine_args.FLAG_GROUPS`), in field order."""
    for item in option_fields():
        if item.metadata["group"] == group:
            parser.add_argument(
                flag_name(item.name),
                default=item.default,
                help=item.metadata["help"],
                **item.metadata["flag"],
            )


def add_engine_arguments(parser: argparse.ArgumentParser, model_positional: bool = True) -> None:
    """Flags named as vLLM / FastDeploy name them (`--max-model-len`, `--device`, ...)."""
    if model_positional:
        parser.add_argument(
            "model", nargs="?", default=None, help="model path or name (default: embedded SmolLM2)"
        )
    parser.add_argument("--model", dest="model_flag", default=None, help="same as the positional MODEL")
    add_option_flags(parser, "engine")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`LLM(...)` keyword arguments (engine options) from parsed engine flags."""
    options = {
        item.name: getattr(args, item.name) for item in option_fields() if item.metadata["group"] == "engine"
    }
    return {"model": args.model_flag or getattr(args, "model", None), **options}
