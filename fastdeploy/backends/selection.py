"""Resolves `device=` to a registered backend class and builds it."""

from __future__ import annotations

import dataclasses

from fastdeploy.backends.base import Backend, BackendOptions
from fastdeploy.errors import BackendUnavailableError, InvalidArgumentError
from fastdeploy.logger import get_logger
from fastdeploy.plugins.registry import PluginRegistry

logger = get_logger(__name__)


def select_backend_class(device: str, registry: PluginRegistry) -> type[Backend]:
    """The backend class for `device` ("auto" = best available), or an error saying why not."""
    backends = registry.device_backends()
    if device == "auto":
        available = [cls for cls in backends.values() if cls.unavailable_reason() is None]
        if not available:
            raise BackendUnavailableError("no registered device backend is available on this machine")
        return max(available, key=lambda cls: cls.auto_priority)
    if device not in backends:
        known = ", ".join(sorted(backends)) or "none"
        raise InvalidArgumentError(
            f"device {device!r} is not a registered backend (registered: {known}, or 'auto')"
        )
    backend_class = backends[device]
    reason = backend_class.unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(f"the {device} backend cannot run here: {reason}")
    return backend_class


def create_backend(device: str, options: BackendOptions, registry: PluginRegistry) -> Backend:
    """Build the backend for `device`; dtype "auto" becomes the backend's default dtype."""
    return build_backend_of(select_backend_class(device, registry), options)


def build_backend_of(backend_class: type[Backend], options: BackendOptions) -> Backend:
    """Build an already selected backend class; dtype "auto" becomes its default dtype."""
    if options.dtype == "auto":
        options = dataclasses.replace(options, dtype=backend_class.resolve_default_dtype())
    backend = backend_class(options)
    logger.info("device backend: %s", backend.describe())
    return backend
