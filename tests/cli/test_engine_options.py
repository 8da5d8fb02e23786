"""The engine options are written once (`EngineArgs`): README's table, `LLM`'s signature and the
command-line flags all list exactly its fields, with its defaults."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from fastdeploy.cli import build_parser
from fastdeploy.config import EngineConfig
from fastdeploy.engine_args import EngineArgs, options_table
from fastdeploy.entrypoints.llm import LLM
from fastdeploy.errors import InvalidArgumentError

README = Path(__file__).resolve().parents[2] / "README.md"
#: options without an engine flag: the positional MODEL, the server's own flags, and those set
#: only from Python (or by the server itself)
NOT_ENGINE_FLAGS = {
    "model",
    "data_parallel_size",
    # prefill/decode disaggregation: `serve`'s flags only
    "splitwise_role",
    "kv_transport",
    "kv_transfer_port",
    "kv_transfer_timeout",
    "responses_store_size",
    "allowed_local_media_path",
    "allow_media_url_fetch",
    "allowed_media_domains",
    "media_allow_private_networks",
    "media_url_no_redirects",
    "data_parallel_rank",
    "dist_init_timeout",
}


def readme_rows() -> list[tuple[str, str]]:
    """(keyword, default) of each row of README's engine-option table."""
    text = README.read_text(encoding="utf-8")
    start = text.index("<!-- engine options:")
    end = text.index("<!-- end of engine options -->")
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", text[start:end], flags=re.MULTILINE)
    assert rows, "README's engine-option table has no rows"
    return rows


def test_readme_table_lists_exactly_the_options_with_their_defaults():
    expected = [(item.name, item.default) for item in dataclasses.fields(EngineArgs)]
    documented = [(name, ast.literal_eval(default)) for name, default in readme_rows()]
    assert documented == expected


def test_readme_table_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    assert options_table() in text, "regenerate README's table: " + options_table()


def test_the_max_num_seqs_default_is_written_once():
    """The issue's example: max_num_seqs=64 appeared in three places."""
    assert EngineArgs().max_num_seqs == 64
    assert EngineConfig().max_num_seqs == 64
    assert inspect.signature(LLM).parameters["max_num_seqs"].default == 64
    assert build_parser().parse_args(["generate", "--prompt=hi"]).max_num_seqs == 64
    assert build_parser().parse_args(["serve"]).max_num_seqs == 64


def test_llm_signature_lists_every_option():
    parameters = inspect.signature(LLM).parameters
    for item in dataclasses.fields(EngineArgs):
        assert parameters[item.name].default == item.default, item.name
        assert f"`{item.name}`" in LLM.__init__.__doc__


@pytest.mark.parametrize("command", [["generate", "--prompt=hi"], ["chat"], ["serve"]])
def test_every_engine_option_is_a_flag_with_its_default(command):
    args = vars(build_parser().parse_args(command))
    for item in dataclasses.fields(EngineArgs):
        if item.name in NOT_ENGINE_FLAGS:
            continue
        assert args[item.name] == item.default, item.name
    assert ("data_parallel_size" in args) == (command == ["serve"])


def test_an_unknown_keyword_is_refused_before_anything_loads():
    with pytest.raises(InvalidArgumentError, match="LLM\\(\\) got unsupported argument\\(s\\): max_num_seq$"):
        LLM(max_num_seq=4)
