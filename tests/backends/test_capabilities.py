"""Optional capabilities are declared once (`Backend.capabilities`) and queried once (`supports`)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fastdeploy.backends.base import Backend, BackendOptions
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.backends.cuda.backend import CudaBackend, TorchCpuBackend


def test_builtin_backends_declare_what_they_implement():
    assert CpuBackend.supports(Capability.FUSED_DECODER_LAYERS) and CpuBackend.supports(
        Capability.KV_BLOCK_COPY
    )
    assert not CpuBackend.supports(Capability.DEVICE_SAMPLING) and not CpuBackend.supports(
        Capability.OVERLAPS_HOST
    )
    assert TorchCpuBackend.supports(Capability.DEVICE_SAMPLING) and TorchCpuBackend.supports(
        Capability.OVERLAPS_HOST
    )
    assert CudaBackend.supports(Capability.GRAPH_CAPTURE) and not TorchCpuBackend.supports(
        Capability.GRAPH_CAPTURE
    )
    # the 0.1 flags mirror the declaration, for callers that still read them
    assert TorchCpuBackend.samples_on_device and not CpuBackend.samples_on_device


def test_declaring_a_capability_without_its_methods_is_an_error():
    with pytest.raises(
        TypeError, match="declares Capability.KV_BLOCK_COPY but implements none of its methods"
    ):

        class Boasting(CpuBackend):
            capabilities = CpuBackend.capabilities  # KV_BLOCK_COPY among them
            copy_kv_blocks = Backend.copy_kv_blocks


def test_a_subclass_of_a_legacy_backend_is_read_again():
    class Legacy(Backend):  # no declaration: 0.1 style
        pass

    class Sampling(Legacy):
        samples_on_device = True

        def copy_kv_blocks(self, kv_caches, pairs, block_size):
            """overridden: the adapter reads it as Capability.KV_BLOCK_COPY"""

    assert Legacy.capabilities == frozenset()
    assert Sampling.capabilities == {Capability.DEVICE_SAMPLING, Capability.KV_BLOCK_COPY}


def test_a_declared_capability_never_logs_a_fallback(caplog):
    backend = CpuBackend(BackendOptions(threads=1))
    logits = np.zeros((2, 40), dtype=np.float32)
    with caplog.at_level(logging.INFO):
        backend.apply_token_bitmask(logits, np.zeros((1, 2), dtype=np.int32), np.array([0]))
        backend.nonfinite_rows(logits)
    assert not [r for r in caplog.records if r.name == "fastdeploy.backends.capabilities"]
    assert np.isneginf(logits[0]).all() and not np.isneginf(logits[1]).any()
