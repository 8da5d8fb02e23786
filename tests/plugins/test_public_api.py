"""`fastdeploy.plugins.api` is the whole contract for plugin authors.

The example packages under plugins/ and the built-in model modules are written the way a third
party must write a plugin: every fastdeploy name they use comes from `fastdeploy.plugins.api`
(built-in models may also build on a sibling architecture, e.g. Qwen on Llama). The imports are
read with `ast`, so a name reached from anywhere else fails here before an outside author copies it.
"""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest

import fastdeploy.plugins.api as api

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLIC_MODULE = "fastdeploy.plugins.api"
#: modules of fastdeploy/models that are not architectures (and so not importable by them)
MODEL_INTERNALS = {"fastdeploy.models", "fastdeploy.models.base"}


def _module_name(path: str) -> str:
    relative = os.path.relpath(path, ROOT)[: -len(".py")]
    return relative.replace(os.sep, ".").removesuffix(".__init__")


def imported_modules(source: str, module: str) -> list[tuple[int, str, str]]:
    """(line, imported module, name) for every import in `source`, relative ones resolved."""
    found = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.extend((node.lineno, base, alias.name) for alias in node.names)
    return found


def reaches_past_api(source: str, module: str, allowed: set[str] = frozenset()) -> list[str]:
    """The imports of fastdeploy names from anywhere but the public module (and `allowed`)."""
    problems = []
    for line, imported, name in imported_modules(source, module):
        if imported != "fastdeploy" and not imported.startswith("fastdeploy."):
            continue
        if imported == PUBLIC_MODULE or imported in allowed:
            continue
        if imported == "fastdeploy.plugins" and name == "api":
            continue
        problems.append(f"{module}:{line}: {imported}" + (f" ({name})" if name else ""))
    return problems


def _example_plugin_files() -> list[str]:
    files = glob.glob(os.path.join(ROOT, "plugins", "*", "**", "*.py"), recursive=True)
    return sorted(f for f in files if ".egg-info" not in f and f"{os.sep}build{os.sep}" not in f)


def _builtin_model_files() -> list[str]:
    return sorted(
        f
        for f in glob.glob(os.path.join(ROOT, "fastdeploy", "models", "*.py"))
        if _module_name(f) not in MODEL_INTERNALS
    )


def test_there_are_files_to_check():
    names = {os.path.basename(f) for f in _example_plugin_files()}
    assert {"model.py", "loader.py", "parser.py", "plugin.py"} <= names
    assert {"llama.py", "qwen.py", "ernie4_5.py"} <= {os.path.basename(f) for f in _builtin_model_files()}


@pytest.mark.parametrize("path", _example_plugin_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_example_plugin_imports_only_the_public_api(path):
    with open(path, encoding="utf-8") as handle:
        assert reaches_past_api(handle.read(), _module_name(path)) == []


@pytest.mark.parametrize("path", _builtin_model_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_builtin_model_imports_only_the_public_api_and_sibling_architectures(path):
    # sibling architectures: the other model modules, and the modules of the model packages
    # (e.g. the multimodal rotary tables of fastdeploy/models/ernie4_5_vl/rotary.py)
    packaged = glob.glob(os.path.join(ROOT, "fastdeploy", "models", "*", "*.py"))
    architectures = {_module_name(f) for f in _builtin_model_files() + packaged}
    with open(path, encoding="utf-8") as handle:
        assert reaches_past_api(handle.read(), _module_name(path), architectures) == []


@pytest.mark.parametrize(
    "source",
    [
        "from fastdeploy.models.base import CausalLM",
        "import fastdeploy.config",
        "from fastdeploy import errors",
        "def f():\n    from fastdeploy.model_executor.rope import rope_tables",
        "from .base import CausalLM",
    ],
)
def test_the_check_catches_imports_past_the_api(source):
    assert reaches_past_api(source, "fastdeploy.models.example", {"fastdeploy.models.llama"})


@pytest.mark.parametrize(
    "source",
    [
        "from fastdeploy.plugins.api import CausalLM",
        "from fastdeploy.plugins import api",
        "import fastdeploy.plugins.api",
        "from fastdeploy_gpt2.model import GPT2LMHeadModel",
        "from .llama import LlamaForCausalLM",
    ],
)
def test_the_check_allows_the_api_and_the_plugins_own_modules(source):
    assert reaches_past_api(source, "fastdeploy.models.example", {"fastdeploy.models.llama"}) == []


def test_every_exported_name_exists_and_nothing_else_is_public():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    public = {name for name in vars(api) if not name.startswith("_")}
    assert public == set(api.__all__)
    assert len(api.__all__) == len(set(api.__all__))


def _guide_code_blocks() -> list[str]:
    with open(os.path.join(ROOT, "docs", "plugins.md"), encoding="utf-8") as handle:
        return re.findall(r"```python\n(.*?)```", handle.read(), re.DOTALL)


def test_the_guide_teaches_only_the_public_api():
    """docs/plugins.md's examples import plugin names from the public module, user names
    (`LLM`, `SamplingParams`) from the package root, and nothing else of fastdeploy's."""
    import fastdeploy

    blocks = _guide_code_blocks()
    assert len(blocks) > 10
    for block in blocks:
        assert reaches_past_api(block, "docs.plugins", {"fastdeploy"}) == [], block[:200]
        for _, module, name in imported_modules(block, "docs.plugins"):
            if module == "fastdeploy":
                assert name in fastdeploy.__all__, f"docs/plugins.md imports fastdeploy.{name}"
