"""A device backend written exactly as the 0.1 docs described keeps working through the adapter.

`tests/plugins/legacy_backend` is such a plugin package: it subclasses `Backend` without declaring
`capabilities`, announces device sampling with the `samples_on_device` flag and beam search's
block copies by overriding `copy_kv_blocks`. It is installed here as pip would install it (a
distribution on sys.path whose entry point names its hook module), then run through the whole
conformance suite and a greedy generation against a numpy forward pass.
"""

from __future__ import annotations

import logging
import os
import textwrap

import numpy as np
import pytest

from fastdeploy.plugins.api import ALL_CHECKS, Backend, Capability, build_backend, check_greedy_generation
from fastdeploy.plugins.registry import get_registry, reset_registry

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "legacy_backend")
DEVICE = "legacy-numpy"


@pytest.fixture(scope="module", autouse=True)
def installed(tmp_path_factory):
    """The package's distribution metadata (its pyproject's entry point) on sys.path."""
    site = tmp_path_factory.mktemp("site")
    info = site / "fastdeploy_legacy_backend-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastdeploy-legacy-backend\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [fastdeploy.plugins]
            legacy_backend = fastdeploy_legacy_backend.plugin
            """
        )
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("FD_PLUGINS", raising=False)
        patch.syspath_prepend(str(site))
        patch.syspath_prepend(PACKAGE)
        reset_registry()
        yield
    reset_registry()


@pytest.fixture(scope="module")
def backend_class() -> type[Backend]:
    return get_registry().device_backends()[DEVICE]


def test_the_adapter_reads_the_flags_and_overrides_into_capabilities(backend_class):
    assert backend_class.capabilities == {Capability.DEVICE_SAMPLING, Capability.KV_BLOCK_COPY}
    assert backend_class.supports(Capability.KV_BLOCK_COPY)
    assert not backend_class.supports(Capability.TOKEN_BITMASK)
    assert backend_class.samples_on_device and not backend_class.overlaps_host


#: optional capabilities added after the 0.1 contract, which a backend written against it cannot offer
POST_0_1_CAPABILITIES = {
    "kv_block_transfer",
    "lora",
    "latent_attention",
    "attention_sinks",
    "sliding_window",
    "attention_softcap",
}


@pytest.mark.parametrize("check", sorted(ALL_CHECKS))
def test_conformance(check):
    reason = ALL_CHECKS[check](build_backend(DEVICE, threads=1))
    if reason is not None:
        # graph capture: the only 0.1 feature it lacks; the rest came after the 0.1 contract
        assert check.split("/")[-1] in POST_0_1_CAPABILITIES | {"graph_capture"}, reason


def test_greedy_generation_matches_numpy_forward(tmp_path):
    assert len(check_greedy_generation(DEVICE, str(tmp_path / "tiny-llama"))) == 12


def test_a_missing_capability_logs_its_fallback_once_per_class(backend_class, caplog, monkeypatch):
    log = logging.getLogger("fastdeploy.backends.capabilities")  # fastdeploy's loggers do not propagate
    log.addHandler(caplog.handler)
    monkeypatch.setattr(log, "level", logging.INFO)

    class Fresh(backend_class):  # a class no other test has used: its first fallbacks
        pass

    backend = Fresh(build_backend(DEVICE).options)
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)
    bitmask = np.array([[0b0101]], dtype=np.int32)
    try:
        for _ in range(3):
            masked = backend.apply_token_bitmask(logits.copy(), bitmask, np.array([1]))
            backend.nonfinite_rows(logits)
    finally:
        log.removeHandler(caplog.handler)
    assert masked[1].tolist() == [4.0, -np.inf, 6.0, -np.inf]
    records = {id(r): r for r in caplog.records if r.name == "fastdeploy.backends.capabilities"}
    notes = [r.getMessage() for r in records.values()]
    assert len([n for n in notes if "Capability.TOKEN_BITMASK" in n]) == 1, notes
    assert len([n for n in notes if "Capability.DEVICE_ROW_REDUCTIONS" in n]) == 1, notes
    assert all(n.startswith("the legacy-numpy backend does not declare") for n in notes)
