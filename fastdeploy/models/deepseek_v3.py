"""DeepSeek-V3 / R1 (`DeepseekV3ForCausalLM`): multi-head latent attention and grouped-routed
experts, registered through the sparse-MoE plugin module.

Attention (multi-head latent attention, MLA). A token's keys and values are compressed into one
latent c = RMSNorm(W_DKV x) of `kv_lora_rank` and one rotary key k_r of `qk_rope_head_dim`
shared by all heads (`kv_a_proj_with_mqa`, `kv_a_layernorm`); `kv_b_proj` expands c into each
head's no-rope key (W_UK) and value (W_UV). The KV cache stores only (c, k_r) per token and
layer, `KVCacheSpec.kind` "latent", and the backend's `latent_attention` attends over it: it may
expand the latents for prefill or absorb W_UK into the queries and W_UV into the output for
decode (the cpu backend does both, by query count). Queries come from `q_proj`, or through the
low-rank `q_a_proj` / `q_a_layernorm` / `q_b_proj` when `q_lora_rank` is set (V3; V2-Lite has
none). The softmax scale is (qk_nope + qk_rope)^-0.5, times mscale^2 under YaRN rope scaling
with `mscale_all_dim` (mscale = 0.1 * mscale_all_dim * ln(factor) + 1), as DeepSeek-V3 sets it.
Rotary dimensions come interleaved in the checkpoint (`rope_interleave`, default true); their
rows are reordered to halves at load time, q and k alike, so the rotate-half rotary applies.

Feed-forward: grouped-routed experts after `first_k_dense_replace` dense layers, shared with
GLM-4.5 (`grouped_moe.py`).

Split over tensor-parallel ranks, a rank holds its query heads (q, the W_UK / W_UV rows of
kv_b_proj, o_proj's columns), the whole latent projection (each rank caches the same latents),
and its share of the experts and MLP features (`grouped_moe.py`).

The checkpoint's multi-token-prediction layers (`num_nextn_predict_layers`, stored as
`model.layers.{num_hidden_layers + i}`) are not part of this model; `DeepseekV3MTP` loads them
as the speculative proposer of `speculative_config={"method": "mtp"}`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.grouped_moe import GroupedMoEMixin
from fastdeploy.models.llama import DenseMLPWeights, LlamaForCausalLM, required_field
from fastdeploy.plugins.api import (
    Backend,
    Capability,
    InvalidArgumentError,
    KVCacheSpec,
    MLPBlock,
    ModelConfig,
    ModelParallel,
    UnsupportedModelError,
    check_weight_names,
    check_weight_shapes,
    interleaved_to_half_rows,
    rope_tables,
    take_columns,
)

#: epsilon of the latent norms (`q_a_layernorm`, `kv_a_layernorm`): transformers builds them with
#: its RMSNorm default, not `rms_norm_eps`
LATENT_NORM_EPS = 1e-6


@dataclass
class MLAWeights:
    """One layer's latent attention, this rank's heads."""

    #: low-rank query path (q_lora_rank set): q_a_proj and its norm; None when `q_proj` is direct
    q_a: Any | None
    q_a_norm: Any | None
    #: the no-rope and rotary query rows (of q_b_proj or q_proj), rotary rows in halves layout
    q_nope: Any
    q_rope: Any
    #: kv_a_proj_with_mqa split: the latent rows and the rotary key rows (halves layout)
    kv_a: Any
    k_rope: Any
    kv_a_norm: Any
    #: kv_b_proj per head: [heads, nope, lora] and [heads, v_dim, lora]
    absorb_k: Any
    absorb_v: Any
    o_proj: Any
    #: no sliding window (the field `layer_batch` reads to pick a layer's KV group: the only one)
    window: int = 0


@dataclass
class DeepseekLayerWeights:
    input_norm: Any
    attention: MLAWeights
    post_norm: Any
    mlp: Any
    #: the dense layers' SwiGLU half for `Backend.mlp_block` (None on MoE layers)
    dense_block: MLPBlock | None = None


class DeepseekV3ForCausalLM(GroupedMoEMixin, LlamaForCausalLM):
    """DeepSeek-V3 decoder (MLA + grouped-routed MoE); see the module doc."""

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        raw = config.raw
        self.kv_lora_rank = int(required_field(config, "kv_lora_rank"))
        self.rope_dim = int(required_field(config, "qk_rope_head_dim"))
        self.nope_dim = int(required_field(config, "qk_nope_head_dim"))
        self.v_dim = int(required_field(config, "v_head_dim"))
        self.q_lora_rank = None if raw.get("q_lora_rank") is None else int(raw["q_lora_rank"])
        self.read_moe_config(config)
        self.rope_interleave = bool(raw.get("rope_interleave", True))
        if raw.get("attention_bias"):
            raise UnsupportedModelError(f"{config.architecture} with attention_bias=true is not supported")
        if not backend.supports(Capability.LATENT_ATTENTION):
            raise UnsupportedModelError(
                f"{config.architecture} needs multi-head latent attention, which the {backend.name} backend "
                "does not implement (Capability.LATENT_ATTENTION)"
            )
        super().__init__(config, backend, max_positions, parallel)
        self.head_dim = self.nope_dim + self.rope_dim
        self.scale = self.head_dim**-0.5 * self._mscale() ** 2
        self.init_moe()
        mtp_layers = int(raw.get("num_nextn_predict_layers") or 0)
        #: the multi-token-prediction layers stored after the decoder's (see `DeepseekV3MTP`)
        self.ignored_prefixes = tuple(
            f"model.layers.{config.num_hidden_layers + i}." for i in range(mtp_layers)
        )

    # --- config ----------------------------------------------------------------------------
    def rope_scaling(self) -> dict[str, Any] | None:
        """`rope_scaling`, or transformers 5's `rope_parameters` when it names a scaling type."""
        raw = self.config.raw
        for key in ("rope_scaling", "rope_parameters"):
            value = raw.get(key)
            if (
                isinstance(value, dict)
                and (value.get("rope_type") or value.get("type", "default")) != "default"
            ):
                return value
        return None

    def _mscale(self) -> float:
        """DeepSeek's YaRN attention-scale correction (1 without YaRN or `mscale_all_dim`)."""
        scaling = self.rope_scaling() or {}
        factor, all_dim = float(scaling.get("factor") or 1.0), float(scaling.get("mscale_all_dim") or 0.0)
        return 0.1 * all_dim * math.log(factor) + 1.0 if all_dim and factor > 1 else 1.0

    def rotary_tables(self, freq_factors: Any | None) -> tuple[Any, Any]:
        return rope_tables(
            self.rope_theta(), self.rope_dim, self.max_positions, self.rope_scaling(), freq_factors
        )

    def kv_cache_heads(self) -> int:
        return 1

    def kv_cache_spec(self, num_blocks: int, block_size: int, dtype: str) -> KVCacheSpec:
        """One latent vector (kv_lora_rank + qk_rope_head_dim) per token and layer; not in int8,
        whose one scale per vector would cover the latent and the rotary key, of unlike ranges."""
        if dtype == "int8":
            raise InvalidArgumentError(
                f"kv_cache_dtype='int8' is not supported by {self.config.architecture}'s latent KV cache; "
                "use float32, float16 or bfloat16"
            )
        width = self.kv_lora_rank + self.rope_dim
        return KVCacheSpec(self.kv_cache_layers(), num_blocks, block_size, 1, width, dtype, kind="latent")

    # --- names and shapes ------------------------------------------------------------------
    def _attention_names(self, prefix: str) -> set[str]:
        return set(self._attention_shapes(prefix))

    def _attention_shapes(self, prefix: str) -> dict[str, tuple[int, ...]]:
        attn, hidden = prefix + "self_attn.", self.config.hidden_size
        heads = self.config.num_attention_heads
        shapes = {
            attn + "kv_a_proj_with_mqa.weight": (self.kv_lora_rank + self.rope_dim, hidden),
            attn + "kv_a_layernorm.weight": (self.kv_lora_rank,),
            attn + "kv_b_proj.weight": (heads * (self.nope_dim + self.v_dim), self.kv_lora_rank),
            attn + "o_proj.weight": (hidden, heads * self.v_dim),
        }
        q_rows = heads * (self.nope_dim + self.rope_dim)
        if self.q_lora_rank is None:
            shapes[attn + "q_proj.weight"] = (q_rows, hidden)
        else:
            shapes[attn + "q_a_proj.weight"] = (self.q_lora_rank, hidden)
            shapes[attn + "q_a_layernorm.weight"] = (self.q_lora_rank,)
            shapes[attn + "q_b_proj.weight"] = (q_rows, self.q_lora_rank)
        return shapes

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        config = self.config
        hidden, vocab = config.hidden_size, config.vocab_size
        shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
        if not config.tie_word_embeddings:
            shapes["lm_head.weight"] = (vocab, hidden)
        for i in range(config.num_hidden_layers):
            prefix = f"model.layers.{i}."
            shapes[prefix + "input_layernorm.weight"] = (hidden,)
            shapes[prefix + "post_attention_layernorm.weight"] = (hidden,)
            shapes.update(self._attention_shapes(prefix))
            shapes.update(self.mlp_shapes(i, prefix))
        return shapes

    # --- loading ---------------------------------------------------------------------------
    def _rope_rows(self, rows: np.ndarray, heads: int) -> np.ndarray:
        return interleaved_to_half_rows(rows, heads) if self.rope_interleave else rows

    def _load_attention(self, attn: str, host: dict[str, Any]) -> MLAWeights:
        backend, heads = self.backend, self.q_heads
        nope, rope, lora = self.nope_dim, self.rope_dim, self.kv_lora_rank
        q_weight = host[attn + ("q_proj.weight" if self.q_lora_rank is None else "q_b_proj.weight")]
        per_head = np.asarray(q_weight).reshape(self.config.num_attention_heads, nope + rope, -1)[
            heads.start : heads.stop
        ]
        kv_a = np.asarray(host[attn + "kv_a_proj_with_mqa.weight"])
        kv_b = np.asarray(host[attn + "kv_b_proj.weight"]).reshape(
            self.config.num_attention_heads, nope + self.v_dim, lora
        )[heads.start : heads.stop]
        weights = MLAWeights(
            q_a=None,
            q_a_norm=None,
            q_nope=backend.linear_weight(per_head[:, :nope].reshape(-1, per_head.shape[-1])),
            q_rope=backend.linear_weight(
                self._rope_rows(per_head[:, nope:].reshape(-1, per_head.shape[-1]), len(heads))
            ),
            kv_a=backend.linear_weight(kv_a[:lora]),
            k_rope=backend.linear_weight(self._rope_rows(kv_a[lora:], 1)),
            kv_a_norm=backend.from_numpy(host[attn + "kv_a_layernorm.weight"]),
            absorb_k=backend.from_numpy(np.ascontiguousarray(kv_b[:, :nope])),
            absorb_v=backend.from_numpy(np.ascontiguousarray(kv_b[:, nope:])),
            o_proj=backend.linear_weight(
                take_columns(
                    host[attn + "o_proj.weight"], range(heads.start * self.v_dim, heads.stop * self.v_dim)
                )
            ),
        )
        if self.q_lora_rank is not None:
            weights.q_a = backend.linear_weight(host[attn + "q_a_proj.weight"])
            weights.q_a_norm = backend.from_numpy(host[attn + "q_a_layernorm.weight"])
        return weights

    def _load_layer(self, i: int, host: dict[str, Any]) -> DeepseekLayerWeights:  # type: ignore[override]
        backend, p = self.backend, f"model.layers.{i}."
        layer = DeepseekLayerWeights(
            input_norm=backend.from_numpy(host[p + "input_layernorm.weight"]),
            attention=self._load_attention(p + "self_attn.", host),
            post_norm=backend.from_numpy(host[p + "post_attention_layernorm.weight"]),
            mlp=self.load_mlp(i, p, host),
        )
        if isinstance(layer.mlp, DenseMLPWeights):
            layer.dense_block = MLPBlock(
                layer.post_norm, layer.mlp.gate_up, layer.mlp.down, self.config.rms_norm_eps
            )
        return layer

    # --- forward ---------------------------------------------------------------------------
    def latent_attention(
        self, weights: MLAWeights, x: Any, positions: Any, cos: Any, sin: Any, batch: Any, kv_cache: Any
    ) -> Any:
        """The attention half after its input norm: this rank's partial o_proj output [tokens, hidden]."""
        ops = self.backend
        tokens, heads = x.shape[0], self.num_heads
        queries = x
        if weights.q_a is not None:
            queries = ops.rms_norm(ops.linear(x, weights.q_a), weights.q_a_norm, LATENT_NORM_EPS)[0]
        q_nope = ops.linear(queries, weights.q_nope).reshape(tokens, heads, self.nope_dim)
        q_rope = ops.linear(queries, weights.q_rope).reshape(tokens, heads, self.rope_dim)
        q_rope = ops.rotary_embedding(q_rope, positions, cos, sin)
        latent = ops.rms_norm(ops.linear(x, weights.kv_a), weights.kv_a_norm, LATENT_NORM_EPS)[0]
        k_rope = ops.linear(x, weights.k_rope).reshape(tokens, 1, self.rope_dim)
        k_rope = ops.rotary_embedding(k_rope, positions, cos, sin).reshape(tokens, self.rope_dim)
        out = ops.latent_attention(
            q_nope, q_rope, latent, k_rope, kv_cache, batch, weights.absorb_k, weights.absorb_v, self.scale
        )
        return ops.linear(out.reshape(tokens, heads * self.v_dim), weights.o_proj)

    def layer_forward(  # type: ignore[override]
        self,
        layer: DeepseekLayerWeights,
        hidden: Any,
        residual: Any | None,
        positions: Any,
        cos: Any,
        sin: Any,
        batch: Any,
        kv_cache: Any,
    ) -> tuple[Any, Any]:
        ops, parallel, eps = self.backend, self.parallel, self.config.rms_norm_eps
        normed, residual = ops.rms_norm(hidden, layer.input_norm, eps, residual)
        hidden = parallel.all_reduce(
            self.latent_attention(layer.attention, normed, positions, cos, sin, batch, kv_cache)
        )
        if layer.dense_block is not None:
            hidden, residual = ops.mlp_block(hidden, residual, layer.dense_block)
        else:
            normed, residual = ops.rms_norm(hidden, layer.post_norm, eps, residual)
            hidden = self.mlp_block(layer, normed)  # type: ignore[arg-type]
        return parallel.all_reduce(hidden), residual

    # --- multi-token prediction ------------------------------------------------------------
    def mtp_model(self) -> DeepseekV3MTP:
        """The checkpoint's first multi-token-prediction layer as a model of its own (weights
        not yet loaded), for the "mtp" speculative proposer."""
        if self.parallel.tp_size * self.parallel.pp_size != 1:
            raise UnsupportedModelError("speculative_config method 'mtp' runs with one model process only")
        return DeepseekV3MTP(self.config, self.backend, self.max_positions)


class DeepseekV3MTP(DeepseekV3ForCausalLM):
    """DeepSeek-V3's multi-token-prediction (MTP) module, layer `num_hidden_layers` of the
    checkpoint, which predicts the token after next.

    At position i it takes the main model's final (normed) hidden state h_i and the embedding of
    the next token t_{i+1}: x = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]), runs one decoder
    layer (latent attention over its own cache of such positions, then the routed experts) and
    predicts t_{i+2} from shared_head.head(shared_head.norm(out)). `forward` returns `out` (the
    layer's output plus its residual), which stands in for h at the next position when drafting
    further than one token, as the same layer is applied again.
    """

    def __init__(self, config: ModelConfig, backend: Backend, max_positions: int) -> None:
        super().__init__(config, backend, max_positions)
        if not self.ignored_prefixes:
            raise UnsupportedModelError(
                f"speculative_config method 'mtp' needs multi-token-prediction layers; this "
                f"{config.architecture} checkpoint has num_nextn_predict_layers=0"
            )
        self.index = config.num_hidden_layers
        self.prefix = f"model.layers.{self.index}."
        self.layer_ids = [self.index]
        self.moe_layers = frozenset(range(self.first_moe_layer, self.index + 1))

    def kv_cache_layers(self) -> int:
        return 1

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        hidden, vocab, p = self.config.hidden_size, self.config.vocab_size, self.prefix
        shapes = {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "enorm.weight": (hidden,),
            p + "hnorm.weight": (hidden,),
            p + "eh_proj.weight": (hidden, 2 * hidden),
            p + "shared_head.norm.weight": (hidden,),
            p + "shared_head.head.weight": (vocab, hidden),
            p + "embed_tokens.weight": (vocab, hidden),
        }
        shapes.update(self._attention_shapes(p))
        shapes.update(self.mlp_shapes(self.index, p))
        return shapes

    def load_weights(self, tensors: Iterable[tuple[str, Any]]) -> None:
        """Takes the whole checkpoint's tensors and keeps the MTP layer's; its embedding and head
        default to the model's where a checkpoint drops the copies."""
        host = {name: value for name, value in tensors if name.startswith(self.prefix) or name in _SHARED}
        p = self.prefix
        for own, shared in (
            (p + "embed_tokens.weight", "model.embed_tokens.weight"),
            (p + "shared_head.head.weight", "lm_head.weight"),
        ):
            if own not in host and shared in host:
                host[own] = host[shared]
            host.pop(shared, None)
        expected = self._expected_shapes()
        check_weight_names(set(expected), set(host))
        check_weight_shapes(expected, host)
        backend, hidden = self.backend, self.config.hidden_size
        eh_proj = np.asarray(host[p + "eh_proj.weight"])
        self.embed_tokens = backend.from_numpy(host[p + "embed_tokens.weight"])
        self.enorm = backend.from_numpy(host[p + "enorm.weight"])
        self.hnorm = backend.from_numpy(host[p + "hnorm.weight"])
        self.eh_embedded = backend.linear_weight(np.ascontiguousarray(eh_proj[:, :hidden]))
        self.eh_hidden = backend.linear_weight(np.ascontiguousarray(eh_proj[:, hidden:]))
        self.final_norm = backend.from_numpy(host[p + "shared_head.norm.weight"])
        self.lm_head = backend.linear_weight(host[p + "shared_head.head.weight"])
        self.layers = [self._load_layer(self.index, host)]
        cos, sin = self.rotary_tables(None)
        self.rope_cos, self.rope_sin = backend.from_numpy(cos), backend.from_numpy(sin)

    def forward(  # type: ignore[override]
        self, input_ids: Any, positions: Any, batch: Any, kv_caches: list[Any], previous_hidden: Any
    ) -> Any:
        """`out` [tokens, hidden] for next tokens `input_ids` and the hidden states
        `previous_hidden` [tokens, hidden] of the positions before them."""
        ops, eps = self.backend, self.config.rms_norm_eps
        embedded = ops.rms_norm(ops.embedding(input_ids, self.embed_tokens), self.enorm, eps)[0]
        prior = ops.rms_norm(previous_hidden, self.hnorm, eps)[0]
        x = ops.linear(embedded, self.eh_embedded) + ops.linear(prior, self.eh_hidden)
        hidden, residual = self.layer_forward(
            self.layers[0], x, None, positions, self.rope_cos, self.rope_sin, batch, kv_caches[0]
        )
        return hidden + residual

    def compute_logits(self, hidden: Any) -> Any:
        normed, _ = self.backend.rms_norm(hidden, self.final_norm, self.config.rms_norm_eps)
        return self.backend.linear(normed, self.lm_head)


#: the model's tensors the MTP layer falls back to
_SHARED = ("model.embed_tokens.weight", "lm_head.weight")
