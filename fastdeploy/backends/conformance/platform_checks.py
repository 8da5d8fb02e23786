"""The platform checks of the conformance suite: identity, availability, ranks, memory and the
capability declaration of a built backend."""

from __future__ import annotations

from collections.abc import Callable

from fastdeploy.backends.base import Backend
from fastdeploy.backends.capabilities import Capability, implemented_methods
from fastdeploy.config import KV_CACHE_DTYPES


def check_identity(backend: Backend) -> None:
    kind = type(backend)
    if not isinstance(kind.name, str) or not kind.name:
        raise AssertionError(f"platform: name must be a non-empty str, got {kind.name!r}")
    if not isinstance(kind.auto_priority, int):
        raise AssertionError(f"platform: auto_priority must be an int, got {kind.auto_priority!r}")
    if not isinstance(backend.describe(), str) or not backend.describe():
        raise AssertionError("platform: describe() must be a non-empty str")
    if not isinstance(kind.resolve_default_dtype(), str):
        raise AssertionError("platform: resolve_default_dtype() must be a dtype name")


def check_availability(backend: Backend) -> None:
    reason = type(backend).unavailable_reason()
    if reason is not None:
        raise AssertionError(f"platform: a built backend says it cannot run here: {reason!r}")
    details = type(backend).runtime_details()
    if details is not None and not isinstance(details, str):
        raise AssertionError(f"platform: runtime_details() must be None or a str, got {details!r}")


def check_ranks(backend: Backend) -> None:
    kind = type(backend)
    if not isinstance(kind.default_communicator(), str):
        raise AssertionError("platform: default_communicator() must name a fastdeploy_communicators entry")
    count = kind.device_count()
    if count is not None and (not isinstance(count, int) or count < 0):
        raise AssertionError(f"platform: device_count() must be None or an int >= 0, got {count!r}")
    if count:
        environment = kind.rank_environment(0)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in environment.items()):
            raise AssertionError(f"platform: rank_environment(0) must map str to str, got {environment!r}")


def check_memory(backend: Backend) -> None:
    free = backend.free_memory_bytes()
    if free <= 0:
        raise AssertionError("platform: free_memory_bytes() must be positive")
    total = backend.total_memory_bytes()
    if total is not None and total < free:
        raise AssertionError(f"platform: total_memory_bytes() {total} is below free_memory_bytes() {free}")
    unknown = set(backend.supported_kv_cache_dtypes()) - set(KV_CACHE_DTYPES)
    if unknown:
        raise AssertionError(f"platform: supported_kv_cache_dtypes() names unknown types {sorted(unknown)}")


def check_capability_declaration(backend: Backend) -> None:
    """Every declared capability is a `Capability` whose methods the backend implements."""
    for capability in type(backend).capabilities:
        if not isinstance(capability, Capability):
            raise AssertionError(f"capabilities: {capability!r} is not a Capability")
        if not implemented_methods(type(backend), Backend, capability):
            raise AssertionError(
                f"capabilities: Capability.{capability.name} is declared but not implemented"
            )


#: platform-level checks, each `check(backend) -> None`
PLATFORM_CHECKS: dict[str, Callable[[Backend], str | None]] = {
    "identity": check_identity,
    "availability": check_availability,
    "ranks": check_ranks,
    "memory": check_memory,
    "capability_declaration": check_capability_declaration,
}
