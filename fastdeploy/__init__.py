"""fastdeploy: LLM inference and serving with FastDeploy's API on pluggable device backends.

`LLM` and `SamplingParams` are imported on first access, so a plugin importing
`fastdeploy.plugins` does not pull in the whole engine.
"""

from typing import Any

from fastdeploy.version import __version__

__all__ = [
    "LLM",
    "GuidedDecodingParams",
    "PoolingParams",
    "SamplingParams",
    "StructuredOutputsParams",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from fastdeploy.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from fastdeploy.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "PoolingParams":
        from fastdeploy.engine.pooling_request import PoolingParams

        return PoolingParams
    if name in ("GuidedDecodingParams", "StructuredOutputsParams"):
        from fastdeploy.engine.guided import params

        return getattr(params, name)
    raise AttributeError(f"module 'fastdeploy' has no attribute {name!r}")
