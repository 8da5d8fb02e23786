"""Optional backend capabilities: declared one way (`Backend.capabilities`), queried one way
(`Backend.supports`).

A capability is a group of optional `Backend` methods. A backend that declares it implements
those methods itself; one that does not gets the portable default, which runs on the host (or is
refused, where no portable form exists) and says so once per backend class in the log, so a new
backend is never silently slow.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fastdeploy.logger import get_logger

logger = get_logger(__name__)


class Capability(str, enum.Enum):
    """What a backend may offer beyond the required ops (see `CAPABILITY_SPECS` for each one's
    methods and what runs without it)."""

    #: `sample_top_k_top_p`: temperature / top-k / top-p sampling on the device
    DEVICE_SAMPLING = "device_sampling"
    #: `apply_token_bitmask`: guided decoding's token mask applied to device logits
    TOKEN_BITMASK = "token_bitmask"
    #: `copy_kv_blocks`: copy-on-write of KV blocks, which beam search needs
    KV_BLOCK_COPY = "kv_block_copy"
    #: `read_kv_blocks`, `write_kv_blocks`: KV blocks out of and into the cache as host arrays,
    #: which prefill/decode disaggregation moves between instances
    KV_BLOCK_TRANSFER = "kv_block_transfer"
    #: `decode_graphs`: captured decode steps (CUDA graphs)
    GRAPH_CAPTURE = "graph_capture"
    #: `attention_block`, `mlp_block`, `decoder_layers`: a decoder layer's halves in fused calls
    FUSED_DECODER_LAYERS = "fused_decoder_layers"
    #: `moe_route`, `moe_expert_weights`, `moe_experts`: mixture-of-experts routing and experts
    FUSED_MOE = "fused_moe"
    #: `greedy_tokens`, `feed_tokens`: passes run on a device queue while the host goes on, so the
    #: engine launches step N+1 before it reads step N's tokens (async scheduling)
    OVERLAPS_HOST = "overlaps_host"
    #: `argmax_rows`, `nonfinite_rows`: per-row reductions of device logits (one value per row
    #: crosses to the host instead of the logits)
    DEVICE_ROW_REDUCTIONS = "device_row_reductions"
    #: `encoder_attention`, `encoder_attention_qkv`, `quick_gelu`, `gelu`, `merge_rows`: the ops
    #: of vision encoders
    VISION_OPS = "vision_ops"
    #: `lora_stack`, `set_lora_slot`, `lora_rows`, `add_lora`: LoRA adapters' low-rank products,
    #: batched over the adapters of one pass (segmented by adapter)
    LORA = "lora"
    #: `windowed_attention`: attention over only each query's last `window` positions (sliding-
    #: window layers of Gemma 3, Mistral, Phi-3, Mixtral beyond their window)
    SLIDING_WINDOW = "sliding_window"
    #: `latent_attention`: multi-head latent attention (DeepSeek-V3) over a "latent" KV cache
    LATENT_ATTENTION = "latent_attention"
    #: `supported_quantizations`, `quantization_refusal`: linear weights kept packed (quantised at
    #: load with `quantization=`, or a quantised checkpoint's blocks) and multiplied in that form
    QUANTIZED_WEIGHTS = "quantized_weights"
    #: `attention_with_sinks`: paged attention with a learned per-head logit in the softmax
    #: denominator (GPT-OSS's attention sinks)
    ATTENTION_SINKS = "attention_sinks"
    #: `softcapped_attention`: paged attention whose scores are soft-capped, cap * tanh(score / cap),
    #: before the softmax (Gemma 2's `attn_logit_softcapping`), with or without a sliding window
    ATTENTION_SOFTCAP = "attention_softcap"


@dataclass(frozen=True)
class CapabilitySpec:
    """A capability's methods and what runs where a backend does not declare it."""

    #: the `Backend` methods that implement it (a declaring backend overrides at least one)
    methods: tuple[str, ...]
    #: what runs without it, for the log line and docs
    without: str
    #: whether a portable default exists (else the feature is refused or skipped)
    portable: bool = True


CAPABILITY_SPECS: dict[Capability, CapabilitySpec] = {
    Capability.DEVICE_SAMPLING: CapabilitySpec(
        ("sample_top_k_top_p",), "the engine samples on the host from the logits", portable=False
    ),
    Capability.TOKEN_BITMASK: CapabilitySpec(
        ("apply_token_bitmask",), "guided decoding masks the logits on the host (a round trip per step)"
    ),
    Capability.KV_BLOCK_COPY: CapabilitySpec(
        ("copy_kv_blocks",), "beam search requests are refused", portable=False
    ),
    Capability.KV_BLOCK_TRANSFER: CapabilitySpec(
        ("read_kv_blocks", "write_kv_blocks"),
        "--splitwise-role prefill / decode is refused",
        portable=False,
    ),
    Capability.GRAPH_CAPTURE: CapabilitySpec(("decode_graphs",), "decode steps run eagerly", portable=False),
    Capability.FUSED_DECODER_LAYERS: CapabilitySpec(
        ("attention_block", "mlp_block", "decoder_layers"),
        "decoder layers run op by op (the portable composition in fastdeploy.backends.fused)",
    ),
    Capability.FUSED_MOE: CapabilitySpec(
        ("moe_route", "moe_expert_weights", "moe_experts"),
        "mixture-of-experts routing and expert grouping run on the host",
    ),
    Capability.OVERLAPS_HOST: CapabilitySpec(
        ("greedy_tokens", "feed_tokens"),
        "steps run one after the other; forced async scheduling reads tokens on the host",
    ),
    Capability.DEVICE_ROW_REDUCTIONS: CapabilitySpec(
        ("argmax_rows", "nonfinite_rows"), "the logits are copied to the host for argmax and checks"
    ),
    Capability.VISION_OPS: CapabilitySpec(
        ("encoder_attention", "encoder_attention_qkv", "quick_gelu", "gelu", "merge_rows"),
        "vision encoder attention and activations run on the host with numpy",
    ),
    Capability.LORA: CapabilitySpec(
        ("lora_stack", "set_lora_slot", "lora_rows", "add_lora"),
        "LoRA adapters are refused (enable_lora=True fails at construction)",
        portable=False,
    ),
    Capability.SLIDING_WINDOW: CapabilitySpec(
        ("windowed_attention",), "contexts longer than a model's sliding window are refused", portable=False
    ),
    Capability.LATENT_ATTENTION: CapabilitySpec(
        ("latent_attention",),
        "models with multi-head latent attention (DeepSeek-V3) are refused",
        portable=False,
    ),
    Capability.QUANTIZED_WEIGHTS: CapabilitySpec(
        ("supported_quantizations", "quantization_refusal"),
        "quantization= is refused; a quantised checkpoint is dequantised to the compute dtype at load",
        portable=False,
    ),
    Capability.ATTENTION_SINKS: CapabilitySpec(
        ("attention_with_sinks",), "models with attention sinks (GPT-OSS) are refused", portable=False
    ),
    Capability.ATTENTION_SOFTCAP: CapabilitySpec(
        ("softcapped_attention",),
        "models with attention logit soft-capping (Gemma 2) are refused",
        portable=False,
    ),
}

_noted: set[tuple[type, Capability]] = set()


def note_fallback(backend_class: type, capability: Capability) -> None:
    """Log, once per backend class and capability, that the portable default of `capability` runs."""
    key = (backend_class, capability)
    if key in _noted:
        return
    _noted.add(key)
    name = getattr(backend_class, "name", backend_class.__name__)
    logger.info(
        "the %s backend does not declare Capability.%s: %s",
        name,
        capability.name,
        CAPABILITY_SPECS[capability].without,
    )


def implemented_methods(backend_class: type, base: type, capability: Capability) -> list[str]:
    """The methods of `capability` that `backend_class` overrides (not `base`'s default)."""
    return [
        method
        for method in CAPABILITY_SPECS[capability].methods
        if getattr(backend_class, method) is not getattr(base, method)
    ]
