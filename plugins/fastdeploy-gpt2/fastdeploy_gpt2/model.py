"""The GPT-2 architecture written against fastdeploy's backend ops.

What differs from Llama: learned position embeddings added to the token embeddings, LayerNorm
with a bias (pre-norm), GELU (tanh approximation) MLP, biases on every projection, full
multi-head attention, and Conv1D weights stored [in, out] (transposed here for `linear_weight`,
which takes [out, in]). The LM head is tied to the token embedding.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastdeploy.plugins.api import Backend, CausalLM, ModelConfig, check_weight_names

_LAYER_PARTS = (
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
)


@dataclass
class GPT2Block:
    ln_1: tuple[Any, Any]
    c_attn: tuple[Any, Any]
    attn_proj: tuple[Any, Any]
    ln_2: tuple[Any, Any]
    c_fc: tuple[Any, Any]
    mlp_proj: tuple[Any, Any]


class GPT2LMHeadModel(CausalLM):
    """GPT-2 (and checkpoints with the same graph, e.g. DistilGPT2)."""

    def __init__(self, config: ModelConfig, backend: Backend, max_positions: int) -> None:
        super().__init__(config, backend, max_positions)
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.hidden = config.hidden_size
        self.eps = float(config.raw.get("layer_norm_epsilon", 1e-5))
        self.scale = self.head_dim**-0.5
        self.blocks: list[GPT2Block] = []

    def _expected_names(self) -> set[str]:
        names = {
            "transformer.wte.weight",
            "transformer.wpe.weight",
            "transformer.ln_f.weight",
            "transformer.ln_f.bias",
        }
        for i in range(self.config.num_hidden_layers):
            names.update(f"transformer.h.{i}.{part}" for part in _LAYER_PARTS)
        return names

    def load_weights(self, tensors: Iterable[tuple[str, Any]]) -> None:
        host = dict(tensors)
        check_weight_names(self._expected_names(), set(host))
        ops = self.backend

        def vector(name: str) -> Any:
            return ops.from_numpy(host[name])

        def conv1d(prefix: str) -> tuple[Any, Any]:
            # Conv1D keeps [in, out]; linear_weight takes [out, in]
            return ops.linear_weight(host[prefix + ".weight"].T), ops.linear_bias(host[prefix + ".bias"])

        self.wte = vector("transformer.wte.weight")
        self.wpe = vector("transformer.wpe.weight")
        self.lm_head = ops.linear_weight(host["transformer.wte.weight"])
        self.ln_f = (vector("transformer.ln_f.weight"), vector("transformer.ln_f.bias"))
        self.blocks = []
        for i in range(self.config.num_hidden_layers):
            p = f"transformer.h.{i}."
            self.blocks.append(
                GPT2Block(
                    ln_1=(vector(p + "ln_1.weight"), vector(p + "ln_1.bias")),
                    c_attn=conv1d(p + "attn.c_attn"),
                    attn_proj=conv1d(p + "attn.c_proj"),
                    ln_2=(vector(p + "ln_2.weight"), vector(p + "ln_2.bias")),
                    c_fc=conv1d(p + "mlp.c_fc"),
                    mlp_proj=conv1d(p + "mlp.c_proj"),
                )
            )

    def forward(self, input_ids: Any, positions: Any, batch: Any, kv_caches: list[Any]) -> Any:
        ops = self.backend
        hidden = ops.embedding(input_ids, self.wte) + ops.embedding(positions, self.wpe)
        residual = None
        for block, kv_cache in zip(self.blocks, kv_caches, strict=True):
            normed, residual = ops.layer_norm(hidden, *block.ln_1, self.eps, residual)
            hidden = self._attention(block, normed, batch, kv_cache)
            normed, residual = ops.layer_norm(hidden, *block.ln_2, self.eps, residual)
            hidden = ops.linear(ops.gelu_tanh(ops.linear(normed, *block.c_fc)), *block.mlp_proj)
        normed, _ = ops.layer_norm(hidden, *self.ln_f, self.eps, residual)
        return normed

    def _attention(self, block: GPT2Block, x: Any, batch: Any, kv_cache: Any) -> Any:
        ops = self.backend
        qkv = ops.linear(x, *block.c_attn)
        tokens, width = qkv.shape[0], self.hidden
        q = qkv[:, :width].reshape(tokens, self.num_heads, self.head_dim)
        k = qkv[:, width : 2 * width].reshape(tokens, self.num_heads, self.head_dim)
        v = qkv[:, 2 * width :].reshape(tokens, self.num_heads, self.head_dim)
        out = ops.attention(q, k, v, kv_cache, batch, self.scale)
        return ops.linear(out.reshape(tokens, width), *block.attn_proj)

    def compute_logits(self, hidden: Any) -> Any:
        return self.backend.linear(hidden, self.lm_head)
