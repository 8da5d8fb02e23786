"""Qwen2 and Qwen3: Llama-shaped decoders, registered as a built-in plugin.

Qwen2 adds biases to the q/k/v projections (not to o_proj). Qwen3 drops those biases (unless
`attention_bias`) and normalises each query and key head with its own RMSNorm before rotary.
Both are checked against transformers' implementations by tests/models.
"""

from __future__ import annotations

from fastdeploy.models.llama import LlamaForCausalLM, ProjectionBiases
from fastdeploy.plugins.api import Backend, ModelConfig, ModelParallel, UnsupportedModelError, hookimpl


def _check_sliding_window(config: ModelConfig, max_positions: int) -> None:
    """Sliding-window attention is not implemented; it only matters past the window."""
    raw = config.raw
    window = raw.get("sliding_window")
    if raw.get("use_sliding_window") and window and max_positions > int(window):
        raise UnsupportedModelError(
            f"{config.architecture} with use_sliding_window=true (window {window}) is not supported "
            f"beyond the window; pass max_model_len <= {window}"
        )


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: q/k/v projections with biases."""

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        _check_sliding_window(config, max_positions)
        super().__init__(config, backend, max_positions, parallel)

    def sliding_window(self, max_positions: int) -> int:
        """0: Qwen's `sliding_window` applies only with `use_sliding_window`, refused past the window."""
        return 0

    def projection_biases(self) -> ProjectionBiases:
        return ProjectionBiases(qkv=True, o_proj=False, mlp=False)


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    """Qwen3: per-head q/k RMSNorm; biases only with `attention_bias`."""

    def projection_biases(self) -> ProjectionBiases:
        attention = bool(self.config.raw.get("attention_bias", False))
        return ProjectionBiases(qkv=attention, o_proj=attention, mlp=False)

    def has_qk_norm(self) -> bool:
        return True


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return {"Qwen2ForCausalLM": Qwen2ForCausalLM, "Qwen3ForCausalLM": Qwen3ForCausalLM}
