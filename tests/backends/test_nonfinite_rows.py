"""The cuda backend checks each pass's logits on the device: only one value per row crosses to the
host, in the logits' own dtype included (half-precision logits are not widened first).

Checked on torch CPU tensors (the torch runtime's host twin); the conformance suite's
`nonfinite_rows` check covers float32 on every device.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.conformance import build_backend

pytest.importorskip("torch", reason="torch-cpu needs torch")


@pytest.fixture(scope="module")
def backend():
    return build_backend("torch-cpu", threads=1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_only_row_maxima_cross_and_broken_rows_are_found(backend, dtype, monkeypatch):
    logits = np.ones((5, 40), dtype=np.float32)
    logits[1, 7] = np.nan
    logits[2, 39] = np.inf
    logits[3] = -np.inf
    logits[4, :30] = -np.inf  # masked tokens beside finite ones: a healthy row
    device_logits = backend.rt.cast(backend.from_numpy(logits), dtype)
    crossed, cast = [], []
    to_numpy, cast_to = backend.rt.to_numpy, backend.rt.cast

    def recording_to_numpy(tensor):
        crossed.append(tuple(tensor.shape))
        return to_numpy(tensor)

    def recording_cast(tensor, to):
        cast.append(tuple(tensor.shape))
        return cast_to(tensor, to)

    monkeypatch.setattr(backend.rt, "to_numpy", recording_to_numpy)
    monkeypatch.setattr(backend.rt, "cast", recording_cast)
    broken = backend.nonfinite_rows(device_logits)
    assert crossed == [(5,)]
    assert all(shape == (5,) for shape in cast)  # never a float32 copy of the whole logits
    assert np.asarray(broken).tolist() == [False, True, True, True, False]
