"""`kv_cache_dtype`: what a block costs, the engine end to end in each element type, and refusals.

The kernels' numerics (attention over float16 / bfloat16 / int8 caches against a reference that
attends over independently rounded values) are tested in test_cpu_ops.py (numpy path) and
test_native_kernels.py (each instruction set); here the whole engine runs each type.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.base import KVCacheSpec
from fastdeploy.backends.cpu import native
from fastdeploy.config import EngineConfig
from fastdeploy.errors import InvalidArgumentError

PROMPT = "The capital of France is Paris. The capital of Germany is"


@pytest.mark.parametrize(
    ("dtype", "expected"),
    # 2 (keys, values) x 2 layers x 4 positions x 3 kv heads x (8 elements [+ a float32 scale])
    [("float32", 2 * 2 * 4 * 3 * 32), ("float16", 2 * 2 * 4 * 3 * 16), ("bfloat16", 2 * 2 * 4 * 3 * 16)]
    + [("int8", 2 * 2 * 4 * 3 * (8 + 4))],
)
def test_bytes_per_block(dtype, expected):
    spec = KVCacheSpec(num_layers=2, num_blocks=1, block_size=4, num_kv_heads=3, head_dim=8, dtype=dtype)
    assert spec.bytes_per_block() == expected


def generate(kv_cache_dtype: str) -> tuple[LLM, object]:
    llm = LLM(max_model_len=256, max_num_seqs=2, kv_cache_dtype=kv_cache_dtype)
    params = SamplingParams(temperature=0, max_tokens=3, logprobs=1)
    (output,) = llm.generate(PROMPT, params, use_tqdm=False)
    return llm, output.outputs


@pytest.mark.skipif(native.unavailable_reason() is not None, reason="no native kernels")
def test_the_engine_caches_in_each_dtype():
    """Same greedy continuation as the float32 cache, logprob of its first token within 0.05, and the
    cache really is of the asked type (arrays and the planned block size). The numpy path's numerics
    are tested against the same reference in test_cpu_ops.py (end to end it is too slow for here)."""
    llm, exact = generate("auto")
    assert llm.llm_engine.kv_cache_spec.dtype == "float32"
    token = exact.token_ids[0]
    stored = {"float16": np.float16, "bfloat16": np.uint16, "int8": np.int8}
    for kv_cache_dtype, element in stored.items():
        llm, outputs = generate(kv_cache_dtype)
        assert llm.llm_engine.kv_cache_spec.dtype == kv_cache_dtype
        assert llm.llm_engine.runner.kv_caches[0].keys.dtype == np.dtype(element)
        assert outputs.text == exact.text == " Berlin. The", kv_cache_dtype
        assert abs(outputs.logprobs[0][token] - exact.logprobs[0][token]) < 0.05, kv_cache_dtype


def test_unknown_kv_cache_dtype_is_refused():
    message = "kv_cache_dtype must be one of auto, float32, float16, bfloat16, int8; got 'fp8'"
    with pytest.raises(InvalidArgumentError, match=message):
        EngineConfig(model="m", kv_cache_dtype="fp8")
    with pytest.raises(InvalidArgumentError, match=message):
        LLM(kv_cache_dtype="fp8")


def test_a_backend_that_cannot_cache_in_the_dtype_refuses_it():
    pytest.importorskip("torch", reason="the torch-cpu backend needs torch (the test extra installs it)")
    with pytest.raises(
        InvalidArgumentError,
        match=r"kv_cache_dtype='int8' cannot run on this backend .*it caches in: auto, float32",
    ):
        LLM(device="torch-cpu", kv_cache_dtype="int8")
