"""`Platform.weight_layout`: the backend, not the generic load-time quantiser, chooses the form
`quantization=` gives its linear weights, per method.

A third-party backend written against the `weight_packing` attribute alone gets that form for
every method, whatever the cpu backend's settings (`FD_CPU_ACTIVATIONS`); one that overrides the
hook gets its per-method choice, in the loader and in the construction-time shape check; the cpu
backend asks for per-channel wint8 under int8 activations. Models are loaded on the numpy backend
of tests/plugins/legacy_backend (it dequantises whatever reaches it) with a recording
`linear_weight`; the expected per-channel levels are computed here from the float weights.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.backends.platform import WEIGHT_LAYOUTS
from fastdeploy.backends.types import BackendOptions
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.weight_only import WeightOnlyTensor
from fastdeploy.model_executor.model_loader import (
    build_model,
    check_model_quantization,
    inspect_checkpoint,
    weight_layout,
)
from fastdeploy.model_executor.quantization import quantize_tensors
from fastdeploy.plugins.registry import get_registry

PACKAGE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins", "legacy_backend"
)


@pytest.fixture(scope="module")
def numpy_backend_class() -> type:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(PACKAGE)
        return importlib.import_module("fastdeploy_legacy_backend.backend").LegacyNumpyBackend


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny Llama (hidden 64, intermediate 128, tied head) as the loader sees it."""
    directory = tmp_path_factory.mktemp("tiny")
    tiny_llama(str(directory))
    return inspect_checkpoint(str(directory), get_registry())


def recording(base: type, **attributes) -> type:
    """`base` with `attributes` set and every `linear_weight` part's form recorded in `forms`."""

    def linear_weight(self, *parts):
        self.forms.extend(
            part.type_name
            if isinstance(part, GGMLTensor)
            else part.kind
            if isinstance(part, WeightOnlyTensor)
            else "float"
            for part in parts
        )
        return base.linear_weight(self, *parts)

    return type("Recording", (base,), {"name": "recording", "linear_weight": linear_weight, **attributes})


def loaded_forms(backend_class: type, checkpoint, quantization: str, group_size: int = 64) -> set[str]:
    backend = backend_class(BackendOptions(threads=1))
    backend.forms = []
    build_model(
        checkpoint, backend, 32, get_registry(), quantization=quantization, quantization_group_size=group_size
    )
    return set(backend.forms)


#: (weight_packing, quantization) -> the forms of the linear weights (layers, then the tied head)
PACKED = {
    ("ggml", "wint8"): {"Q8_0"},
    ("ggml", "wint4"): {"Q4_1", "Q8_0"},
    ("weight_only", "wint8"): {"wint8"},
    ("weight_only", "wint4"): {"wint4", "wint8"},
}


@pytest.mark.parametrize("activations", ["float32", "int8"])
@pytest.mark.parametrize(("packing", "quantization"), list(PACKED))
def test_a_backend_with_only_weight_packing_gets_it_for_every_method(
    numpy_backend_class, checkpoint, monkeypatch, activations, packing, quantization
):
    # the cpu backend's activation setting is no business of another backend's weights
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", activations)
    backend_class = recording(numpy_backend_class, weight_packing=packing)
    assert "weight_layout" not in vars(backend_class)
    assert weight_layout(backend_class, quantization) == packing
    check_model_quantization(quantization, 64, checkpoint, backend_class)
    assert loaded_forms(backend_class, checkpoint, quantization) == PACKED[packing, quantization]


def test_the_hook_chooses_per_method_in_the_loader_and_the_shape_check(numpy_backend_class, checkpoint):
    def per_method(cls, quantization: str) -> str:
        return "weight_only" if quantization == "wint4" else "ggml"

    backend_class = recording(numpy_backend_class, weight_layout=classmethod(per_method))
    assert backend_class.weight_packing == "ggml"  # the attribute stays as declared; the hook decides
    assert loaded_forms(backend_class, checkpoint, "wint8") == {"Q8_0"}
    assert loaded_forms(backend_class, checkpoint, "wint4") == {"wint4", "wint8"}
    # wint4 groups of 128 do not divide hidden 64: refused where the hook says "weight_only" ...
    with pytest.raises(InvalidArgumentError, match=r"quantization_group_size=128 .* hidden_size = 64"):
        check_model_quantization("wint4", 128, checkpoint, backend_class)
    # ... and not where every method is GGML blocks, which have no groups
    check_model_quantization("wint4", 128, checkpoint, recording(numpy_backend_class))
    check_model_quantization(None, 128, checkpoint, backend_class)


def test_a_layout_outside_the_contract_is_named(numpy_backend_class, checkpoint):
    backend_class = recording(numpy_backend_class, weight_packing="int8_blocks")
    with pytest.raises(ValueError, match=r"backend 'recording': weight_layout\('wint8'\) is 'int8_blocks'"):
        check_model_quantization("wint8", 64, checkpoint, backend_class)
    with pytest.raises(ValueError, match="expected one of ggml, weight_only, weight_only_32"):
        loaded_forms(backend_class, checkpoint, "wint8")
    with pytest.raises(ValueError, match="unknown weight layout 'int8_blocks'"):
        list(quantize_tensors([], "wint8", False, "test", "int8_blocks"))


@pytest.mark.parametrize(
    ("activations", "wint8", "wint4"),
    [("float32", "ggml", "ggml"), ("int8", "weight_only_32", "ggml")],
)
def test_the_cpu_backend_asks_for_per_channel_wint8_under_int8_activations(
    monkeypatch, activations, wint8, wint4
):
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", activations)
    assert CpuBackend.weight_layout("wint8") == wint8
    assert CpuBackend.weight_layout("wint4") == wint4
    assert {wint8, wint4} <= set(WEIGHT_LAYOUTS)


def test_weight_only_32_quantises_block_widths_per_channel_and_keeps_the_rest_float():
    rng = np.random.default_rng(7)
    tensors = {
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((16, 64)).astype(np.float32),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((64, 48)).astype(np.float32),  # 48 % 32
        "lm_head.weight": rng.standard_normal((40, 64)).astype(np.float16),
    }
    out = dict(quantize_tensors(tensors.items(), "wint8", False, "test", "weight_only_32"))
    assert out["model.layers.0.mlp.down_proj.weight"] is tensors["model.layers.0.mlp.down_proj.weight"]
    for name in ("model.layers.0.mlp.up_proj.weight", "lm_head.weight"):
        matrix = tensors[name].astype(np.float32)
        scales = np.abs(matrix).max(axis=1) / 127
        assert isinstance(out[name], WeightOnlyTensor) and out[name].kind == "wint8"
        np.testing.assert_allclose(out[name].scales, scales, rtol=1e-6)
        # levels [in, out]: each weight rounded to its channel's nearest step
        np.testing.assert_array_equal(out[name].qweight.T, np.rint(matrix / scales[:, None]))
