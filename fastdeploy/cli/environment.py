"""What `fastdeploy env` reports: plugins, the components they register, and the device backends.

Collecting is separate from printing so the report is testable as data (`collect_environment`)
and printable as text or JSON. Nothing here builds a backend: availability comes from each
backend class's `unavailable_reason()`, which must stay cheap.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from fastdeploy.errors import FastDeployError
from fastdeploy.input.media_fetch import MAX_FETCHES_IN_FLIGHT, FetchPolicy
from fastdeploy.plugins.registry import PluginInfo, PluginRegistry
from fastdeploy.version import __version__

#: environment variables that change what loads or where it runs
ENV_VARS = (
    "FD_DEVICE",
    "FD_PLUGINS",
    "FD_CUDA_RUNTIME",
    "FD_CUDA_KERNELS",
    "FD_PADDLE_KERNELS",
    "FD_CPU_KERNELS",
    "FD_CPU_THREADS",
    "FD_CPU_SPIN_US",
    "FD_CPU_ADAPTIVE_THREADS",
    "FD_CPU_ACTIVATIONS",
    "FD_CPU_INT8_DOTS",
    "FD_CPU_VISION_MATMUL",
    "FD_WEIGHT_CACHE",
    "FD_WEIGHT_CACHE_MAX_GB",
    "FD_COMMUNICATOR",
    "FD_NODE_RANK",
    "FD_DIST_INIT_TIMEOUT",
    "FD_DIST_FORK_SERVER",
    "FD_MODEL_SOURCE",
    "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
    "HF_HOME",
    "HF_HUB_CACHE",
    "TRITON_INTERPRET",
)


@dataclass
class BackendStatus:
    name: str
    plugin: str
    available: bool
    reason: str | None
    auto_priority: int
    #: how an available backend will run here (its `runtime_details()`)
    details: str | None = None


@dataclass
class EnvironmentReport:
    fastdeploy_version: str
    python: str
    platform: str
    plugins: list[PluginInfo]
    backends: list[BackendStatus]
    auto_device: str | None
    #: hook -> {registered name: providing plugin}
    components: dict[str, dict[str, str]]
    #: hook -> error text, when a hook's answers conflict or a plugin raised
    errors: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    #: the default rules for media URLs a request names (`media_fetch_defaults`)
    media_fetch: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _backend_statuses(registry: PluginRegistry, errors: dict[str, str]) -> list[BackendStatus]:
    try:
        backends = registry.device_backends()
        owners = registry.owners("fastdeploy_device_backends")
    except FastDeployError as exc:
        errors["fastdeploy_device_backends"] = str(exc)
        return []
    statuses = []
    for name, backend_class in sorted(backends.items()):
        details = None
        try:
            reason = backend_class.unavailable_reason()
            if reason is None:
                details = backend_class.runtime_details()
        except Exception as exc:  # a broken backend plugin is reported, not fatal
            reason = f"{backend_class.__name__} raised {type(exc).__name__}: {exc}"
        statuses.append(
            BackendStatus(
                name, owners.get(name, "?"), reason is None, reason, backend_class.auto_priority, details
            )
        )
    return statuses


def media_fetch_defaults() -> dict[str, Any]:
    """What a server or `LLM` fetches for a request's media URLs unless its options say otherwise
    (the keys are the `LLM(...)` keywords; docs/serving.md, "Media URLs")."""
    policy = FetchPolicy()
    return {
        "allow_media_url_fetch": True,
        "allowed_media_domains": None,
        "media_allow_private_networks": policy.allow_private_networks,
        "media_url_no_redirects": policy.max_redirects == 0,
        "max_redirects": policy.max_redirects,
        "timeout_s": policy.timeout,
        "max_bytes": policy.max_bytes,
        "max_fetches_in_flight": MAX_FETCHES_IN_FLIGHT,
    }


def collect_environment(registry: PluginRegistry) -> EnvironmentReport:
    """Everything `fastdeploy env` shows, as data."""
    errors: dict[str, str] = {}
    components: dict[str, dict[str, str]] = {}
    for hook in (
        "fastdeploy_model_architectures",
        "fastdeploy_reasoning_parsers",
        "fastdeploy_tool_call_parsers",
        "fastdeploy_chat_templates",
        "fastdeploy_communicators",
        "fastdeploy_multimodal_processors",
    ):
        try:
            components[hook] = dict(sorted(registry.owners(hook).items()))
        except FastDeployError as exc:
            errors[hook] = str(exc)
    for hook, getter in (
        ("fastdeploy_weight_loaders", registry.weight_loaders),
        ("fastdeploy_tokenizer_loaders", registry.tokenizer_loaders),
    ):
        try:
            components[hook] = {loader.name: f"priority {loader.priority}" for loader in getter()}
        except FastDeployError as exc:
            errors[hook] = str(exc)
    backends = _backend_statuses(registry, errors)
    available = [status for status in backends if status.available]
    auto = max(available, key=lambda status: status.auto_priority).name if available else None
    return EnvironmentReport(
        fastdeploy_version=__version__,
        python=sys.version.split()[0],
        platform=platform.platform(),
        plugins=list(registry.plugins),
        backends=backends,
        auto_device=auto,
        components=components,
        errors=errors,
        env={name: os.environ[name] for name in ENV_VARS if name in os.environ},
        media_fetch=media_fetch_defaults(),
    )


_TITLES = {
    "fastdeploy_model_architectures": "Model architectures",
    "fastdeploy_reasoning_parsers": "Reasoning parsers",
    "fastdeploy_tool_call_parsers": "Tool-call parsers",
    "fastdeploy_chat_templates": "Chat templates",
    "fastdeploy_communicators": "Communicators (collectives of tensor / pipeline parallel ranks)",
    "fastdeploy_multimodal_processors": "Multimodal processors",
    "fastdeploy_weight_loaders": "Weight loaders",
    "fastdeploy_tokenizer_loaders": "Tokenizer loaders",
}


def _width(names: list[str], minimum: int) -> int:
    """A column wide enough for every name, so long names never shift the next column."""
    return max([minimum, *map(len, names)])


def _media_fetch_lines(media: dict[str, Any]) -> list[str]:
    if not media:
        return []
    domains = media["allowed_media_domains"]
    redirects = (
        "refused" if media["media_url_no_redirects"] else f"up to {media['max_redirects']}, each hop checked"
    )
    rows = [
        (
            "fetch http(s) URLs",
            "on" if media["allow_media_url_fetch"] else "off",
            "--disable-media-url-fetch",
        ),
        ("allowed hosts", ", ".join(domains) if domains else "any public host", "--allowed-media-domains"),
        (
            "private networks",
            "fetched" if media["media_allow_private_networks"] else "refused",
            "--media-allow-private-networks",
        ),
        ("redirects", redirects, "--media-url-no-redirects"),
    ]
    lines = ["Media URLs in requests (defaults; `fastdeploy serve` flags and LLM(...) keywords change them):"]
    lines += [f"  {name:<20} {value:<30} {flag}" for name, value, flag in rows]
    lines.append(
        f"  {'limits':<20} {media['timeout_s']:g} s, {media['max_bytes']} bytes, "
        f"{media['max_fetches_in_flight']} in flight per process"
    )
    return lines


def format_environment(report: EnvironmentReport) -> str:
    """The report as text for a terminal."""
    lines = [
        f"fastdeploy {report.fastdeploy_version} (Python {report.python}, {report.platform})",
        "",
        f"Device backends (device='auto' picks: {report.auto_device or 'none available'}):",
    ]
    device = _width([status.name for status in report.backends], 10)
    for status in report.backends:
        state = "available" if status.available else "unavailable"
        lines.append(
            f"  {status.name:<{device}} {state:<11} plugin {status.plugin}, auto priority {status.auto_priority}"
        )
        if status.reason:
            lines.append(f"  {'':<{device}} why: {status.reason}")
        if status.details:
            lines.append(f"  {'':<{device}} runs: {status.details}")
    lines += ["", "Plugins (entry points of group 'fastdeploy.plugins'):"]
    name = _width([plugin.name for plugin in report.plugins], 32)
    for plugin in report.plugins:
        kind = "built-in" if plugin.builtin else "third-party"
        state = "loaded" if plugin.loaded else f"NOT LOADED: {plugin.error}"
        lines.append(f"  {plugin.name:<{name}} {kind:<11} {plugin.distribution}: {state}")
    for hook, title in _TITLES.items():
        entries = report.components.get(hook, {})
        name = _width(list(entries), 32)
        lines += ["", f"{title}:"]
        lines += [f"  {entry:<{name}} {owner}" for entry, owner in entries.items()] or ["  (none)"]
    lines += ["", *_media_fetch_lines(report.media_fetch)]
    if report.errors:
        lines += ["", "Errors:"]
        lines += [f"  {hook}: {error}" for hook, error in report.errors.items()]
    if report.env:
        lines += ["", "Environment:"]
        lines += [f"  {name}={value}" for name, value in report.env.items()]
    return "\n".join(lines) + "\n"
