"""The sliding window of a checkpoint's attention layers, as the backend can run it.

A model whose config.json sets `sliding_window` attends, in its sliding layers, only to the last
`sliding_window` positions of each query (transformers' mask: key position > query - window).
Within the window that equals full causal attention, so the window only binds when
`max_model_len` exceeds it; then the layers carry it (`AttentionBlock.window`) and the backend
must declare `Capability.SLIDING_WINDOW`, or the model is refused with the limit to pass instead.
"""

from __future__ import annotations

from fastdeploy.plugins.api import Backend, Capability, ModelConfig, UnsupportedModelError


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
