"""`fastdeploy serve` flags: the seed's launch command parses; impossible settings fail before loading."""

from __future__ import annotations

import pytest

from fastdeploy.cli import build_parser, main
from fastdeploy.entrypoints.openai.cli_args import no_effect_flags

SEED_LAUNCH = [
    "serve",
    "/path/to/model",
    "--max-num-seqs=256",
    "--max-model-len=4096",
    "--max-num-batched-tokens=4096",
    "--tensor-parallel-size=1",
    "--block-size=128",
    "--host=0.0.0.0",
    "--port=8080",
    "--gpu-memory-utilization=0.9",
    "--num-scheduler-steps=8",
    "--trust-remote-code",
    "--enforce-eager",
]


def test_seed_launch_flags_parse():
    args = build_parser().parse_args(SEED_LAUNCH)
    assert (args.model, args.max_num_seqs, args.max_model_len, args.block_size) == (
        "/path/to/model",
        256,
        4096,
        128,
    )
    assert (args.host, args.port, args.gpu_memory_utilization) == ("0.0.0.0", 8080, 0.9)
    assert no_effect_flags(args) == {"--num-scheduler-steps": 8, "--trust-remote-code": True}


def test_enforce_eager_reaches_the_engine():
    """--enforce-eager turns off CUDA graphs (it is no longer a flag without effect)."""
    from fastdeploy.engine_args import engine_kwargs

    assert engine_kwargs(build_parser().parse_args(SEED_LAUNCH))["enforce_eager"] is True
    assert engine_kwargs(build_parser().parse_args(["serve"]))["enforce_eager"] is False
    assert (
        engine_kwargs(build_parser().parse_args(["generate", "--prompt=hi", "--enforce-eager"]))[
            "enforce_eager"
        ]
        is True
    )


def test_structured_output_and_tool_flags_reach_the_engine():
    from fastdeploy.engine_args import engine_kwargs

    flags = ["serve", "--guided-decoding-backend=xgrammar", "--guided-decoding-disable-any-whitespace"]
    args = build_parser().parse_args([*flags, "--tool-call-parser=hermes", "--enable-auto-tool-choice"])
    kwargs = engine_kwargs(args)
    assert (
        kwargs["guided_decoding_backend"] == "xgrammar" and kwargs["guided_decoding_disable_any_whitespace"]
    )
    assert kwargs["tool_call_parser"] == "hermes" and args.enable_auto_tool_choice
    assert engine_kwargs(build_parser().parse_args(["serve"]))["guided_decoding_backend"] == "auto"


def test_server_flags_defaults():
    args = build_parser().parse_args(["serve"])
    assert args.model is None and args.port == 8000 and args.metrics_port is None and args.api_key is None
    assert args.served_model_name is None and args.max_waiting == 1024 and args.shutdown_timeout == 30.0
    assert args.max_request_size == 8 * 1024 * 1024 and args.header_timeout == args.body_timeout == 60.0
    assert args.metrics_require_api_key is False and args.responses_store_size == 1024


def test_queue_limit_has_the_old_name_as_alias():
    parser = build_parser()
    assert parser.parse_args(["serve", "--max-waiting-requests=7"]).max_waiting == 7
    assert parser.parse_args(["serve", "--max-waiting=9"]).max_waiting == 9


@pytest.mark.parametrize(
    ("text", "size"),
    [("1000", 1000), ("512K", 512 * 1024), ("16M", 16 * 1024**2), ("1GiB", 1024**3), ("2mb", 2 * 1024**2)],
)
def test_request_size_units(text, size):
    assert build_parser().parse_args(["serve", f"--max-request-size={text}"]).max_request_size == size


def test_request_size_rejects_garbage(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-request-size=lots"])
    assert "expected a size such as" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--pipeline-parallel-size=0"], "pipeline_parallel_size must be an int >= 1, got 0"),
        (["--max-waiting=-1"], "--max-waiting-requests must be >= 0"),
        (["--max-request-size=0"], "--max-request-size must be at least 1 byte"),
        (["--header-timeout=0"], "--header-timeout must be > 0 seconds"),
        (
            ["--responses-store-size=-1"],
            "--responses-store-size must be >= 0 (0 stores no responses), got -1",
        ),
        (["--metrics-require-api-key"], "--metrics-require-api-key needs --api-key"),
        (
            ["--metrics-require-api-key", "--api-key=k", "--metrics-port=9100"],
            "--metrics-port serves /metrics without authentication",
        ),
        (["--tensor-parallel-size=2"], "tensor_parallel_size=2 does not divide the 9 attention heads"),
        (["--data-parallel-size=0"], "data_parallel_size must be an int >= 1 (engine replicas), got 0"),
        (["/no/such/model"], "neither an existing path nor an embedded model"),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
        (["--tool-call-parser=nope"], "tool_call_parser 'nope' is not registered"),
    ],
)
def test_impossible_settings_exit_with_a_message(flags, fragment, capsys):
    assert main(["serve", *flags]) == 2
    assert fragment in capsys.readouterr().err
