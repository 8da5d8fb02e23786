"""`fastdeploy generate MODEL --prompt TEXT`: complete prompts offline and print the text.

Output is one entry per prompt, in prompt order, so scripts can pair them up: with the default
`--output-format text` each completion is one line (newlines inside it written as `\\n`), with
`jsonl` one JSON object per line. A prompt that fails keeps its place (an empty line, or an
object with its `error`), its message goes to stderr, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys

from fastdeploy.cli.sampling_args import add_sampling_arguments, sampling_params_from
from fastdeploy.engine.request import OK, RequestOutput
from fastdeploy.engine_args import add_engine_arguments, engine_kwargs

#: exit status when at least one prompt failed (2 stays for errors before generation starts)
PROMPT_FAILED = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="complete one or more prompts and print the results")
    add_engine_arguments(parser)
    parser.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    add_sampling_arguments(parser, max_tokens=128)
    parser.add_argument(
        "--output-format",
        choices=["text", "jsonl"],
        default="text",
        help="text: one line per prompt (newlines escaped as \\n); jsonl: one JSON object per prompt "
        "with prompt, text, finish_reason and error",
    )
    parser.set_defaults(func=run)


def format_output(output: RequestOutput, prompt: str, output_format: str) -> str:
    """The one line that stands for `output` (without its newline)."""
    failed = output.error_code != OK
    if output_format == "jsonl":
        record = {
            "prompt": prompt,
            "text": None if failed else output.outputs.text,
            "finish_reason": None if failed else output.outputs.finish_reason,
            "error": output.error_msg if failed else None,
        }
        return json.dumps(record, ensure_ascii=False)
    return "" if failed else output.outputs.text.replace("\\", "\\\\").replace("\n", "\\n")


def run(args: argparse.Namespace) -> int:
    # imported when used: the CLI starts without the engine (cli/__init__)
    from fastdeploy import LLM

    params = sampling_params_from(args)  # before the model loads: a bad flag fails at once
    llm = LLM(**engine_kwargs(args))
    status = 0
    for index, (prompt, output) in enumerate(
        zip(args.prompt, llm.generate(args.prompt, params), strict=True)
    ):
        if output.error_code != OK:
            sys.stderr.write(f"error: prompt {index + 1}: {output.error_msg}\n")
            status = PROMPT_FAILED
        sys.stdout.write(format_output(output, prompt, args.output_format) + "\n")
    return status
