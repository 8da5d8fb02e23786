"""Picks the communicator a backend's ranks use, and fails early when its runtime is missing."""

from __future__ import annotations

import os

from fastdeploy.backends.base import Backend
from fastdeploy.errors import DistributedInitError, InvalidArgumentError
from fastdeploy.logger import get_logger
from fastdeploy.parallel.communicator import Communicator, RendezvousInfo
from fastdeploy.plugins.registry import PluginRegistry

logger = get_logger(__name__)


def communicator_class(backend_class: type[Backend], registry: PluginRegistry) -> type[Communicator]:
    """The registered communicator `FD_COMMUNICATOR` or the backend names; errors say what to install."""
    name = os.environ.get("FD_COMMUNICATOR", "").strip() or backend_class.default_communicator()
    communicators = registry.communicators()
    if name not in communicators:
        known = ", ".join(sorted(communicators)) or "none"
        raise InvalidArgumentError(
            f"communicator {name!r} (asked for by {'FD_COMMUNICATOR' if os.environ.get('FD_COMMUNICATOR') else f'the {backend_class.name} backend'}) "
            f"is not registered (registered: {known})"
        )
    cls = communicators[name]
    reason = cls.unavailable_reason()
    if reason is not None:
        raise DistributedInitError(f"more than one rank needs the {name!r} communicator: {reason}")
    return cls


def create_communicator(
    backend: Backend, rendezvous: RendezvousInfo, registry: PluginRegistry
) -> Communicator:
    cls = communicator_class(type(backend), registry)
    communicator = cls(backend, rendezvous)
    logger.info(
        "rank %d of %d joined the %s communicator at %s",
        rendezvous.rank,
        rendezvous.world_size,
        cls.name,
        rendezvous.master,
    )
    return communicator
