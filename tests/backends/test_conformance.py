"""The backend conformance suite, run for each device in FD_CONFORMANCE_DEVICES.

Default: the cpu backend with its native kernels (the CPU's widest instruction set, and AVX2:
"cpu+avx2") and with numpy only ("cpu+numpy"), the cuda backend's code on the host with each of
its runtimes ("paddle-cpu", "torch-cpu") with the reference kernels, and the same with the
Triton kernels run by Triton's interpreter ("paddle-cpu+triton", "torch-cpu+triton"). A plugin
author runs it against their backend with
`FD_CONFORMANCE_DEVICES=mydevice pytest tests/backends/test_conformance.py`.
"""

from __future__ import annotations

import os

import pytest

from fastdeploy.backends.conformance import CAPABILITY_CHECKS, OP_CHECKS, PLATFORM_CHECKS, build_backend
from fastdeploy.backends.cpu import native
from fastdeploy.plugins.api import check_greedy_generation

DEFAULT_DEVICES = "cpu,cpu+avx2,cpu+numpy,paddle-cpu,paddle-cpu+triton,torch-cpu,torch-cpu+triton"
DEVICES = [
    d.strip() for d in os.environ.get("FD_CONFORMANCE_DEVICES", DEFAULT_DEVICES).split(",") if d.strip()
]


@pytest.fixture(scope="module", params=DEVICES)
def device(request):
    """The device name; "+triton" selects the cuda backend's Triton kernels (interpreted),
    "cpu+numpy" the cpu backend without its native kernels."""
    name, _, kernels = request.param.partition("+")
    if name.startswith("paddle"):
        pytest.importorskip(
            "paddle", reason="the Paddle backends need paddlepaddle (the test extra installs it)"
        )
    if name.startswith("torch"):
        pytest.importorskip("torch", reason="the torch-cpu backend needs torch (the test extra installs it)")
    with pytest.MonkeyPatch.context() as patch:
        if kernels and name == "cpu":
            if kernels in native.ISAS and native.unavailable_reason() is not None:
                pytest.skip(f"native kernels: {native.unavailable_reason()}")
            patch.setenv("FD_CPU_KERNELS", kernels)
        elif kernels:
            pytest.importorskip("triton", reason="Triton kernels need triton (the test extra installs it)")
            pytest.importorskip(
                "torch", reason="Triton's interpreter needs torch (the test extra installs it)"
            )
            patch.setenv("FD_CUDA_KERNELS", kernels)
        yield name


@pytest.fixture(scope="module")
def backend(device):
    return build_backend(device, threads=2)


@pytest.mark.parametrize("check", sorted(PLATFORM_CHECKS))
def test_platform(backend, check):
    PLATFORM_CHECKS[check](backend)


@pytest.mark.parametrize("check", sorted(OP_CHECKS))
def test_op(backend, check):
    reason = OP_CHECKS[check](backend)
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize(
    "capability", sorted(CAPABILITY_CHECKS, key=lambda c: c.value), ids=lambda c: c.value
)
def test_capability(backend, capability):
    """A declared capability's methods match numpy; an undeclared one's portable default does
    too, or the check says why it cannot run."""
    reason = CAPABILITY_CHECKS[capability](backend)
    if reason is not None:
        pytest.skip(reason)


def test_greedy_generation_matches_numpy_forward(device, tmp_path):
    tokens = check_greedy_generation(device, str(tmp_path / "tiny-llama"))
    assert len(tokens) == 12


def test_variants_use_the_kernels_they_name(backend, device):
    """Guards the parametrisation: "+triton" must not silently fall back to reference kernels, nor
    "cpu+numpy" run the native ones."""
    if device == "cpu":
        requested = os.environ.get("FD_CPU_KERNELS", "auto")
        if requested == "numpy" or native.unavailable_reason() is not None:
            assert backend.native_isa is None
        else:
            assert backend.native_isa == (native.best_isa() if requested == "auto" else requested)
        return
    if not device.startswith(("paddle", "torch")):
        pytest.skip("only the cpu and cuda backends have a kernel choice")
    expected = os.environ.get("FD_CUDA_KERNELS") or ("triton" if backend.on_gpu else "reference")
    assert backend.kernels == expected
    assert (backend.launch is not None) == (expected == "triton")
