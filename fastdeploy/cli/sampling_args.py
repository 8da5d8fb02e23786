"""Sampling flags of the commands that generate (`chat`, `generate`), checked while the command line is parsed.

Each value is validated by building a `SamplingParams` with that one field, so the rules and
messages are `SamplingParams`' own, and a bad value is reported with the subcommand's usage
before any model is loaded (loading takes seconds to minutes; a typo should not).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from fastdeploy.errors import InvalidArgumentError


def sampling_field(name: str, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse `type=` that converts a flag's text and checks it as `SamplingParams(name=...)`."""

    def parse(text: str) -> Any:
        # imported when used: the CLI starts without the engine (cli/__init__)
        from fastdeploy.engine.sampling_params import SamplingParams

        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {convert.__name__}, got {text!r}") from None
        try:
            SamplingParams(**{name: value})
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("SamplingParams.")) from None
        return value

    return parse


def add_sampling_arguments(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    """`--max-tokens`, `--temperature` (0 = greedy, the default) and `--top-p`."""
    parser.add_argument(
        "--max-tokens",
        type=sampling_field("max_tokens", int),
        default=max_tokens,
        help=f"most tokens per reply (default {max_tokens}); a reply cut there is marked as truncated",
    )
    parser.add_argument(
        "--temperature",
        type=sampling_field("temperature", float),
        default=0.0,
        help="0 = greedy, the same reply every time (default); higher samples more varied text",
    )
    parser.add_argument(
        "--top-p",
        type=sampling_field("top_p", float),
        default=1.0,
        help="sample only from the most likely tokens whose probabilities add up to this (default 1: all)",
    )


def sampling_params_from(args: argparse.Namespace) -> Any:
    """The `SamplingParams` of parsed sampling flags (refused, before anything loads, with the
    pooling runner, which samples nothing)."""
    # imported when used: the CLI starts without the engine (cli/__init__)
    from fastdeploy.engine.sampling_params import SamplingParams

    if getattr(args, "runner", "generate") == "pooling":
        raise InvalidArgumentError(
            "--runner pooling embeds prompts and generates nothing; serve embeddings with "
            "`fastdeploy serve MODEL --runner pooling` (/v1/embeddings) or call LLM.embed()"
        )

    return SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
