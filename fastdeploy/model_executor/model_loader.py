"""Builds a model from a checkpoint: picks the weight loader and architecture through plugins."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastdeploy.backends.base import Backend
from fastdeploy.backends.platform import WEIGHT_LAYOUTS, Platform
from fastdeploy.config import EngineConfig, ModelConfig
from fastdeploy.errors import InvalidArgumentError, UnsupportedModelError, WeightLoadError
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.loaders.base import WeightLoader
from fastdeploy.model_executor.quantization import (
    check_quantization_shapes,
    fp8_block_checkpoint,
    pair_fp8_scales,
    quantize_tensors,
)
from fastdeploy.models.base import CausalLM, WeightShapeError
from fastdeploy.parallel.model_parallel import ModelParallel
from fastdeploy.plugins.registry import PluginRegistry, first_that_can_load

logger = get_logger(__name__)


@dataclass
class CheckpointInfo:
    """A checkpoint's loader and configuration, read before any weights."""

    path: str
    loader: WeightLoader
    config: ModelConfig


def inspect_checkpoint(model_path: str, registry: PluginRegistry) -> CheckpointInfo:
    loader = first_that_can_load(registry.weight_loaders(), model_path, "weight loader")
    config = ModelConfig.from_hf_dict(loader.load_config(model_path))
    return CheckpointInfo(model_path, loader, config)


def check_backend_quantization(quantization: str | None, backend: Backend) -> None:
    """Refuse a quantisation the backend does not run, naming what it does run."""
    supported = backend.supported_quantizations()
    if quantization is not None and quantization not in supported:
        runs = ", ".join(supported) or "no weight quantisation"
        reason = backend.quantization_refusal(quantization)
        if reason is not None:
            raise InvalidArgumentError(f"{reason}; this backend ({backend.describe()}) runs: {runs}")
        raise InvalidArgumentError(
            f"quantization={quantization!r} cannot run on this backend ({backend.describe()}); it runs: {runs}"
        )


def weight_layout(backend: type[Platform] | Platform, quantization: str) -> str:
    """The backend's `weight_layout(quantization)`, checked against `WEIGHT_LAYOUTS` (a plugin's
    typo named here, not a silent fall back to GGML blocks)."""
    layout = backend.weight_layout(quantization)
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(
            f"backend {backend.name!r}: weight_layout({quantization!r}) is {layout!r}; expected one of "
            f"{', '.join(WEIGHT_LAYOUTS)} (its weight_packing is {backend.weight_packing!r})"
        )
    return layout


def check_model_quantization(
    quantization: str | None, group_size: int, checkpoint: CheckpointInfo, backend_class: type[Platform]
) -> None:
    """Refuse a quantisation the model's shapes do not allow (wint4 groups), from its config, in
    the layout the device backend's class chooses for it."""
    if quantization is not None:
        layout = weight_layout(backend_class, quantization)
        check_quantization_shapes(quantization, group_size, checkpoint.config, layout)


def check_backend_kv_cache_dtype(config: EngineConfig, backend: Backend) -> None:
    """Refuse a `kv_cache_dtype` the backend cannot cache in, naming what it can."""
    supported = backend.supported_kv_cache_dtypes()
    if config.kv_cache_dtype != "auto" and config.kv_cache_dtype not in supported:
        raise InvalidArgumentError(
            f"kv_cache_dtype={config.kv_cache_dtype!r} cannot run on this backend ({backend.describe()}); "
            f"it caches in: auto, {', '.join(supported)}"
        )


def model_class(checkpoint: CheckpointInfo, registry: PluginRegistry) -> type[CausalLM]:
    """The registered class of the checkpoint's architecture."""
    architectures = registry.model_architectures()
    name = checkpoint.config.architecture
    if name not in architectures:
        known = ", ".join(sorted(architectures)) or "none"
        raise UnsupportedModelError(
            f"architecture {name!r} of {checkpoint.path!r} is not registered by any plugin (registered: {known})"
        )
    return architectures[name]


def build_model(
    checkpoint: CheckpointInfo,
    backend: Backend,
    max_positions: int,
    registry: PluginRegistry,
    parallel: ModelParallel | None = None,
    quantization: str | None = None,
    quantization_group_size: int = 128,
) -> CausalLM:
    """Instantiate the registered architecture and load its weights (this rank's shard) onto the
    backend, quantising a float checkpoint's linear layers first when `quantization` is given (in
    the backend's `weight_layout` for it)."""
    cls = model_class(checkpoint, registry)
    name = checkpoint.config.architecture
    start = time.perf_counter()
    if parallel is not None and parallel.layout.distributed:
        model = cls(checkpoint.config, backend, max_positions, parallel=parallel)
    else:
        model = cls(checkpoint.config, backend, max_positions)
    tensors = checkpoint.loader.load_tensors(checkpoint.path)
    if fp8_block_checkpoint(checkpoint.config):
        tensors = pair_fp8_scales(tensors, checkpoint.path)
    if quantization is not None:
        tensors = quantize_tensors(
            tensors,
            quantization,
            checkpoint.config.tie_word_embeddings,
            checkpoint.path,
            weight_layout(backend, quantization),
            quantization_group_size,
        )
    try:
        model.load_weights(tensors)
    except WeightShapeError as error:
        message = checkpoint.loader.shape_error(checkpoint.path, error.wrong)
        if message is None:
            raise
        raise WeightLoadError(message) from None
    logger.info(
        "loaded %s from %s with the %s loader in %.1f s",
        name,
        checkpoint.path,
        checkpoint.loader.name,
        time.perf_counter() - start,
    )
    summary = backend.loaded_weights_summary()
    if summary is not None:
        logger.info("%s: %s", name, summary)
    return model
