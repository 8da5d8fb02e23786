"""`fastdeploy router --workers URL ... [flags]`: one OpenAI endpoint in front of many servers."""

from __future__ import annotations

import argparse

from fastdeploy.router.policies import POLICY_NAMES

#: the router's own port by default (a worker on the same host keeps `fastdeploy serve`'s 8000)
DEFAULT_PORT = 8080


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "router",
        help="route OpenAI API requests over several `fastdeploy serve` workers",
        description="Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, /health, "
        "/metrics) by forwarding each request to one of several `fastdeploy serve` workers.",
    )
    workers = parser.add_argument_group("workers")
    workers.add_argument(
        "--workers",
        nargs="+",
        default=[],
        metavar="URL",
        help="worker addresses, http://host:port (space- or comma-separated)",
    )
    workers.add_argument(
        "--workers-file",
        metavar="PATH",
        help="a file listing worker addresses, one a line (# comments); re-read when it changes",
    )
    workers.add_argument(
        "--prefill-workers",
        nargs="+",
        default=[],
        metavar="URL",
        help="prefill/decode disaggregation: `fastdeploy serve --splitwise-role prefill` workers; each "
        "request is prefilled on one of them, then generated on a --decode-workers worker",
    )
    workers.add_argument(
        "--decode-workers",
        nargs="+",
        default=[],
        metavar="URL",
        help="prefill/decode disaggregation: `fastdeploy serve --splitwise-role decode` workers",
    )
    workers.add_argument(
        "--prefill-workers-file",
        metavar="PATH",
        help="prefill/decode disaggregation: a file listing prefill worker addresses, one a line; "
        "re-read when it changes",
    )
    workers.add_argument(
        "--decode-workers-file",
        metavar="PATH",
        help="prefill/decode disaggregation: a file listing decode worker addresses, one a line; "
        "re-read when it changes",
    )
    workers.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        default="least-outstanding",
        help="how a worker is chosen (default least-outstanding)",
    )
    workers.add_argument(
        "--prefix-block-chars",
        type=_positive(int),
        default=128,
        help="prefix-affinity: prompt prefixes are compared in blocks of this many characters (default 128)",
    )
    workers.add_argument(
        "--prefix-slack",
        type=_non_negative(int),
        default=2,
        help="prefix-affinity: a prompt follows its prefix to a worker with at most this many more "
        "requests in flight than the least busy one (default 2)",
    )
    health = parser.add_argument_group("health")
    health.add_argument(
        "--health-interval",
        type=_positive(float),
        default=2.0,
        help="seconds between health checks (default 2)",
    )
    health.add_argument(
        "--health-timeout",
        type=_positive(float),
        default=2.0,
        help="seconds a /health check may take (default 2)",
    )
    health.add_argument(
        "--connect-timeout",
        type=_positive(float),
        default=5.0,
        help="seconds to connect to a worker before trying another (default 5)",
    )
    health.add_argument(
        "--startup-timeout",
        type=_non_negative(float),
        default=30.0,
        help="seconds to wait at start-up for a worker to become healthy (default 30)",
    )
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all interfaces)")
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})")
    server.add_argument(
        "--shutdown-timeout",
        type=_non_negative(float),
        default=30.0,
        help="seconds streams in flight get to finish after SIGTERM (default 30)",
    )
    server.add_argument(
        "--uvicorn-log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the HTTP stack takes seconds to import: only when the router runs, not for `fastdeploy --help`
    from fastdeploy.router.app import RouterSettings, run_router

    settings = RouterSettings(
        workers=_urls(args.workers),
        prefill_workers=_urls(args.prefill_workers),
        decode_workers=_urls(args.decode_workers),
        workers_file=args.workers_file,
        prefill_workers_file=args.prefill_workers_file,
        decode_workers_file=args.decode_workers_file,
        policy=args.policy,
        prefix_block_chars=args.prefix_block_chars,
        prefix_slack=args.prefix_slack,
        health_interval=args.health_interval,
        health_timeout=args.health_timeout,
        connect_timeout=args.connect_timeout,
        startup_timeout=args.startup_timeout,
    )
    return run_router(settings, args.host, args.port, args.uvicorn_log_level, args.shutdown_timeout)


def _urls(items: list[str]) -> list[str]:
    """Addresses given space- or comma-separated."""
    return [url for item in items for url in item.split(",") if url.strip()]


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
        return value

    return parse


def _non_negative(kind: type) -> object:
    def parse(text: str) -> object:
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
        return value

    return parse
