"""Registered placeholders for the accelerators FastDeploy supports and we have not implemented.

Each stub is a `Backend` subclass registered under its FastDeploy device name, so
`fastdeploy env` lists it and `LLM(device="xpu")` fails at construction with a message that
names the device and says what a vendor implements, instead of "unknown device". A real
backend plugin for one of these devices replaces the stub by registering the same name with a
higher `plugin_priority` (see docs/plugins.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fastdeploy.backends.base import Backend
from fastdeploy.errors import BackendUnavailableError
from fastdeploy.plugins.hookspecs import hookimpl


@dataclass(frozen=True)
class AcceleratorStub:
    """One accelerator fastdeploy knows the name of but has no backend for."""

    device: str
    vendor: str
    product: str


STUBS: tuple[AcceleratorStub, ...] = (
    AcceleratorStub("xpu", "KunlunXin", "XPU"),
    AcceleratorStub("dcu", "Hygon", "DCU"),
    AcceleratorStub("npu", "Ascend", "NPU"),
    AcceleratorStub("gcu", "Enflame", "GCU"),
    AcceleratorStub("iluvatar", "Iluvatar", "CoreX GPU"),
    AcceleratorStub("metax", "MetaX", "GPU"),
)


class StubBackend(Backend):
    """A backend that is registered and listed but never runs; subclasses name the device."""

    stub: ClassVar[AcceleratorStub]
    capabilities = frozenset()
    #: a real backend for the same device name should win; it only has to beat -1
    plugin_priority: ClassVar[int] = -1

    @classmethod
    def unavailable_reason(cls) -> str:
        stub = cls.stub
        return (
            f"not implemented: the {stub.vendor} {stub.product} backend (device {stub.device!r}) is a stub; "
            "implement fastdeploy.plugins.api.Backend (see docs/plugins.md) and register it via "
            "fastdeploy_device_backends"
        )

    def __new__(cls, *args: Any, **kwargs: Any) -> StubBackend:
        raise BackendUnavailableError(f"the {cls.name} backend cannot run: {cls.unavailable_reason()}")


def _stub_class(stub: AcceleratorStub) -> type[StubBackend]:
    class_name = f"{stub.device.capitalize()}StubBackend"
    return type(
        class_name,
        (StubBackend,),
        {"name": stub.device, "stub": stub, "__doc__": f"Placeholder for {stub.vendor} {stub.product}."},
    )


STUB_BACKENDS: dict[str, type[StubBackend]] = {stub.device: _stub_class(stub) for stub in STUBS}


@hookimpl
def fastdeploy_device_backends() -> dict[str, type]:
    return dict(STUB_BACKENDS)
