"""`--speculative-config` on the command line: parsed as JSON, bad values refused in one line."""

from fastdeploy.cli import main


def test_unknown_speculative_method_is_a_one_line_error(capsys):
    config = '{"method": "eagle", "num_speculative_tokens": 2}'
    assert main(["generate", "--speculative-config", config, "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "error: speculative_config.method must be one of ngram, draft_model, mtp, got 'eagle'"
    )


def test_speculative_generation_from_the_command_line(capsys):
    config = '{"method": "ngram", "num_speculative_tokens": 3}'
    args = ["generate", "--speculative-config", config, "--prompt", "1, 2, 3, 1, 2, 3, 1, 2,"]
    assert main([*args, "--max-tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip()
