"""The adapter for backends written against the 0.1 contract (docs/plugins.md before 0.2).

Such a backend subclasses `Backend` without declaring `capabilities`: it announced device sampling
and overlapping passes with the class flags `samples_on_device` / `overlaps_host`, and every other
optional feature by overriding the method (the engine compared method identity, or caught
`NotImplementedError`). `legacy_capabilities` reads those signs once, when the class is created,
into the one declaration the engine queries (`Backend.supports`). Deprecated until 0.3: declare
`capabilities` instead.
"""

from __future__ import annotations

from fastdeploy.backends.capabilities import Capability, implemented_methods
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: capabilities the 0.1 contract announced with a class flag rather than by overriding
FLAGS = {Capability.DEVICE_SAMPLING: "samples_on_device", Capability.OVERLAPS_HOST: "overlaps_host"}


def legacy_capabilities(backend_class: type, base: type) -> frozenset[Capability]:
    """What an undeclared `backend_class` offers, read from its 0.1-style flags and overrides of
    `base`'s default methods."""
    found = set()
    for capability in Capability:
        flag = FLAGS.get(capability)
        if flag is not None:
            if getattr(backend_class, flag, False):
                found.add(capability)
        elif implemented_methods(backend_class, base, capability):
            found.add(capability)
    if found:
        logger.debug(
            "backend class %s declares no capabilities (deprecated until 0.3); read from its overrides: %s",
            backend_class.__qualname__,
            ", ".join(sorted(capability.name for capability in found)),
        )
    return frozenset(found)
