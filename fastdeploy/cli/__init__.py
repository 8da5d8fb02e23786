"""The `fastdeploy` command line: one module per subcommand.

Each module in `SUBCOMMANDS` exposes `register(subparsers) -> None`, which adds its parser and
sets `func` (called with the parsed namespace, returning an exit code). Modules are imported only
when their command runs or `--help` lists them, so `fastdeploy env` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fastdeploy import __version__
from fastdeploy.errors import FastDeployError

#: subcommand name -> module implementing it
SUBCOMMANDS: dict[str, str] = {
    "generate": "fastdeploy.cli.generate",
    "env": "fastdeploy.cli.env",
    "serve": "fastdeploy.cli.serve",
    "chat": "fastdeploy.cli.chat",
    "bench": "fastdeploy.cli.bench",
    "router": "fastdeploy.cli.router",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastdeploy", description="LLM inference with FastDeploy's API")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).register(subparsers)
    _remember_parsers(parser)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command's parser itself as the default `cli_parser`.

    argparse hands arguments no subcommand knows back to the top-level parser, whose error shows
    the top-level usage; the innermost subcommand's default wins, so `main` can report them with
    the usage of the subcommand the user typed.
    """
    parser.set_defaults(cli_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _remember_parsers(subparser)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.cli_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.version:
        sys.stdout.write(f"fastdeploy {__version__}\n")
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except FastDeployError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
