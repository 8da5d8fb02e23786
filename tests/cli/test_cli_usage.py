"""Mistyped command lines are answered with the usage of the subcommand the user typed, and
sampling flags are checked while parsing, before any model loads."""

from __future__ import annotations

import pytest

from fastdeploy.cli import main


def usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["chat", "--bogus"], "fastdeploy chat"),
        (["serve", "--max-tokens-per-request=3"], "fastdeploy serve"),
        (["env", "--yaml"], "fastdeploy env"),
        (["bench", "serve", "--bogus"], "fastdeploy bench serve"),
        (["--bogus"], "fastdeploy"),
    ],
)
def test_an_unknown_flag_shows_that_subcommands_usage(capsys, argv, prog):
    err = usage_error(capsys, argv)
    assert err.startswith(f"usage: {prog} ")
    assert (
        err.splitlines()[-1]
        == f"{prog}: error: unrecognized arguments: {' '.join(argv[len(prog.split()) - 1 :])}"
    )


@pytest.mark.parametrize("command", ["chat", "generate"])
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-tokens", "-1", "argument --max-tokens: max_tokens must be >= 1, got -1"),
        ("--max-tokens", "many", "argument --max-tokens: expected int, got 'many'"),
        ("--temperature", "-0.5", "argument --temperature: temperature must be in [0.0, 100.0], got -0.5"),
        ("--top-p", "0", "argument --top-p: top_p must be in (0.0, 1.0], got 0.0"),
    ],
)
def test_sampling_flags_fail_before_the_model_loads(capsys, monkeypatch, command, flag, value, message):
    import fastdeploy.entrypoints.llm as llm_module

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(llm_module.LLM, "__init__", no_model)
    prompt = ["--prompt", "hi"] if command == "generate" else []
    err = usage_error(capsys, [command, *prompt, flag, value])
    assert err.startswith(f"usage: fastdeploy {command} ")
    assert err.splitlines()[-1] == f"fastdeploy {command}: error: {message}"
