"""`fastdeploy serve MODEL [flags]`: the OpenAI-compatible HTTP server on one model."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    # imported when the parser is built: the server's flags, not the HTTP stack (cli/__init__)
    from fastdeploy.entrypoints.openai.cli_args import add_server_arguments

    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, "
        "/v1/chat/completions, /v1/models, /health, /metrics).",
    )
    add_server_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported when used: the CLI starts without the engine (cli/__init__)
    from fastdeploy.entrypoints.openai.api_server import run_server

    return run_server(args)
