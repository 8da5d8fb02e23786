"""Discovers plugins through entry points and merges what their hooks register."""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field
from typing import Any

import pluggy

from fastdeploy import envs
from fastdeploy.errors import PluginError, UnsupportedModelError
from fastdeploy.logger import get_logger
from fastdeploy.plugins import hookspecs

ENTRY_POINT_GROUP = "fastdeploy.plugins"
BUILTIN_DISTRIBUTION = "fastdeploy"
#: named hooks: the answers are {name: value} mappings merged across plugins
NAMED_HOOKS = (
    "fastdeploy_model_architectures",
    "fastdeploy_chat_templates",
    "fastdeploy_reasoning_parsers",
    "fastdeploy_tool_call_parsers",
    "fastdeploy_device_backends",
    "fastdeploy_communicators",
    "fastdeploy_kv_transports",
)
logger = get_logger(__name__)


@dataclass
class PluginInfo:
    """What `fastdeploy env` reports about one entry point."""

    name: str
    distribution: str
    builtin: bool
    loaded: bool
    error: str | None = None


def plugin_priority(value: Any) -> int:
    """The explicit priority an entry declares (`plugin_priority` attribute, default 0)."""
    priority = getattr(value, "plugin_priority", 0)
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


@dataclass
class PluginRegistry:
    """A pluggy manager loaded from the `fastdeploy.plugins` entry points.

    Built-in entry points (those of the `fastdeploy` distribution) always load; `FD_PLUGINS`
    restricts the third-party ones. A plugin that fails to import is logged by name and skipped.
    """

    manager: pluggy.PluginManager
    plugins: list[PluginInfo] = field(default_factory=list)

    @classmethod
    def from_entry_points(cls) -> PluginRegistry:
        manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        manager.add_hookspecs(hookspecs)
        registry = cls(manager)
        allowed = envs.enabled_plugins()
        # a distribution's name parses its METADATA file each time it is asked: once per
        # distribution here, not once per entry point (~5 ms each, on every engine start)
        names: dict[importlib.metadata.Distribution | None, str] = {None: "?"}
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry_point.dist not in names:
                names[entry_point.dist] = entry_point.dist.name
            registry._load(entry_point, allowed, names[entry_point.dist])
        return registry

    def _load(
        self, entry_point: importlib.metadata.EntryPoint, allowed: list[str] | None, distribution: str
    ) -> None:
        builtin = distribution == BUILTIN_DISTRIBUTION
        if not builtin and allowed is not None and entry_point.name not in allowed:
            logger.info("plugin %s skipped: not listed in FD_PLUGINS", entry_point.name)
            self.plugins.append(
                PluginInfo(entry_point.name, distribution, builtin, False, "not in FD_PLUGINS")
            )
            return
        if self.manager.has_plugin(entry_point.name):
            return
        try:
            plugin = entry_point.load()
            self.manager.register(plugin, name=entry_point.name)
        except Exception as exc:  # a broken plugin must not take the engine down
            message = f"{type(exc).__name__}: {exc}"
            logger.error(
                "plugin %s (%s) failed to load and is skipped: %s", entry_point.name, distribution, message
            )
            self.plugins.append(PluginInfo(entry_point.name, distribution, builtin, False, message))
            return
        self.plugins.append(PluginInfo(entry_point.name, distribution, builtin, True))

    def register(self, plugin: Any, name: str) -> None:
        """Register an in-process plugin object (tests, notebooks)."""
        self.manager.register(plugin, name=name)
        self.plugins.append(PluginInfo(name, "(in-process)", False, True))

    def _per_plugin(self, hook_name: str) -> list[tuple[str, Any]]:
        hook = getattr(self.manager.hook, hook_name)
        results = []
        for impl in reversed(hook.get_hookimpls()):
            try:
                value = impl.function()
            except Exception as exc:
                plugin_name = self.manager.get_name(impl.plugin)
                raise PluginError(
                    f"plugin {plugin_name!r} raised in {hook_name}: {type(exc).__name__}: {exc}; "
                    f"fix or uninstall it, or leave it out of FD_PLUGINS"
                ) from exc
            if value:
                results.append((self.manager.get_name(impl.plugin), value))
        return results

    def _merged(self, hook_name: str) -> dict[str, Any]:
        """Merge {name: value} answers; same name: higher `plugin_priority` wins, a tie is an error."""
        merged: dict[str, Any] = {}
        owners: dict[str, str] = {}
        for plugin_name, mapping in self._per_plugin(hook_name):
            for key, value in mapping.items():
                if key in merged and merged[key] is not value:
                    old, new = plugin_priority(merged[key]), plugin_priority(value)
                    if old == new:
                        raise PluginError(
                            f"{hook_name}: name {key!r} is registered by both plugin {owners[key]!r} "
                            f"and plugin {plugin_name!r} with the same plugin_priority ({old}); "
                            "uninstall one, restrict FD_PLUGINS, or give the intended one a higher "
                            "plugin_priority"
                        )
                    winner, loser = (owners[key], plugin_name) if old > new else (plugin_name, owners[key])
                    logger.info(
                        "%s: %r of plugin %s (priority %d) overrides plugin %s (priority %d)",
                        hook_name,
                        key,
                        winner,
                        max(old, new),
                        loser,
                        min(old, new),
                    )
                    if new < old:
                        continue
                merged[key] = value
                owners[key] = plugin_name
        return merged

    def owners(self, hook_name: str) -> dict[str, str]:
        """Which plugin provides each name of a named hook after conflicts are resolved."""
        result: dict[str, str] = {}
        merged = self._merged(hook_name)
        for plugin_name, mapping in self._per_plugin(hook_name):
            for key, value in mapping.items():
                if merged.get(key) is value:
                    result[key] = plugin_name
        return result

    def _ranked(self, hook_name: str) -> list[Any]:
        items: dict[str, Any] = {}
        owners: dict[str, str] = {}
        for plugin_name, values in self._per_plugin(hook_name):
            for item in values:
                if item.name in items:
                    raise PluginError(
                        f"{hook_name}: {item.name!r} is registered by both plugin {owners[item.name]!r} "
                        f"and plugin {plugin_name!r}"
                    )
                items[item.name] = item
                owners[item.name] = plugin_name
        return sorted(items.values(), key=lambda item: -item.priority)

    def model_architectures(self) -> dict[str, type]:
        return self._merged("fastdeploy_model_architectures")

    def chat_templates(self) -> dict[str, str]:
        return self._merged("fastdeploy_chat_templates")

    def multimodal_processors(self) -> dict[str, Any]:
        return self._merged("fastdeploy_multimodal_processors")

    def reasoning_parsers(self) -> dict[str, type]:
        return self._merged("fastdeploy_reasoning_parsers")

    def tool_call_parsers(self) -> dict[str, type]:
        return self._merged("fastdeploy_tool_call_parsers")

    def device_backends(self) -> dict[str, type]:
        return self._merged("fastdeploy_device_backends")

    def communicators(self) -> dict[str, type]:
        return self._merged("fastdeploy_communicators")

    def kv_transports(self) -> dict[str, type]:
        return self._merged("fastdeploy_kv_transports")

    def weight_loaders(self) -> list[Any]:
        return self._ranked("fastdeploy_weight_loaders")

    def tokenizer_loaders(self) -> list[Any]:
        return self._ranked("fastdeploy_tokenizer_loaders")


_registry: PluginRegistry | None = None


def get_registry() -> PluginRegistry:
    """The process-wide registry, built on first use (the only global state fastdeploy keeps)."""
    global _registry
    if _registry is None:
        _registry = PluginRegistry.from_entry_points()
    return _registry


def reset_registry() -> None:
    """Forget the registry so the next `get_registry` re-reads entry points and FD_PLUGINS."""
    global _registry
    _registry = None


def first_that_can_load(loaders: list[Any], path: str, what: str) -> Any:
    """Return the first loader whose `can_load(path)` is true, else raise saying what each loader
    reads (their `reads`) and what the directory holds, so the user sees which files are missing."""
    for loader in loaders:
        if loader.can_load(path):
            return loader
    expected = "; ".join(f"{loader.reads} ({loader.name})" for loader in loaders) or "none registered"
    found = ""
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        found = f"; the directory holds: {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}"
        found = found if names else "; the directory is empty"
    raise UnsupportedModelError(f"no registered {what} can read {path!r}; expected one of: {expected}{found}")
