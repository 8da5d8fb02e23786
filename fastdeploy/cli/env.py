"""`fastdeploy env`: list the device backends (and why each unavailable one is), plugins and
the components they register. Also `python -m fastdeploy.env`."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "env", help="list device backends, plugins and registered components (why a backend is unavailable)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported when used: listing the commands does not load the plugins (cli/__init__)
    from fastdeploy.cli.environment import collect_environment, format_environment
    from fastdeploy.plugins.registry import get_registry

    report = collect_environment(get_registry())
    if args.json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(format_environment(report))
    return 1 if report.errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastdeploy.env", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return run(parser.parse_args(argv))
