"""Engine flags shared by every subcommand that builds an engine (`generate`, `chat`, `serve`)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_engine_arguments(parser: argparse.ArgumentParser, model_positional: bool = True) -> None:
    """Flags named as vLLM / FastDeploy name them (`--max-model-len`, `--device`, ...)."""
    if model_positional:
        parser.add_argument(
            "model", nargs="?", default=None, help="model path or name (default: embedded SmolLM2)"
        )
    parser.add_argument("--model", dest="model_flag", default=None, help="same as the positional MODEL")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--device", default=None, help="backend name or 'auto' (default: FD_DEVICE or auto)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="ranks a layer is split over")
    parser.add_argument(
        "--pipeline-parallel-size", type=int, default=1, help="pipeline stages the layers are split into"
    )
    parser.add_argument(
        "--ips",
        default=None,
        help="comma list of the hosts of a multi-host run (run the same command on each)",
    )
    parser.add_argument(
        "--engine-worker-queue-port",
        type=int,
        default=None,
        help="port the master engine listens on for the ranks of a multi-host run (default 8002)",
    )
    parser.add_argument(
        "--distributed-executor-backend",
        choices=["uni", "mp"],
        default=None,
        help="uni: the model in the engine process (one rank); mp: in rank processes (default above one rank)",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run every step eagerly: no CUDA graphs for decode steps (accelerator backends)",
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="launch each step before the previous step's tokens are read (default: on where the "
        "backend runs passes beside the host, the cuda backend)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-memory", type=int, default=None, help="bytes for the KV cache")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    parser.add_argument("--cpu-threads", type=int, default=None)
    parser.add_argument("--chat-template", default=None, help="template string or file")
    parser.add_argument("--reasoning-parser", default=None)
    parser.add_argument(
        "--max-logprobs",
        type=int,
        default=20,
        help="most logprobs / prompt_logprobs a request may ask for (-1: vocabulary size; default 20)",
    )
    parser.add_argument(
        "--speculative-config",
        default=None,
        help='speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
        "(see docs/decoding.md)",
    )
    parser.add_argument(
        "--guided-decoding-backend",
        default="auto",
        choices=["auto", "llguidance", "xgrammar", "off"],
        help="grammar library for guided decoding / structured outputs (default auto: llguidance)",
    )
    parser.add_argument(
        "--guided-decoding-disable-any-whitespace",
        action="store_true",
        help="guided JSON outputs without optional whitespace between tokens",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        help="read tool calls of chat requests with tools: hermes, qwen3, ernie-x1 or a plugin's",
    )
    parser.add_argument(
        "--limit-mm-per-prompt",
        type=_json_object,
        default=None,
        help='most images/videos per request, JSON, e.g. \'{"image": 4, "video": 1}\' (multimodal models)',
    )
    parser.add_argument(
        "--mm-processor-kwargs",
        type=_json_object,
        default=None,
        help="multimodal processor defaults, JSON, e.g. '{\"image_max_pixels\": 802816}'",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV cache of shared prompt prefixes (default on; --no-enable-prefix-caching turns it off)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="KV-cache element type: auto (the compute dtype), float32, float16, bfloat16 or int8",
    )
    parser.add_argument(
        "--generation-config",
        choices=("auto", "none"),
        default="auto",
        help="auto: settings a request leaves unset come from the model's generation_config.json "
        "(temperature, top_p, top_k, min_p, penalties, max_new_tokens); none: SamplingParams' defaults",
    )
    parser.add_argument(
        "--quantization", default=None, help="weight-only quantisation of a float checkpoint: wint8 or wint4"
    )


def _json_object(text: str) -> dict[str, Any]:
    """A flag value that must be a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`LLM(...)` keyword arguments from parsed engine flags."""
    return {
        "model": args.model_flag or getattr(args, "model", None),
        "tokenizer": args.tokenizer,
        "device": args.device,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "block_size": args.block_size,
        "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "ips": args.ips,
        "engine_worker_queue_port": args.engine_worker_queue_port,
        "distributed_executor_backend": args.distributed_executor_backend,
        "seed": args.seed,
        "enforce_eager": args.enforce_eager,
        "async_scheduling": args.async_scheduling,
        "kv_cache_memory": args.kv_cache_memory,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "num_gpu_blocks_override": args.num_gpu_blocks_override,
        "cpu_threads": args.cpu_threads,
        "chat_template": args.chat_template,
        "reasoning_parser": args.reasoning_parser,
        "guided_decoding_backend": args.guided_decoding_backend,
        "guided_decoding_disable_any_whitespace": args.guided_decoding_disable_any_whitespace,
        "tool_call_parser": args.tool_call_parser,
        "limit_mm_per_prompt": args.limit_mm_per_prompt,
        "mm_processor_kwargs": args.mm_processor_kwargs,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "generation_config": args.generation_config,
        "enable_prefix_caching": args.enable_prefix_caching,
        "max_logprobs": args.max_logprobs,
        "speculative_config": args.speculative_config,
    }
