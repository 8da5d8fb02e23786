"""The structure docs/architecture.md promises, read from the code's own imports and definitions.

The layers themselves (which package may import which) are import-linter's contract in
pyproject.toml, run by `make lint`; these tests check what that contract does not: no import
cycles between modules, a small engine core, short functions in the engine, and imports of our
own modules at module level, where a reader sees them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fastdeploy"

#: the core loop: schedule -> execute -> update, and nothing else
CORE_MODULE = PACKAGE / "engine" / "engine.py"
CORE_MAX_LINES = 400
ENGINE_MAX_FUNCTION_LINES = 80

#: function-level imports of fastdeploy modules that are deliberate, and why
DEFERRED_IMPORTS = {
    # `LLM` and `SamplingParams` on first access: a plugin importing fastdeploy.plugins does not
    # pull in the whole engine
    "fastdeploy/__init__.py",
    # a CLI subcommand imports only what it runs, so `fastdeploy --help` answers at once
    "fastdeploy/cli/__init__.py",
    # `fastdeploy router` imports its HTTP stack (seconds) only when it runs
    "fastdeploy/cli/router.py",
    # the fork server answers its first request before it imports a rank's code (issue 16's
    # start-up overlap); a rank then imports it once, before it is forked
    "fastdeploy/executor/forkserver_process.py",
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported: at top level, in try/if blocks (not TYPE_CHECKING)."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                pending += handler.body
    return found


def _targets(node: ast.Import | ast.ImportFrom, importer: str, modules: dict[str, Path]) -> set[str]:
    """The fastdeploy modules an import statement loads (a name that is no module means its package)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = node.module or ""
    if node.level:
        package = importer.split(".")
        if modules[importer].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    targets = set()
    for alias in node.names:
        name = f"{base}.{alias.name}"
        if name in modules:
            targets.add(name)
        elif base in modules:
            targets.add(base)
    return targets


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: set[str] = set()
        for node in _module_level_imports(tree):
            edges |= _targets(node, name, modules)
        graph[name] = edges - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def test_the_cycle_finder_finds_a_known_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles_between_modules():
    cycles = _cycles(_import_graph())
    assert not cycles, "modules that import each other (module-level imports):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )


def test_the_engine_core_is_small():
    lines = len(CORE_MODULE.read_text().splitlines())
    assert lines <= CORE_MAX_LINES, f"{CORE_MODULE.name} has {lines} lines (at most {CORE_MAX_LINES})"


def test_no_engine_function_is_long():
    long = []
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > ENGINE_MAX_FUNCTION_LINES:
                    long.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({length} lines)"
                    )
    assert not long, f"engine functions over {ENGINE_MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_our_own_modules_are_imported_at_module_level():
    """A function-level `import fastdeploy...` hides a dependency from readers and from the layers
    contract; optional third-party packages (paddle, torch, triton, PIL, ...) may still be imported
    where they are used."""
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if relative in DEFERRED_IMPORTS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("fastdeploy"):
                    hidden.append(f"{relative}:{inner.lineno} from {inner.module}")
                elif isinstance(inner, ast.Import) and any(
                    a.name.startswith("fastdeploy") for a in inner.names
                ):
                    hidden.append(f"{relative}:{inner.lineno} import {inner.names[0].name}")
    assert not hidden, "function-level imports of fastdeploy modules:\n" + "\n".join(sorted(set(hidden)))
