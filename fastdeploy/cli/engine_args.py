"""Engine flags shared by every subcommand that builds an engine (`generate`, `chat`, `serve`).

They are generated from the engine options (`fastdeploy.engine_args.EngineArgs`): each flag is the
option's name with dashes, with its default and help; `engine_kwargs` turns the parsed flags back
into the options.
"""

from __future__ import annotations

import argparse
from typing import Any

from fastdeploy.engine_args import option_fields


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
