"""Refusing contexts longer than a checkpoint's attention window, which is not implemented.

A model whose config.json sets `sliding_window` attends only to that many previous tokens;
within the window that equals full causal attention, so the engine runs such a model only with
`max_model_len` no longer than the window.
"""

from __future__ import annotations

from fastdeploy.plugins.api import ModelConfig, UnsupportedModelError


def check_within_window(config: ModelConfig, max_positions: int) -> None:
    """Raise UnsupportedModelError when `sliding_window` is set and `max_positions` exceeds it."""
    window = config.raw.get("sliding_window")
    if window and max_positions > int(window):
        raise UnsupportedModelError(
            f"{config.architecture} with sliding_window={window} is not supported beyond the window; "
            f"pass max_model_len <= {window}"
        )
