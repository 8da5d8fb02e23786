"""docs/plugins.md is a contract for plugin authors, so what it shows is checked against the code.

- every `<!-- file: PATH -->` block is that file of an example plugin, byte for byte;
- every `<!-- test: runs -->` Python block runs;
- the `fastdeploy env` excerpt's lines appear in the command's real output, and the real
  `fastdeploy env --json` output validates against the documented JSON Schema;
- the tables of `ModelConfig.from_hf_dict` fields, built-in loaders and public names match what
  the code does.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

import fastdeploy.plugins.api as api
from fastdeploy.backends.capabilities import CAPABILITY_SPECS
from fastdeploy.plugins.api import InvalidArgumentError, ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "docs", "plugins.md"), encoding="utf-8") as _handle:
    GUIDE = _handle.read()
FILE_BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```\w*\n(?P<code>.*?)```\n", re.DOTALL)
RUNNABLE = [m.group(1) for m in re.finditer(r"<!-- test: runs -->\n```python\n(.*?)```\n", GUIDE, re.DOTALL)]


def tagged(tag: str) -> str:
    """The fenced block or table that follows `<!-- test: TAG -->`."""
    match = re.search(
        rf"<!-- test: {re.escape(tag)} -->\n(```\w*\n(?P<fenced>.*?)```|(?P<table>(?:\|[^\n]*\n)+))",
        GUIDE,
        re.DOTALL,
    )
    assert match, f"docs/plugins.md has no block tagged {tag!r}"
    return match["fenced"] if match["fenced"] is not None else match["table"]


def table_rows(table: str) -> list[list[str]]:
    """Cells of a markdown table's body rows, backticks stripped."""
    rows = [
        [cell.strip().strip("`") for cell in line.strip().strip("|").split(" | ")]
        for line in table.splitlines()
    ]
    return rows[2:]


def fastdeploy_env(*flags: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FD_")}
    result = subprocess.run(
        [sys.executable, "-m", "fastdeploy", "env", *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_file_blocks_are_the_example_plugin_files():
    blocks = list(FILE_BLOCK.finditer(GUIDE))
    assert [match["path"] for match in blocks] == [
        "plugins/fastdeploy-minimal-model/pyproject.toml",
        "plugins/fastdeploy-minimal-model/fastdeploy_minimal_model/plugin.py",
        "plugins/fastdeploy-minimal-model/fastdeploy_minimal_model/model.py",
        "plugins/fastdeploy-think-parser/pyproject.toml",
        "plugins/fastdeploy-think-parser/fastdeploy_think_parser/plugin.py",
        "plugins/fastdeploy-think-parser/fastdeploy_think_parser/parser.py",
    ]
    for match in blocks:
        with open(os.path.join(ROOT, match["path"]), encoding="utf-8") as handle:
            assert match["code"] == handle.read(), f"docs/plugins.md is out of date for {match['path']}"


@pytest.mark.parametrize("code", RUNNABLE, ids=lambda code: code.splitlines()[-1][:60])
def test_runnable_examples_run(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # logs and scratch files stay out of the repository
    exec(compile(code, "docs/plugins.md", "exec"), {"__name__": "docs_example"})


def test_every_reference_section_has_examples():
    assert len(RUNNABLE) >= 10


def test_env_excerpt_lines_are_in_the_real_output(example_plugins):
    real = set(fastdeploy_env().splitlines())
    documented = [line for line in tagged("lines of `fastdeploy env`").splitlines() if line and line != "..."]
    assert len(documented) > 20
    missing = [line for line in documented if line not in real]
    assert missing == [], "docs/plugins.md shows lines `fastdeploy env` does not print"


@pytest.fixture(scope="module")
def env_schema() -> dict:
    jsonschema = pytest.importorskip("jsonschema", reason="the test extra installs jsonschema")
    schema = json.loads(tagged("JSON Schema of `fastdeploy env --json`"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def test_env_json_validates_against_the_documented_schema(env_schema, example_plugins):
    import jsonschema

    report = json.loads(fastdeploy_env("--json"))
    jsonschema.validate(report, env_schema, cls=jsonschema.Draft202012Validator)
    assert set(report) == set(env_schema["required"])  # every field the command prints is documented


def test_the_schema_rejects_what_the_command_never_prints(env_schema):
    import jsonschema

    validator = jsonschema.Draft202012Validator(env_schema)
    plugin = {"name": "p", "distribution": "d", "builtin": False, "loaded": True, "error": None}
    report = {
        "fastdeploy_version": "0.1.0",
        "python": "3.11.7",
        "platform": "Linux",
        "plugins": [plugin],
        "backends": [],
        "auto_device": None,
        "components": {"fastdeploy_model_architectures": {"LlamaForCausalLM": "fastdeploy.llama"}},
        "errors": {},
        "env": {},
        "media_fetch": {
            "allow_media_url_fetch": True,
            "allowed_media_domains": ["a.com"],
            "media_allow_private_networks": False,
            "media_url_no_redirects": False,
            "max_redirects": 3,
            "timeout_s": 10.0,
            "max_bytes": 1024,
            "max_fetches_in_flight": 16,
        },
    }
    assert validator.is_valid(report)
    assert not validator.is_valid(report | {"plugins": [{k: v for k, v in plugin.items() if k != "loaded"}]})
    assert not validator.is_valid(report | {"components": {"fastdeploy_unknown_hook": {}}})
    assert not validator.is_valid(report | {"extra": 1})


MINIMAL_CONFIG = {
    "architectures": ["MinimalLMForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "vocab_size": 257,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "tie_word_embeddings": True,
    "eos_token_id": [2, 3],
}


def test_config_field_table_is_what_from_hf_dict_does():
    rows = table_rows(tagged("fields of ModelConfig.from_hf_dict"))
    assert {row[0] for row in rows} == {field.name for field in dataclasses.fields(ModelConfig)}
    for field, key, absent in rows:
        if field == "raw":
            assert ModelConfig.from_hf_dict(MINIMAL_CONFIG).raw == MINIMAL_CONFIG
            continue
        key = key.split(" ")[0].strip("`")
        without = {k: v for k, v in MINIMAL_CONFIG.items() if k != key}
        if absent == "*required*":
            with pytest.raises(InvalidArgumentError, match=key):
                ModelConfig.from_hf_dict(without)
        else:
            expression = absent.strip("`")
            try:
                expected = ast.literal_eval(expression)
            except ValueError:
                expected = eval(expression, {}, dict(without))  # e.g. hidden_size // num_attention_heads
            assert getattr(ModelConfig.from_hf_dict(without), field) == expected, field


def test_builtin_loader_table_is_the_registry(fresh_registry):
    registry = fresh_registry.get_registry()
    builtin = {("fastdeploy_weight_loaders", loader) for loader in registry.weight_loaders()} | {
        ("fastdeploy_tokenizer_loaders", loader) for loader in registry.tokenizer_loaders()
    }
    actual = {
        (hook, loader.name, str(loader.priority), loader.reads)
        for hook, loader in builtin
        if type(loader).__module__.startswith("fastdeploy.")
    }
    assert {tuple(row) for row in table_rows(tagged("built-in loaders"))} == actual


def test_the_overview_table_lists_exactly_the_public_names():
    overview = GUIDE[GUIDE.index("## The public API: `fastdeploy.plugins.api`") :]
    table = overview[
        overview.index("| group | names |") : overview.index("\n\n", overview.index("| group |"))
    ]
    assert set(re.findall(r"`(\w+)`", table)) == set(api.__all__)
    reference = overview[len(table) :]
    undocumented = [
        name for name in api.__all__ if f"`{name}`" not in reference and f"`{name}(" not in reference
    ]
    assert undocumented == []


def test_the_capability_table_is_the_code():
    """Each `Capability`, its methods and what runs without it, as `CAPABILITY_SPECS` says."""
    rows = {}
    for line in tagged("capabilities").splitlines()[2:]:
        name, methods, without = (cell.strip() for cell in line.strip().strip("|").split(" | "))
        rows[name.strip("`")] = (tuple(re.findall(r"`(\w+)`", methods)), without)
    assert rows == {cap.name: (spec.methods, spec.without) for cap, spec in CAPABILITY_SPECS.items()}
