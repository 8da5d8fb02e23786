"""Launches the OpenAI-compatible server: `python -m fastdeploy.entrypoints.openai.api_server --model M`.

`fastdeploy serve M` runs the same code. The port is bound first (a port in use fails at once,
not after the model has loaded), then the model loads, then the port accepts connections, so
`/health` answers only once the server can generate. One process holds the HTTP server (uvicorn, one
event loop) and the engine thread. On SIGTERM or Ctrl+C the listening socket closes, running
requests get `--shutdown-timeout` seconds to finish, then are aborted (streams end with
`finish_reason: "abort"` and `[DONE]`), the engine thread stops, and the process exits with
status 0 (see `graceful_server`).
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import TYPE_CHECKING, Any

from fastdeploy.engine_args import engine_kwargs
from fastdeploy.entrypoints.openai.cli_args import build_parser, no_effect_flags
from fastdeploy.errors import FastDeployError, InvalidArgumentError
from fastdeploy.logger import get_logger
from fastdeploy.model_resolver import DEFAULT_MODEL

if TYPE_CHECKING:
    from fastdeploy.entrypoints.openai.serving import ServingContext

# The HTTP stack (uvicorn, the app) and the engine are imported where they are used, after
# `start_ranks_early`: the ranks' fork server imports paddle meanwhile (~1 s each here).

logger = get_logger(__name__)


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options (`EngineConfig`'s fields) of the server's flags."""
    options = engine_kwargs(args)
    # chat requests come from the network: local media only under the named directory
    options["allowed_local_media_path"] = getattr(args, "allowed_local_media_path", None) or ""
    options["allow_media_url_fetch"] = not getattr(args, "disable_media_url_fetch", False)
    options["allowed_media_domains"] = getattr(args, "allowed_media_domains", None)
    options["media_allow_private_networks"] = getattr(args, "media_allow_private_networks", False)
    options["media_url_no_redirects"] = getattr(args, "media_url_no_redirects", False)
    for name in ("splitwise_role", "kv_transport", "kv_transfer_port", "kv_transfer_timeout"):
        if hasattr(args, name):
            options[name] = getattr(args, name)
    return options


def build_context(args: argparse.Namespace) -> ServingContext:
    """Load the model and wrap it for serving (the engine thread starts with the app)."""
    if getattr(args, "enable_auto_tool_choice", False) and not args.tool_call_parser:
        raise InvalidArgumentError(
            "--enable-auto-tool-choice needs --tool-call-parser NAME (hermes, qwen3, ernie-x1) to read the calls"
        )
    from fastdeploy.entrypoints.openai.disaggregation import build_disaggregation
    from fastdeploy.entrypoints.openai.metrics import ServerMetrics
    from fastdeploy.entrypoints.openai.serving import ServingContext
    from fastdeploy.entrypoints.openai.serving_lora import ServedAdapters, parse_lora_modules
    from fastdeploy.entrypoints.replica_serving import build_replicas

    check_server_flags(args)
    for flag, value in no_effect_flags(args).items():
        logger.info("%s=%r has no effect in this engine", flag, value)
    options = _engine_options(args)
    engine = build_replicas(options, args.data_parallel_size, args.max_waiting)
    metrics = ServerMetrics()
    engine.add_observer(metrics.observe_step)
    model = options.get("model")
    names = args.served_model_name or [model or DEFAULT_MODEL]
    adapters = ServedAdapters(engine.engine, args.allow_runtime_lora_updating)
    for name, path in parse_lora_modules(args.lora_modules):
        adapters.add(name, path)  # read and checked now: a bad adapter stops the start
    ctx = ServingContext(
        engine,
        names,
        metrics,
        api_key=args.api_key,
        model_root=model or DEFAULT_MODEL,
        metrics_require_api_key=args.metrics_require_api_key,
        trust_request_chat_template=args.trust_request_chat_template,
        adapters=adapters,
        responses_store_size=args.responses_store_size,
    )
    ctx.disagg = build_disaggregation(engine, args.host, options.get("kv_transfer_port", 0))
    return ctx


def check_server_flags(args: argparse.Namespace) -> None:
    """Refuse impossible server settings before the model loads."""
    if args.max_waiting is not None and args.max_waiting < 0:
        raise InvalidArgumentError(f"--max-waiting-requests must be >= 0, got {args.max_waiting}")
    if args.max_request_size < 1:
        raise InvalidArgumentError(f"--max-request-size must be at least 1 byte, got {args.max_request_size}")
    for flag in ("header_timeout", "body_timeout", "shutdown_timeout"):
        if getattr(args, flag) <= 0:
            raise InvalidArgumentError(
                f"--{flag.replace('_', '-')} must be > 0 seconds, got {getattr(args, flag)}"
            )
    if (args.lora_modules or args.allow_runtime_lora_updating) and not args.enable_lora:
        raise InvalidArgumentError("--lora-modules and --allow-runtime-lora-updating need --enable-lora")
    if args.responses_store_size < 0:
        raise InvalidArgumentError(
            f"--responses-store-size must be >= 0 (0 stores no responses), got {args.responses_store_size}"
        )
    if args.metrics_require_api_key and args.api_key is None:
        raise InvalidArgumentError(
            "--metrics-require-api-key needs --api-key (the key /metrics should require)"
        )
    if args.metrics_require_api_key and args.metrics_port is not None:
        raise InvalidArgumentError(
            "--metrics-port serves /metrics without authentication; with --metrics-require-api-key, "
            "scrape /metrics on the main port instead"
        )


def bind_server_socket(host: str, port: int) -> socket.socket:
    """The HTTP socket, bound (not yet listening) before the model loads, as vLLM does: a port in
    use is an error in a second rather than after minutes of loading, and no other process can
    take the port meanwhile. Connections are refused until uvicorn listens on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidArgumentError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; free it or choose another --port"
        ) from exc
    return sock


def start_ranks_early(args: argparse.Namespace) -> None:
    """Start the fork server of this host's ranks (tensor / pipeline parallelism, or the
    data-parallel replicas, whose models run in rank processes) before the HTTP stack is
    imported; the engines find it running (`forkserver.start_early`)."""
    ranks = args.tensor_parallel_size * args.pipeline_parallel_size
    if args.ips or (ranks == 1 and args.data_parallel_size == 1):
        return
    from fastdeploy.executor.forkserver import start_early

    start_early(args.device, _engine_options(args)["model"], collectives=ranks > 1)


def run_server(args: argparse.Namespace) -> int:
    """Serve until SIGTERM / Ctrl+C; returns the exit status (1 when the engine died)."""
    start_ranks_early(args)
    import uvicorn

    from fastdeploy.entrypoints.openai.app import build_app
    from fastdeploy.entrypoints.openai.graceful_server import GracefulServer
    from fastdeploy.entrypoints.openai.http_protocol import DeadlineH11Protocol
    from fastdeploy.entrypoints.replica_serving import serve_follower_host, stop_replicas

    sock = None
    try:
        follower_status = serve_follower_host(_engine_options(args))
        if follower_status is not None:
            return follower_status
        sock = bind_server_socket(args.host, args.port)
        ctx = build_context(args)
    except FastDeployError as exc:
        if sock is not None:
            sock.close()
        sys.stderr.write(f"error: {exc}\n")
        return 2
    app = build_app(ctx, max_request_bytes=args.max_request_size)
    metrics_server = None
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        metrics_server, _ = start_http_server(
            args.metrics_port, addr=args.host, registry=ctx.metrics.registry
        )
        logger.info("metrics on http://%s:%d/metrics", args.host, args.metrics_port)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
        lifespan="on",
        http=DeadlineH11Protocol.with_timeouts(
            args.header_timeout, args.body_timeout, ctx.metrics.count_error
        ),
    )
    server = GracefulServer(config, on_drain=ctx.engine.stop_accepting, on_deadline=ctx.engine.abort_all)
    died: list[BaseException] = []

    def engine_died(exc: BaseException) -> None:
        # requests in flight have failed; stop serving and exit non-zero
        died.append(exc)
        server.fail(f"the engine died: {exc}")

    ctx.engine.on_fatal(engine_died)
    logger.info("serving %s on http://%s:%d", ", ".join(ctx.served_model_names), args.host, args.port)
    try:
        server.run(sockets=[sock])
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        stop_replicas(ctx.engine)
    if died:
        sys.stderr.write(f"error: the engine died: {died[0]}\n")
    return server.exit_code if server.started else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser("python -m fastdeploy.entrypoints.openai.api_server").parse_args(argv)
    return run_server(args)


if __name__ == "__main__":
    sys.exit(main())
