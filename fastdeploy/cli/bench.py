"""`fastdeploy bench serve`: drive a running server with concurrent streaming clients and report
throughput and TTFT / inter-token latency percentiles."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks")
    benches = parser.add_subparsers(dest="bench", metavar="BENCH")
    serve = benches.add_parser("serve", help="load-test a running OpenAI-compatible server")
    serve.add_argument("--base-url", default=None, help="server URL (default: http://HOST:PORT)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model", default=None, help="model name (default: the server's first model)")
    serve.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    serve.add_argument("--num-prompts", type=int, default=64, help="requests to send (default 64)")
    serve.add_argument("--concurrency", type=int, default=32, help="clients sending at once (default 32)")
    serve.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (default 64)")
    serve.add_argument("--temperature", type=float, default=0.0)
    serve.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens tokens")
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    serve.add_argument("--json", action="store_true", help="print the summary as JSON")
    serve.set_defaults(func=run_serve)
    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_serve(args: argparse.Namespace) -> int:
    # imported when used: the CLI starts without the HTTP client and the benchmark (cli/__init__)
    from fastdeploy.entrypoints.openai.benchmark import BenchConfig, format_report, run_benchmark

    config = BenchConfig(
        base_url=args.base_url or f"http://{args.host}:{args.port}",
        model=args.model,
        endpoint=args.endpoint,
        num_prompts=args.num_prompts,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        api_key=args.api_key,
        timeout=args.timeout,
    )
    try:
        summary = run_benchmark(config)
    except (OSError, RuntimeError, ValueError) as exc:
        sys.stderr.write(f"error: cannot benchmark {config.base_url}: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(summary, indent=2) + "\n" if args.json else format_report(summary))
    return 0 if summary["failed"] == 0 else 1
