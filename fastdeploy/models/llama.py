"""The Llama architecture (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU).

Registered as a built-in plugin. The q/k/v and gate/up projections are fused into one weight
each so a layer runs five matmuls for the whole batch.

The class is also the base of the other Llama-shaped decoders (Qwen2/Qwen3, ERNIE-4.5): they
differ only in which projections carry biases, extra per-head norms, how q/k rows are laid out
for rotary, and what the feed-forward block of a layer is. Those are the methods a subclass
overrides (`projection_biases`, `preprocess_weights`, `mlp_names`, `load_mlp`, `mlp_block`); the
attention and the layer loop stay here. Each layer's attention half and dense SwiGLU half are
`Backend.attention_block` / `Backend.mlp_block` calls, which a backend may fuse.

Split over ranks (`parallel=`, see docs/architecture.md "Parallelism"), a rank holds the query
and KV heads of its shard (q/k/v column-parallel), the matching input columns of o_proj
(row-parallel), its share of the MLP's intermediate features (gate/up column-parallel, down
row-parallel) and its slice of the vocabulary (embedding and LM head); the row-parallel outputs
and the embedding are summed over the tensor-parallel group, the logits gathered. A pipeline
stage holds only its layers and hands hidden states and residuals to the next stage.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastdeploy.models.attention_window import sliding_window
from fastdeploy.plugins.api import (
    AttentionBlock,
    Backend,
    CausalLM,
    GroupedBatch,
    InvalidArgumentError,
    KVCacheGroup,
    LayerLoRA,
    LoRAProjection,
    MLPBlock,
    ModelConfig,
    ModelParallel,
    check_weight_names,
    check_weight_shapes,
    get_logger,
    hookimpl,
    layer_batch,
    lora_attention_block,
    lora_mlp_block,
    rope_tables,
    take_columns,
    take_head_rows,
    take_rows,
)

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
logger = get_logger(__name__)


def required_field(config: ModelConfig, *names: str) -> Any:
    """The first of `names` config.json has (aliases of one field), or an error naming it."""
    for name in names:
        if config.raw.get(name) is not None:
            return config.raw[name]
    raise InvalidArgumentError(f"config.json of {config.architecture} lacks the required field {names[0]!r}")


def partial_rotary_dim(head_dim: int, factor: float) -> int:
    """The rotary dimension when rotary embedding covers only the first `factor` of each head
    (`partial_rotary_factor`: Phi-4-mini, GLM-4.5), checked to be a positive even number."""
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise InvalidArgumentError(
            f"config.json: partial_rotary_factor gives a rotary dimension of {rotary_dim} for head_dim "
            f"{head_dim}; it must be a positive even number"
        )
    return rotary_dim


@dataclass(frozen=True)
class ProjectionBiases:
    """Which linear layers of a decoder layer carry a bias."""

    qkv: bool = False
    o_proj: bool = False
    mlp: bool = False


@dataclass
class DenseMLPWeights:
    """A SwiGLU feed-forward block: fused gate/up, then down."""

    gate_up: Any
    down: Any
    gate_up_bias: Any | None = None
    down_bias: Any | None = None


@dataclass
class LlamaLayerWeights:
    #: input norm through the output projection (`Backend.attention_block`)
    attention: AttentionBlock
    post_norm: Any
    #: the feed-forward block: `DenseMLPWeights`, or whatever a subclass's `load_mlp` returns
    mlp: Any
    #: a `DenseMLPWeights` feed-forward block with its norm, run by `Backend.mlp_block` (None for
    #: other blocks, which `mlp_block` runs after the norm)
    dense_block: MLPBlock | None = None


class LlamaForCausalLM(CausalLM):
    """Llama-family decoder; subclasses change biases, q/k handling and the feed-forward block."""

    #: rope_theta when config.json has neither `rope_theta` nor `rope_parameters.rope_theta`
    default_rope_theta: float | None = None
    #: checkpoint tensors that are known but not used (e.g. multi-token-prediction heads)
    ignored_prefixes: tuple[str, ...] = ()

    supports_parallel = True

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        super().__init__(config, backend, max_positions, parallel)
        #: the query and KV heads this rank computes (all of them in one process)
        self.q_heads = self.parallel.head_shard(config.num_attention_heads)
        self.kv_heads = self.parallel.head_shard(config.num_key_value_heads)
        self.num_heads = len(self.q_heads)
        self.num_kv_heads = len(self.kv_heads)
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        #: the sliding layers' window where it binds (`attention_window`), else 0
        self.window = self.sliding_window(max_positions)
        self.biases = self.projection_biases()
        self.lm_head_bias: Any | None = None
        self.layers: list[LlamaLayerWeights] = []
        #: (attention, MLP) blocks of every layer when all are dense and run on one rank, for
        #: `Backend.decoder_layers`; None otherwise (layer by layer through `layer_forward`)
        self.dense_layers: list[tuple[AttentionBlock, MLPBlock]] | None = None
        #: the decoder layers of this rank's pipeline stage
        self.layer_ids = self.parallel.stage_layers(config.num_hidden_layers)

    # --- what subclasses override ------------------------------------------------------------
    def sliding_window(self, max_positions: int) -> int:
        """The sliding layers' window where it binds, else 0: config.json's `sliding_window`
        (Mistral, Phi-3, Mixtral, Gemma 3), refused on a backend without sliding-window attention."""
        return sliding_window(self.config, max_positions, self.backend)

    def attention_window(self, layer: int) -> int:
        """Layer `layer`'s `AttentionBlock.window` (0: full attention); every layer slides here."""
        return self.window

    def attention_softcap(self) -> float:
        """Every layer's `AttentionBlock.softcap` (0: scores are not soft-capped; Gemma 2 caps them)."""
        return 0.0

    def kv_window(self) -> int:
        windows = {self.attention_window(i) for i in range(self.config.num_hidden_layers)}
        return self.window if windows == {self.window} else 0

    def kv_cache_groups(self) -> list[KVCacheGroup]:
        """This stage's layers by `attention_window`, the whole-context group first."""
        by_window: dict[int, list[int]] = {}
        for index, layer in enumerate(self.layer_ids):
            by_window.setdefault(self.attention_window(layer), []).append(index)
        return [KVCacheGroup(window, tuple(by_window[window])) for window in sorted(by_window)]

    def projection_biases(self) -> ProjectionBiases:
        """Biases as transformers' Llama has them: `attention_bias` on q/k/v/o, `mlp_bias` on the MLP."""
        attention = bool(self.config.raw.get("attention_bias", False))
        return ProjectionBiases(
            qkv=attention, o_proj=attention, mlp=bool(self.config.raw.get("mlp_bias", False))
        )

    def has_qk_norm(self) -> bool:
        """Whether layers carry `self_attn.q_norm` / `self_attn.k_norm` (Qwen3)."""
        return False

    def has_lm_head_bias(self) -> bool:
        return False

    def rope_theta(self) -> float:
        """The rotary base, also from transformers 5's `rope_parameters` form of config.json."""
        raw = self.config.raw
        if "rope_theta" in raw:
            return float(raw["rope_theta"])
        parameters = raw.get("rope_parameters")
        if isinstance(parameters, dict) and "rope_theta" in parameters:
            return float(parameters["rope_theta"])
        return self.default_rope_theta if self.default_rope_theta is not None else self.config.rope_theta

    def rotary_tables(self, freq_factors: Any | None) -> tuple[Any, Any]:
        """Host (cos, sin) tables [max_positions, rotary_dim / 2] of every layer (a subclass with
        partial rotary or its own `rope_scaling` fields builds its own)."""
        return rope_tables(
            self.rope_theta(), self.head_dim, self.max_positions, self.config.rope_scaling, freq_factors
        )

    def preprocess_weights(self, host: dict[str, Any]) -> None:
        """Rewrite host tensors in place before they are checked and loaded (e.g. row layouts)."""

    def qk_head_rows(self, tensor: Any, heads: range) -> Any:
        """The q or k projection rows (or bias entries) of `heads`, in the rotate-half layout the
        backend's rotary embedding expects."""
        return take_head_rows(tensor, heads, self.head_dim)

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        """Tensor names of layer `layer`'s feed-forward block (`prefix` is "model.layers.N.")."""
        return self.dense_mlp_names(prefix + "mlp.")

    def load_mlp(self, layer: int, prefix: str, host: dict[str, Any]) -> Any:
        """Device weights of layer `layer`'s feed-forward block."""
        return self.load_dense_mlp(prefix + "mlp.", host)

    def mlp_block(self, layer: LlamaLayerWeights, x: Any) -> Any:
        """The feed-forward block of one layer on normed hidden states [tokens, hidden]."""
        return self.dense_mlp(layer.mlp, x)

    # --- shared pieces ----------------------------------------------------------------------
    def dense_mlp_names(self, prefix: str) -> set[str]:
        names = {prefix + f"{part}_proj.weight" for part in ("gate", "up", "down")}
        if self.biases.mlp:
            names.update(prefix + f"{part}_proj.bias" for part in ("gate", "up", "down"))
        return names

    def load_dense_mlp(self, prefix: str, host: dict[str, Any]) -> DenseMLPWeights:
        """gate/up column-parallel and down row-parallel over this rank's intermediate features."""
        backend = self.backend
        inner = self.parallel.feature_shard(host[prefix + "down_proj.weight"].shape[1])
        weights = DenseMLPWeights(
            gate_up=backend.linear_weight(
                take_rows(host[prefix + "gate_proj.weight"], inner),
                take_rows(host[prefix + "up_proj.weight"], inner),
            ),
            down=backend.linear_weight(take_columns(host[prefix + "down_proj.weight"], inner)),
        )
        if self.biases.mlp:
            weights.gate_up_bias = backend.linear_bias(
                take_rows(host[prefix + "gate_proj.bias"], inner),
                take_rows(host[prefix + "up_proj.bias"], inner),
            )
            weights.down_bias = self._row_parallel_bias(host[prefix + "down_proj.bias"])
        return weights

    def _row_parallel_bias(self, bias: Any) -> Any | None:
        """A row-parallel layer's bias, added by tensor-parallel rank 0 only (before the sum)."""
        return self.backend.linear_bias(bias) if self.parallel.tp_rank == 0 else None

    def dense_mlp(self, mlp: DenseMLPWeights, x: Any) -> Any:
        """This rank's partial sum of the MLP (the whole MLP in one process)."""
        ops = self.backend
        return ops.linear(
            ops.silu_and_mul(ops.linear(x, mlp.gate_up, mlp.gate_up_bias)), mlp.down, mlp.down_bias
        )

    def _attention_names(self, prefix: str) -> set[str]:
        attn = prefix + "self_attn."
        names = {attn + f"{p}_proj.weight" for p in ("q", "k", "v", "o")}
        if self.biases.qkv:
            names.update(attn + f"{p}_proj.bias" for p in "qkv")
        if self.biases.o_proj:
            names.add(attn + "o_proj.bias")
        if self.has_qk_norm():
            names.update({attn + "q_norm.weight", attn + "k_norm.weight"})
        return names

    def _expected_names(self) -> set[str]:
        names = {"model.embed_tokens.weight", "model.norm.weight"}
        if not self.config.tie_word_embeddings:
            names.add("lm_head.weight")
        if self.has_lm_head_bias():
            names.add("lm_head.bias")
        for i in range(self.config.num_hidden_layers):
            prefix = f"model.layers.{i}."
            names.update({prefix + "input_layernorm.weight", prefix + "post_attention_layernorm.weight"})
            names.update(self._attention_names(prefix))
            names.update(self.mlp_names(i, prefix))
        return names

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """[out, in] shapes of the embedding, head, norms and attention projections that
        config.json implies (the MLP's depend on the block: `mlp_names` may be experts)."""
        config = self.config
        hidden, vocab, head_dim = config.hidden_size, config.vocab_size, config.head_dim
        q_rows, kv_rows = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
        shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
        if not config.tie_word_embeddings:
            shapes["lm_head.weight"] = (vocab, hidden)
        for i in range(config.num_hidden_layers):
            prefix, attn = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
            shapes[prefix + "input_layernorm.weight"] = (hidden,)
            shapes[prefix + "post_attention_layernorm.weight"] = (hidden,)
            shapes[attn + "q_proj.weight"] = (q_rows, hidden)
            shapes[attn + "k_proj.weight"] = (kv_rows, hidden)
            shapes[attn + "v_proj.weight"] = (kv_rows, hidden)
            shapes[attn + "o_proj.weight"] = (hidden, q_rows)
        return shapes

    def load_weights(self, tensors: Iterable[tuple[str, Any]]) -> None:
        host: dict[str, Any] = {}
        ignored = 0
        for name, value in tensors:
            if self.ignored_prefixes and name.startswith(self.ignored_prefixes):
                ignored += 1
            else:
                host[name] = value
        if ignored:
            logger.info(
                "%s: %d checkpoint tensors under %s not used",
                type(self).__name__,
                ignored,
                self.ignored_prefixes,
            )
        freq_factors = host.pop("model.rotary_emb.freq_factors", None)
        if self.config.tie_word_embeddings:
            host.pop("lm_head.weight", None)  # some tied checkpoints store the copy; the embedding wins
        self.preprocess_weights(host)
        check_weight_names(self._expected_names(), set(host), _IGNORED_SUFFIXES)
        check_weight_shapes(self._expected_shapes(), host)
        backend = self.backend
        parallel = self.parallel
        if parallel.is_first_stage:
            self.embed_tokens = parallel.vocab_embedding_table(backend, host["model.embed_tokens.weight"])
        if parallel.is_last_stage:
            head = host["model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"]
            self.lm_head = backend.linear_weight(parallel.vocab_rows_of(head))
            if self.has_lm_head_bias():
                self.lm_head_bias = backend.linear_bias(parallel.vocab_rows_of(host["lm_head.bias"]))
            self.final_norm = backend.from_numpy(host["model.norm.weight"])
        self.layers = [self._load_layer(i, host) for i in self.layer_ids]
        self.dense_layers = self._dense_layers()
        cos, sin = self.rotary_tables(freq_factors)
        self.rope_cos, self.rope_sin = backend.from_numpy(cos), backend.from_numpy(sin)

    def _load_layer(self, i: int, host: dict[str, Any]) -> LlamaLayerWeights:
        backend = self.backend
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        attention = AttentionBlock(
            input_norm=backend.from_numpy(host[p + "input_layernorm.weight"]),
            qkv=backend.linear_weight(*self._qkv_rows(attn, "weight", host)),
            o_proj=backend.linear_weight(
                take_columns(
                    host[attn + "o_proj.weight"],
                    range(self.q_heads.start * self.head_dim, self.q_heads.stop * self.head_dim),
                )
            ),
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            eps=self.config.rms_norm_eps,
            scale=self.scale,
            window=self.attention_window(i),
            softcap=self.attention_softcap(),
        )
        if self.biases.qkv:
            attention.qkv_bias = backend.linear_bias(*self._qkv_rows(attn, "bias", host))
        if self.biases.o_proj:
            attention.o_bias = self._row_parallel_bias(host[attn + "o_proj.bias"])
        if self.has_qk_norm():
            attention.q_norm = backend.from_numpy(host[attn + "q_norm.weight"])
            attention.k_norm = backend.from_numpy(host[attn + "k_norm.weight"])
        layer = LlamaLayerWeights(
            attention=attention,
            post_norm=backend.from_numpy(host[p + "post_attention_layernorm.weight"]),
            mlp=self.load_mlp(i, p, host),
        )
        if type(layer.mlp) is DenseMLPWeights:
            mlp = layer.mlp
            layer.dense_block = MLPBlock(
                layer.post_norm,
                mlp.gate_up,
                mlp.down,
                self.config.rms_norm_eps,
                mlp.gate_up_bias,
                mlp.down_bias,
            )
        return layer

    def _qkv_rows(self, attn: str, kind: str, host: dict[str, Any]) -> tuple[Any, Any, Any]:
        """This rank's q, k and v rows (column-parallel by heads) of a layer's weights or biases."""
        return (
            self.qk_head_rows(host[f"{attn}q_proj.{kind}"], self.q_heads),
            self.qk_head_rows(host[f"{attn}k_proj.{kind}"], self.kv_heads),
            take_head_rows(host[f"{attn}v_proj.{kind}"], self.kv_heads, self.head_dim),
        )

    def kv_cache_layers(self) -> int:
        return len(self.layer_ids)

    def kv_cache_heads(self) -> int:
        return self.num_kv_heads

    # --- LoRA ---------------------------------------------------------------------------------
    def lora_projections(self) -> dict[str, LoRAProjection]:
        """q/k/v and o on every layer, gate/up and down where every layer's MLP is dense; none
        under tensor parallelism or in a subclass that rewrites weights or the layer itself
        (where an adapter's rows would not line up with the weights)."""
        own = type(self)
        if (
            self.parallel.tp_size != 1
            or own.layer_forward is not LlamaForCausalLM.layer_forward
            or own.preprocess_weights is not LlamaForCausalLM.preprocess_weights
        ):
            return {}
        hidden, q_rows = self.config.hidden_size, self.num_heads * self.head_dim
        kv_rows = self.num_kv_heads * self.head_dim
        projections = {
            "qkv": LoRAProjection(hidden, (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows))),
            "o_proj": LoRAProjection(q_rows, (("o_proj", hidden),)),
        }
        if self.layers and all(layer.dense_block is not None for layer in self.layers):
            inner = self.config.intermediate_size
            projections["gate_up"] = LoRAProjection(hidden, (("gate_proj", inner), ("up_proj", inner)))
            projections["down"] = LoRAProjection(inner, (("down_proj", hidden),))
        return projections

    def lora_b_rows(self, part: str, b: Any) -> Any:
        """q and k rows in the layout `qk_head_rows` gives the weights."""
        if part == "q_proj":
            return self.qk_head_rows(b, self.q_heads)
        if part == "k_proj":
            return self.qk_head_rows(b, self.kv_heads)
        return b

    # --- forward ------------------------------------------------------------------------------
    def layer_forward(
        self,
        layer: LlamaLayerWeights,
        hidden: Any,
        residual: Any | None,
        positions: Any,
        cos: Any,
        sin: Any,
        batch: Any,
        kv_cache: Any,
        lora: LayerLoRA | None = None,
    ) -> tuple[Any, Any]:
        """One decoder layer: (its output, the residual stream); `cos`/`sin` are the rotary tables
        `positions` index (a model with its own positions passes its own). With `lora` (a pass
        with adapters) the halves run op by op with the adapters' products added."""
        ops, parallel = self.backend, self.parallel
        if lora is None:
            hidden, residual = ops.attention_block(
                hidden, residual, layer.attention, positions, cos, sin, batch, kv_cache
            )
        else:
            hidden, residual = lora_attention_block(
                ops, hidden, residual, layer.attention, positions, cos, sin, batch, kv_cache, lora
            )
        hidden = parallel.all_reduce(hidden)
        if layer.dense_block is not None and lora is not None:
            hidden, residual = lora_mlp_block(ops, hidden, residual, layer.dense_block, lora)
        elif layer.dense_block is not None:
            hidden, residual = ops.mlp_block(hidden, residual, layer.dense_block)
        else:
            normed, residual = ops.rms_norm(hidden, layer.post_norm, self.config.rms_norm_eps, residual)
            hidden = self.mlp_block(layer, normed)
        return parallel.all_reduce(hidden), residual

    def _dense_layers(self) -> list[tuple[AttentionBlock, MLPBlock]] | None:
        """The (attention, MLP) pairs of this rank's layers when they can run as one
        `decoder_layers` call (every one dense, no tensor parallelism, so no all-reduce between
        halves, and `layer_forward` as written here); None otherwise."""
        plain = type(self).layer_forward is LlamaForCausalLM.layer_forward and self.parallel.tp_size == 1
        if not plain or not self.layers or any(layer.dense_block is None for layer in self.layers):
            return None
        return [(layer.attention, layer.dense_block) for layer in self.layers]

    def forward(
        self, input_ids: Any, positions: Any, batch: Any, kv_caches: list[Any], lora: list[Any] | None = None
    ) -> Any:
        """With `lora` (one `LayerLoRA` per layer: a pass with adapters), layer by layer."""
        ops = self.backend
        parallel = self.parallel
        residual = None
        if parallel.is_first_stage:
            hidden = parallel.vocab_embedding(ops, input_ids, self.embed_tokens)
        else:
            shape = (input_ids.shape[0], self.config.hidden_size)
            hidden = parallel.recv_from_previous_stage(ops, shape)
            residual = parallel.recv_from_previous_stage(ops, shape)
        # a batch per KV-cache group (sliding and global layers): each layer takes its group's
        if lora is not None:
            for layer, kv_cache, adapters in zip(self.layers, kv_caches, lora, strict=True):
                hidden, residual = self.layer_forward(
                    layer,
                    hidden,
                    residual,
                    positions,
                    self.rope_cos,
                    self.rope_sin,
                    layer_batch(batch, layer.attention.window),
                    kv_cache,
                    adapters,
                )
        elif self.dense_layers is not None and not isinstance(batch, GroupedBatch):
            hidden, residual = ops.decoder_layers(
                hidden, residual, self.dense_layers, positions, self.rope_cos, self.rope_sin, batch, kv_caches
            )
        else:
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                hidden, residual = self.layer_forward(
                    layer,
                    hidden,
                    residual,
                    positions,
                    self.rope_cos,
                    self.rope_sin,
                    layer_batch(batch, layer.attention.window),
                    kv_cache,
                )
        if not parallel.is_last_stage:
            parallel.send_to_next_stage(hidden)
            parallel.send_to_next_stage(residual)
            return None
        normed, _ = ops.rms_norm(hidden, self.final_norm, self.config.rms_norm_eps, residual)
        return normed

    def compute_logits(self, hidden: Any) -> Any:
        logits = self.backend.linear(hidden, self.lm_head, self.lm_head_bias)
        return self.parallel.gather_vocab(logits, self.config.vocab_size)


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return {"LlamaForCausalLM": LlamaForCausalLM, "MistralForCausalLM": LlamaForCausalLM}
