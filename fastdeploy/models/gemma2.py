"""Gemma 2 (`Gemma2ForCausalLM`), registered with Gemma 3 by the built-in plugin in gemma3.py.

The Gemma decoder (gemma.py) with Gemma 2's choices: no q/k norms, every other layer sliding
(layer 0 slides, layer 1 is global, ... unless config.json lists `layer_types`), one rotary base
(`rope_theta`) for both kinds of layer, and soft-capping of the attention scores
(`attn_logit_softcapping`, which needs `Capability.ATTENTION_SOFTCAP`) and of the logits
(`final_logit_softcapping`).
"""

from __future__ import annotations

from fastdeploy.models.gemma import GemmaDecoder


class Gemma2ForCausalLM(GemmaDecoder):
    """Gemma 2 decoder."""

    default_rope_theta = 10000.0

    def global_every(self) -> int:
        return 2
