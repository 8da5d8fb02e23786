"""Flags of `fastdeploy serve` and `python -m fastdeploy.entrypoints.openai.api_server` (the same set).

Engine flags come from `fastdeploy.engine_args` (generated from the engine options, `EngineArgs`);
this module adds the server's own, and accepts the vLLM / Ascend launch flags users paste from
existing deployments (`--num-scheduler-steps`, `--trust-remote-code`, ...): they have no effect
in this engine and are logged as such rather than rejected.
"""

from __future__ import annotations

import argparse
from typing import Any

from fastdeploy.engine_args import add_engine_arguments, add_option_flags
from fastdeploy.entrypoints.openai.http_guard import DEFAULT_MAX_REQUEST_BYTES

DEFAULT_PORT = 8000
#: requests that may wait beyond the --max-num-seqs running ones before the server answers 503
DEFAULT_MAX_WAITING = 1024
#: seconds a client may take to send a request's head, and between two reads of its body (nginx's
#: client_header_timeout and client_body_timeout)
DEFAULT_READ_TIMEOUT = 60.0
_SIZE_SUFFIXES = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}

#: flag -> argparse options, for launch flags accepted without effect
_NO_EFFECT_FLAGS: dict[str, dict[str, Any]] = {
    "--num-scheduler-steps": {"type": int, "help": "accepted for vLLM compatibility; one step per schedule"},
    "--multi-step-stream-outputs": {"default": None, "help": "accepted for vLLM compatibility"},
    "--trust-remote-code": {
        "action": "store_true",
        "help": "accepted; no model code is ever downloaded or run",
    },
    "--disable-async-output-proc": {"action": "store_true", "help": "accepted for vLLM compatibility"},
    "--disable-log-requests": {"action": "store_true", "help": "accepted for vLLM compatibility"},
    "--disable-log-stats": {"action": "store_true", "help": "accepted for vLLM compatibility"},
}


def byte_size(text: str) -> int:
    """A size in bytes from '16777216', '16M', '512k' or '1G' (binary units), for argparse."""
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    suffix = value[-1:] if value[-1:] in _SIZE_SUFFIXES else ""
    number = value[: len(value) - len(suffix)]
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"expected a size such as 16777216, 512K or 16M, got {text!r}")
    return int(number) * _SIZE_SUFFIXES[suffix]


def _has_flag(parser: argparse.ArgumentParser, flag: str) -> bool:
    return any(flag in action.option_strings for action in parser._actions)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Engine flags plus the server's; flags another module already added are left as they are."""
    add_engine_arguments(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all interfaces)")
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})")
    server.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="also serve /metrics on this port (default: main port only)",
    )
    server.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes (default: none)"
    )
    server.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) clients use in 'model' (default: the MODEL argument as given)",
    )
    server.add_argument(
        "--metrics-require-api-key",
        action="store_true",
        help="/metrics needs the --api-key too (default: /metrics is open, as Prometheus scrapers expect)",
    )
    server.add_argument(
        "--max-waiting-requests",
        "--max-waiting",
        dest="max_waiting",
        type=int,
        default=DEFAULT_MAX_WAITING,
        help="requests that may queue beyond --max-num-seqs before new ones get 503 with Retry-After "
        f"(default {DEFAULT_MAX_WAITING})",
    )
    server.add_argument(
        "--max-request-size",
        type=byte_size,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="largest request body in bytes (K/M/G suffixes allowed); larger ones get 413 before "
        "their body is read (default 8M)",
    )
    server.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT,
        help="seconds a client may take to send a request's line and headers before the connection is "
        f"closed (default {DEFAULT_READ_TIMEOUT:g}, as nginx)",
    )
    server.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT,
        help="seconds a client may pause while sending a request body before the connection is closed "
        f"(default {DEFAULT_READ_TIMEOUT:g}, as nginx)",
    )
    server.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds running requests get to finish after SIGTERM; then they are aborted and their "
        "streams end with finish_reason 'abort' (default 30)",
    )
    add_option_flags(server, "server")  # --data-parallel-size
    server.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="vLLM's switch for tool_choice 'auto'; needs --tool-call-parser, which alone enables it too",
    )
    server.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a 'chat_template' sent in a chat request (default: such requests get 400, as "
        "in vLLM: a template is a program, and a sandboxed one can still loop or allocate without bound)",
    )
    server.add_argument(
        "--lora-modules",
        nargs="+",
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters to serve (with --enable-lora): name=path (a PEFT directory or a GGUF LoRA "
        'file) or JSON \'{"name": ..., "path": ...}\'; a request picks one by its `model`',
    )
    server.add_argument(
        "--allow-runtime-lora-updating",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (with --enable-lora)",
    )
    server.add_argument(
        "--uvicorn-log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    media = parser.add_argument_group("multimodal requests")
    media.add_argument(
        "--allowed-local-media-path",
        default=None,
        help="directory under which chat requests may name local image/video files (default: none)",
    )
    media.add_argument(
        "--disable-media-url-fetch",
        action="store_true",
        help="refuse http(s) image/video URLs in chat requests (data: URLs still work)",
    )
    media.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=None,
        metavar="HOST",
        help="fetch media URLs only from these host names (exact match; default: any public host)",
    )
    media.add_argument(
        "--media-allow-private-networks",
        action="store_true",
        help="also fetch media URLs from loopback, private (RFC 1918, unique-local), link-local and "
        "carrier-grade NAT addresses (default: refused, so requests cannot probe the server's network)",
    )
    media.add_argument(
        "--media-url-no-redirects",
        action="store_true",
        help="refuse every redirect a media URL answers with (default: up to 3, each hop checked)",
    )
    compat = parser.add_argument_group("accepted for vLLM / FastDeploy compatibility")
    for flag, options in _NO_EFFECT_FLAGS.items():
        if not _has_flag(parser, flag):
            compat.add_argument(flag, **options)


def no_effect_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The compatibility flags the user set (to log that they change nothing)."""
    names = {flag: flag[2:].replace("-", "_") for flag in _NO_EFFECT_FLAGS}
    return {
        flag: getattr(args, name)
        for flag, name in names.items()
        if getattr(args, name, None) not in (None, False)
    }


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="OpenAI-compatible HTTP server on the fastdeploy engine"
    )
    add_server_arguments(parser)
    return parser
