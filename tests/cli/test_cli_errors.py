"""The command line reports fastdeploy's errors as one line and exit code 2, not a traceback."""

import json

import pytest

from fastdeploy.backends.conformance.checkpoint import write_byte_tokenizer
from fastdeploy.cli import main


def test_unavailable_device_is_a_one_line_error(capsys):
    assert main(["generate", "--device", "xpu", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: the xpu backend cannot run here: not implemented")
    assert "Traceback" not in err


def test_unknown_model_path(capsys):
    assert main(["generate", "/no/such/model.gguf", "--prompt", "hi"]) == 2
    assert "neither an existing path nor an embedded model" in capsys.readouterr().err


def test_a_directory_that_is_not_a_model_names_the_files_expected(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    assert main(["generate", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"error: no registered weight loader can read {str(tmp_path)!r}; expected one of: ")
    assert "a directory with config.json and *.safetensors weights (safetensors)" in err
    assert "a .gguf file (gguf)" in err
    assert err.endswith("the directory holds: notes.txt")


def test_a_checkpoint_without_safetensors_says_which_weights_are_read(tmp_path, capsys):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "vocab_size": 10,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    write_byte_tokenizer(str(tmp_path))
    assert main(["generate", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert (
        "has no *.safetensors weight files (it holds: config.json, pytorch_model.bin, tokenizer.json)" in err
    )
    assert "not PyTorch .bin/.pt files" in err


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["chat"]])
def test_the_pooling_runner_is_refused_by_the_generating_commands(command, capsys):
    """Before anything loads: the pooling runner embeds, these commands generate."""
    assert main([*command, "--runner", "pooling"]) == 2
    err = capsys.readouterr().err
    assert "--runner pooling embeds prompts and generates nothing" in err
    assert "fastdeploy serve MODEL --runner pooling" in err
