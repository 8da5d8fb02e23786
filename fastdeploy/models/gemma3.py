"""Gemma 3 text models (`Gemma3ForCausalLM`: Gemma 3 1B and the text towers' checkpoints), and
the built-in plugin that registers them with Gemma 2 (gemma2.py).

The Gemma decoder (gemma.py) with Gemma 3's choices: per-head q/k RMSNorm before rotary; every
`sliding_window_pattern`-th layer global (unless config.json lists `layer_types`); two rotary
bases, `rope_local_base_freq` for the sliding layers and `rope_theta` with `rope_scaling` for the
global ones (or transformers 5's per-kind `rope_parameters`).
"""

from __future__ import annotations

from typing import Any

from fastdeploy.models.attention_window import SLIDING
from fastdeploy.models.gemma import GLOBAL, GemmaDecoder
from fastdeploy.models.gemma2 import Gemma2ForCausalLM
from fastdeploy.plugins.api import hookimpl, rope_tables


class Gemma3ForCausalLM(GemmaDecoder):
    """Gemma 3 text decoder."""

    def global_every(self) -> int:
        return int(self.config.raw.get("sliding_window_pattern", 6) or 6)

    def has_qk_norm(self) -> bool:
        return True

    def kind_rope(self, kind: str) -> tuple[Any, Any]:
        """Host (cos, sin) of the sliding or global layers (transformers 5's per-type
        `rope_parameters`, or the Hub's rope_theta / rope_local_base_freq / rope_scaling)."""
        raw = self.config.raw
        parameters = raw.get("rope_parameters")
        if isinstance(parameters, dict) and kind in parameters:
            scaling = dict(parameters[kind])
            base = float(scaling.pop("rope_theta"))
        elif kind == SLIDING:
            base, scaling = float(raw.get("rope_local_base_freq", 10000.0)), None
        else:
            base, scaling = float(raw.get("rope_theta", 1000000.0)), self.config.rope_scaling
        return rope_tables(base, self.head_dim, self.max_positions, scaling)

    def rotary_tables(self, freq_factors: Any | None) -> tuple[Any, Any]:
        return self.kind_rope(GLOBAL)


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return {"Gemma2ForCausalLM": Gemma2ForCausalLM, "Gemma3ForCausalLM": Gemma3ForCausalLM}
