"""The sliding window of a checkpoint's attention layers, as the backend can run it.

A model whose config.json sets `sliding_window` attends, in its sliding layers, only to the last
`sliding_window` positions of each query (transformers' mask: key position > query - window).
Within the window that equals full causal attention, so the window only binds when
`max_model_len` exceeds it; then the layers carry it (`AttentionBlock.window`) and the backend
must declare `Capability.SLIDING_WINDOW`, or the model is refused with the limit to pass instead.
"""

from __future__ import annotations

from fastdeploy.plugins.api import (
    Backend,
    Capability,
    InvalidArgumentError,
    ModelConfig,
    UnsupportedModelError,
)

#: config.json's `layer_types` name of a sliding-window layer (Gemma 3, GPT-OSS)
SLIDING = "sliding_attention"


def sliding_window(config: ModelConfig, max_positions: int, backend: Backend) -> int:
    """The window the sliding layers attend over, or 0 where it never binds (no `sliding_window`,
    or `max_positions` within it); raises UnsupportedModelError where it binds and `backend` lacks
    `Capability.SLIDING_WINDOW`."""
    window = int(config.raw.get("sliding_window") or 0)
    if window <= 0 or max_positions <= window:
        return 0
    if not backend.supports(Capability.SLIDING_WINDOW):
        raise UnsupportedModelError(
            f"{config.architecture} with sliding_window={window} needs sliding-window attention beyond "
            f"the window, which the {backend.name} backend lacks (Capability.SLIDING_WINDOW); "
            f"pass max_model_len <= {window}"
        )
    return window


def sliding_layer_types(config: ModelConfig, full: str, every: int) -> list[str]:
    """Each layer's kind: config.json's `layer_types` (checked against the layer count and the two
    kinds `SLIDING` and `full`), else every `every`-th layer `full` and the others sliding."""
    layers = config.num_hidden_layers
    types = config.raw.get("layer_types")
    if types is None:
        return [SLIDING if (i + 1) % every else full for i in range(layers)]
    if len(types) != layers or set(types) - {SLIDING, full}:
        raise InvalidArgumentError(
            f"config.json: layer_types must list {layers} entries of {SLIDING!r} or {full!r}, got {types!r}"
        )
    return list(types)
