"""Flags of `fastdeploy serve` and `python -m fastdeploy.entrypoints.openai.api_server` (the same set).

Engine flags come from `fastdeploy.cli.engine_args`; this module adds the server's own, and
accepts the vLLM / Ascend launch flags users paste from existing deployments
(`--num-scheduler-steps`, `--trust-remote-code`, `--enforce-eager`, ...): they have no effect in
this engine and are logged as such rather than rejected.
"""

from __future__ import annotations

import argparse
from typing import Any

from fastdeploy.cli.engine_args import add_engine_arguments

DEFAULT_PORT = 8000
#: requests that may wait beyond the --max-num-seqs running ones before the server answers 503
DEFAULT_MAX_WAITING = 1024

#: flag -> argparse options, for launch flags accepted without effect
_NO_EFFECT_FLAGS: dict[str, dict[str, Any]] = {
    "--num-scheduler-steps": {"type": int, "help": "accepted for vLLM compatibility; one step per schedule"},
    "--multi-step-stream-outputs": {"default": None, "help": "accepted for vLLM compatibility"},
    "--trust-remote-code": {
        "action": "store_true",
        "help": "accepted; no model code is ever downloaded or run",
    },
    "--enforce-eager": {"action": "store_true", "help": "accepted; this engine has no graph mode"},
    "--disable-async-output-proc": {"action": "store_true", "help": "accepted for vLLM compatibility"},
    "--disable-log-requests": {"action": "store_true", "help": "accepted for vLLM compatibility"},
    "--disable-log-stats": {"action": "store_true", "help": "accepted for vLLM compatibility"},
}


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
        "--max-waiting",
        type=int,
        default=DEFAULT_MAX_WAITING,
        help="requests that may queue beyond --max-num-seqs before new ones get 503 "
        f"(default {DEFAULT_MAX_WAITING})",
    )
    server.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds running requests get to finish after SIGTERM (default 30)",
    )
    server.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="engine replicas behind this endpoint; each request goes to the least-loaded one (default 1)",
    )
    server.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="vLLM's switch for tool_choice 'auto'; needs --tool-call-parser, which alone enables it too",
    )
    server.add_argument(
        "--uvicorn-log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    compat = parser.add_argument_group("accepted for vLLM / FastDeploy compatibility")
    if not _has_flag(parser, "--dtype"):
        compat.add_argument("--dtype", default=None, help="weights dtype ('auto' or 'float32')")
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
