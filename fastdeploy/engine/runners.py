"""The engine each runner builds (`EngineConfig.runner`): `generate` an `LLMEngine`, which samples
tokens after the prompt; `pooling` a `PoolingEngine`, which embeds the prompt."""

from __future__ import annotations

from fastdeploy.config import EngineConfig
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.pooling_engine import PoolingEngine


def build_engine(config: EngineConfig) -> LLMEngine | PoolingEngine:
    """The engine of `config.runner`, built."""
    return PoolingEngine(config) if config.runner == "pooling" else LLMEngine(config)
