"""`MinimalLMForCausalLM`: a Llama-shaped decoder whose rotary embedding covers only the first
`partial_rotary_factor` of each head (the built-in Llama rotates whole heads).

Pre-norm layers of RMSNorm, grouped-query attention and a SwiGLU MLP; the LM head is tied to
the token embedding. Tensors carry transformers' Llama names, so the built-in safetensors loader
reads the checkpoint and no loader of its own is needed. Every computation is a backend op, so
the model runs on any device backend.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastdeploy.plugins.api import Backend, CausalLM, ModelConfig, check_weight_names, rope_tables

LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


@dataclass
class Layer:
    """One decoder layer's device weights (opaque backend objects)."""

    attention_norm: Any
    qkv: Any  # q, k and v projections fused into one linear weight
    output: Any
    mlp_norm: Any
    gate_up: Any  # gate and up projections fused, as silu_and_mul expects
    down: Any


class MinimalLMForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig, backend: Backend, max_positions: int) -> None:
        super().__init__(config, backend, max_positions)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        # config.raw is the whole config.json: fields ModelConfig does not name are read from it.
        rotary_dim = int(self.head_dim * config.raw.get("partial_rotary_factor", 1.0))
        # cos/sin tables [max_positions, rotary_dim / 2]; narrower than head_dim / 2 means that
        # only the first rotary_dim dimensions of each head rotate.
        cos, sin = rope_tables(config.rope_theta, rotary_dim, max_positions, config.rope_scaling)
        self.cos, self.sin = backend.from_numpy(cos), backend.from_numpy(sin)
        self.layers: list[Layer] = []

    def load_weights(self, tensors: Iterable[tuple[str, Any]]) -> None:
        host = dict(tensors)  # transformers name -> host array
        host.pop("lm_head.weight", None)  # tied to the embedding
        expected = {"model.embed_tokens.weight", "model.norm.weight"}
        for i in range(self.config.num_hidden_layers):
            expected.update(f"model.layers.{i}.{name}" for name in LAYER_TENSORS)
        check_weight_names(expected, set(host))  # names what is missing or unknown
        ops = self.backend
        self.embedding = ops.from_numpy(host["model.embed_tokens.weight"])
        self.lm_head = ops.linear_weight(host["model.embed_tokens.weight"])
        self.norm = ops.from_numpy(host["model.norm.weight"])
        for i in range(self.config.num_hidden_layers):
            w = {name: host[f"model.layers.{i}.{name}"] for name in LAYER_TENSORS}
            self.layers.append(
                Layer(
                    attention_norm=ops.from_numpy(w["input_layernorm.weight"]),
                    qkv=ops.linear_weight(
                        w["self_attn.q_proj.weight"],
                        w["self_attn.k_proj.weight"],
                        w["self_attn.v_proj.weight"],
                    ),
                    output=ops.linear_weight(w["self_attn.o_proj.weight"]),
                    mlp_norm=ops.from_numpy(w["post_attention_layernorm.weight"]),
                    gate_up=ops.linear_weight(w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"]),
                    down=ops.linear_weight(w["mlp.down_proj.weight"]),
                )
            )

    def forward(self, input_ids: Any, positions: Any, batch: Any, kv_caches: list[Any]) -> Any:
        ops, eps = self.backend, self.config.rms_norm_eps
        hidden, residual = ops.embedding(input_ids, self.embedding), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = ops.rms_norm(hidden, layer.attention_norm, eps, residual)
            hidden = self.attention(layer, x, positions, batch, kv_cache)
            x, residual = ops.rms_norm(hidden, layer.mlp_norm, eps, residual)
            hidden = ops.linear(ops.silu_and_mul(ops.linear(x, layer.gate_up)), layer.down)
        return ops.rms_norm(hidden, self.norm, eps, residual)[0]

    def attention(self, layer: Layer, x: Any, positions: Any, batch: Any, kv_cache: Any) -> Any:
        ops = self.backend
        qkv = ops.linear(x, layer.qkv)
        tokens = qkv.shape[0]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q = qkv[:, :q_size].reshape(tokens, self.heads, self.head_dim)
        k = qkv[:, q_size : q_size + kv_size].reshape(tokens, self.kv_heads, self.head_dim)
        v = qkv[:, q_size + kv_size :].reshape(tokens, self.kv_heads, self.head_dim)
        q = ops.rotary_embedding(q, positions, self.cos, self.sin)
        k = ops.rotary_embedding(k, positions, self.cos, self.sin)
        out = ops.attention(q, k, v, kv_cache, batch, self.head_dim**-0.5)
        return ops.linear(out.reshape(tokens, q_size), layer.output)

    def compute_logits(self, hidden: Any) -> Any:
        return self.backend.linear(hidden, self.lm_head)
