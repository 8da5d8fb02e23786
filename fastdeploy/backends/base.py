"""The device backend interface: arrays, KV memory and the ops models are written against.

Models call only these ops, so one model file runs on every backend. The engine touches device
arrays only through a backend: it allocates the KV cache, hands the model a batch layout, and
gets logits back as host numpy arrays for sampling.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class BackendOptions:
    """Settings a user can give any backend."""

    #: worker threads for host compute (None: every core this process may run on)
    threads: int | None = None
    #: data type for weights and activations; "auto" is replaced by the backend's
    #: `resolve_default_dtype()` before the backend is built
    dtype: str = "float32"

    def thread_count(self) -> int:
        """`threads`, or the cores this process may run on (its CPU affinity, which containers and
        `taskset` narrow; `os.cpu_count()` would count the whole host)."""
        if self.threads:
            return self.threads
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1


#: bytes of one cached element, for `KVCacheSpec.dtype` names numpy may not know (bfloat16)
KV_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
#: `kv_cache_dtype` values: "auto" caches in the compute dtype (`LLM(dtype=...)`)
KV_CACHE_DTYPES = ("auto", *KV_ITEM_BYTES)


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV cache: `num_blocks` blocks of `block_size` token slots per layer."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float32"

    def bytes_per_block(self) -> int:
        """Bytes one block takes across all layers, keys and values (int8: with a float32 scale per
        position and kv head)."""
        itemsize = KV_ITEM_BYTES.get(self.dtype) or np.dtype(self.dtype).itemsize
        per_position = self.head_dim * itemsize + (4 if self.dtype == "int8" else 0)
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * per_position


@dataclass
class BatchLayout:
    """Host-side description of one forward pass, built by the model runner.

    Tokens of all scheduled sequences are flattened in sequence order: sequence `i` contributes
    `query_lens[i]` tokens, whose positions end at `context_lens[i] - 1`.
    """

    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64: KV slot each token's key/value is written to
    query_lens: np.ndarray  # [num_seqs] int64
    context_lens: np.ndarray  # [num_seqs] int64: tokens in the cache after this pass
    block_tables: np.ndarray  # [num_seqs, max_blocks] int64, padded with 0
    logits_indices: np.ndarray  # [num_logits] int64: token rows whose logits are needed
    block_size: int
    #: [n, 2] int64 (source, destination) KV blocks the model runner copies before the pass
    #: (`Backend.copy_kv_blocks`: beams that share blocks copy-on-write)
    block_copies: np.ndarray = field(default_factory=lambda: np.empty((0, 2), dtype=np.int64))


def apply_token_bitmask_numpy(logits: np.ndarray, bitmask: np.ndarray, rows: np.ndarray) -> None:
    """In place: `logits[rows[i], t] = -inf` wherever bit t of `bitmask[i]` is 0 (host reference).

    `bitmask` is int32 [len(rows), ceil(vocab / 32)], bits packed little-endian: token t is
    allowed when bit `t % 32` of word `t // 32` is set.
    """
    vocab = logits.shape[-1]
    packed = np.ascontiguousarray(bitmask, dtype=np.int32).view(np.uint8)
    allowed = np.unpackbits(packed, axis=-1, bitorder="little")[:, :vocab].astype(bool)
    for row, keep in zip(rows.tolist(), allowed, strict=True):
        np.copyto(logits[row], -np.inf, where=~keep)


@dataclass(eq=False)
class AttentionBlock:
    """A decoder layer's attention half, computed by `Backend.attention_block`: RMSNorm of
    (x + residual), the fused q/k/v projection, per-head q/k RMSNorm where given (Qwen3), the
    rotate-half rotary embedding, paged attention, the output projection.

    Weights are this backend's arrays (`linear_weight`, `linear_bias`, `from_numpy`). `qkv`
    stacks the rows of the q heads, then the k heads, then the v heads (`num_heads` and
    `num_kv_heads` of this rank); the q and k rows are in the rotate-half layout.
    """

    input_norm: Any
    qkv: Any
    o_proj: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    #: of the input RMSNorm and the per-head q/k norms
    eps: float
    #: attention softmax scale (usually head_dim ** -0.5)
    scale: float
    qkv_bias: Any | None = None
    o_bias: Any | None = None
    #: per-head RMSNorm weights [head_dim] of queries and keys, applied before rotary (both or neither)
    q_norm: Any | None = None
    k_norm: Any | None = None
    #: the backend's own form of the block (e.g. its kernels' arguments), made at first use
    prepared: Any = field(default=None, repr=False, compare=False)


@dataclass(eq=False)
class MLPBlock:
    """A decoder layer's SwiGLU half, computed by `Backend.mlp_block`: RMSNorm of (x + residual),
    the fused gate/up projection (gate rows first), silu(gate) * up, the down projection."""

    norm: Any
    gate_up: Any
    down: Any
    eps: float
    gate_up_bias: Any | None = None
    down_bias: Any | None = None
    #: the backend's own form of the block (e.g. its kernels' arguments), made at first use
    prepared: Any = field(default=None, repr=False, compare=False)


class PendingTokens:
    """Greedy tokens of a pass on their way to the host (async scheduling, `Backend.greedy_tokens`).

    `device` holds the tokens on the device ([rows] int64): the next pass reads its inputs from
    there before the host has them. `wait()` blocks until the pass is done and returns the host
    tokens and the rows `Backend.nonfinite_rows` marks (host bool [rows]).
    """

    def __init__(self, device: Any, wait: Callable[[], tuple[np.ndarray, np.ndarray]]) -> None:
        self.device = device
        self._wait = wait

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        return self._wait()


class Backend(ABC):
    """A device backend; subclasses are registered through `fastdeploy_device_backends`.

    A vendor implements this class (every abstract method below), returns it from a
    `fastdeploy_device_backends` hook under its device name, and checks it with the conformance
    suite (`fastdeploy.backends.conformance`); see docs/plugins.md.
    """

    #: the device name users pass as `device=`
    name: ClassVar[str]
    #: `device="auto"` picks the available backend with the highest priority
    auto_priority: ClassVar[int] = 0
    #: whether the engine hands `sample_top_k_top_p` the device logits (else it samples on the host)
    samples_on_device: ClassVar[bool] = False
    #: the `fastdeploy_communicators` entry whose collectives ranks of this backend use
    #: (tensor / pipeline parallelism); `FD_COMMUNICATOR` overrides it
    communicator: ClassVar[str] = "paddle"
    #: the dtype `dtype="auto"` (the default) means on this backend
    default_dtype: ClassVar[str] = "float32"
    #: tokens one step may compute when `max_num_batched_tokens` is not set (at least
    #: max_model_len): more tokens per step amortise a step's fixed cost (kernel launches) on
    #: accelerators, fewer keep a host backend's steps short
    default_max_num_batched_tokens: ClassVar[int] = 2048
    #: passes run on a device queue while the host goes on (an accelerator's stream), so the
    #: engine schedules and launches step N+1 before it reads step N's tokens (async
    #: scheduling: `greedy_tokens` and `feed_tokens`); host backends compute as they are called,
    #: where overlapping gains nothing
    overlaps_host: ClassVar[bool] = False

    @classmethod
    def resolve_default_dtype(cls) -> str:
        """What `dtype="auto"` becomes here (e.g. float16 on a GPU without bfloat16)."""
        return cls.default_dtype

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when this backend can run here, else what is missing (shown to users)."""
        return None

    @classmethod
    def default_communicator(cls) -> str:
        """The communicator this backend's ranks use: `communicator`, unless the backend picks
        one at run time (a backend over paddle or torch tensors names the matching runtime)."""
        return cls.communicator

    @classmethod
    def device_count(cls) -> int | None:
        """Devices of this kind a host offers its ranks, one each (see `rank_environment`); None for
        a host backend, whose ranks share the host's cores and memory."""
        return None

    @classmethod
    def rank_environment(cls, local_rank: int) -> dict[str, str]:
        """Environment variables that give the rank process with host index `local_rank` its own
        device (set before the process imports anything); host backends need none."""
        return {}

    @classmethod
    def runtime_details(cls) -> str | None:
        """How an available backend will run here (kernels, instruction set), for `fastdeploy env`."""
        return None

    def __init__(self, options: BackendOptions) -> None:
        self.options = options

    def describe(self) -> str:
        """One line for logs: the device and its settings."""
        return self.name

    def supported_kv_cache_dtypes(self) -> tuple[str, ...]:
        """The KV-cache element types `kv_cache_dtype` may name here (default: the compute dtype only).

        `allocate_kv_cache` then gets `KVCacheSpec.dtype` set to one of them, and `attention` must
        write and read the cache in it.
        """
        return (self.options.dtype,)

    def supported_quantizations(self) -> tuple[str, ...]:
        """The `LLM(quantization=...)` values this backend runs (default: none).

        A quantised checkpoint reaches `linear_weight` as `GGMLTensor` parts (GGML Q8_0 / Q4_1
        blocks; `np.asarray` dequantises them); a backend lists a quantisation here when it keeps
        those blocks and multiplies by them directly. See fastdeploy/model_executor/quantization.py.
        """
        return ()

    # --- memory ---------------------------------------------------------------------------
    @abstractmethod
    def free_memory_bytes(self) -> int:
        """Memory available for the KV cache now (after weights are loaded)."""

    @abstractmethod
    def allocate_kv_cache(self, spec: KVCacheSpec) -> list[Any]:
        """One opaque KV-cache object per layer, passed back to `attention`."""

    def kv_cache_budget_bytes(self, utilization: float, profile_forward: Callable[[], Any]) -> int | None:
        """Bytes the KV cache may take, measured with a profiling run; None: use free memory.

        Accelerators override this: they run `profile_forward` (one forward pass over the largest
        batch the engine will schedule) to learn the peak activation memory, then grant the cache
        `utilization` x total device memory minus the weights and that peak, as FastDeploy does
        with `gpu_memory_utilization`. Host backends return None and the planner takes
        `utilization` x `free_memory_bytes()`.
        """
        return None

    # --- data movement --------------------------------------------------------------------
    @abstractmethod
    def from_numpy(self, array: np.ndarray) -> Any:
        """Device array holding `array` (converted to the backend dtype if floating)."""

    @abstractmethod
    def to_numpy(self, array: Any) -> np.ndarray:
        """Host float32/int64 copy (or view) of a device array."""

    @abstractmethod
    def linear_weight(self, *parts: np.ndarray) -> Any:
        """Device weight for `linear` from [out, in] matrices stacked along `out` (fused projections)."""

    def encoder_linear_weight(self, *parts: np.ndarray) -> Any:
        """`linear_weight` for a vision encoder's linear layers (default: the same). A backend may
        keep these in another precision on request (the cpu backend's `FD_CPU_VISION_MATMUL`):
        an encoder runs once per image, so its products are large and arithmetic-bound."""
        return self.linear_weight(*parts)

    @abstractmethod
    def linear_bias(self, *parts: np.ndarray) -> Any:
        """Device bias for `linear` from 1-D parts concatenated (matching `linear_weight`'s fusion)."""

    @abstractmethod
    def prepare_batch(self, layout: BatchLayout) -> Any:
        """Backend-specific attention metadata for one forward pass, shared by all layers."""

    # --- ops --------------------------------------------------------------------------------
    @abstractmethod
    def embedding(self, token_ids: Any, table: Any) -> Any:
        """Rows of `table` for `token_ids`: [num_tokens, hidden]."""

    @abstractmethod
    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        """x @ W.T (+ bias) for a weight built by `linear_weight`."""

    @abstractmethod
    def rms_norm(self, x: Any, weight: Any, eps: float, residual: Any | None = None) -> tuple[Any, Any]:
        """RMSNorm of (x + residual); returns (normed, new residual)."""

    @abstractmethod
    def rotary_embedding(self, x: Any, positions: Any, cos: Any, sin: Any) -> Any:
        """Rotate-half (NeoX / HF Llama) rotary embedding of x [tokens, heads, head_dim]."""

    @abstractmethod
    def silu_and_mul(self, x: Any) -> Any:
        """silu(x[:, :d]) * x[:, d:] for x [tokens, 2d]."""

    @abstractmethod
    def layer_norm(
        self, x: Any, weight: Any, bias: Any | None, eps: float, residual: Any | None = None
    ) -> tuple[Any, Any]:
        """LayerNorm (mean and variance over the last axis) of (x + residual); (normed, new residual)."""

    @abstractmethod
    def gelu_tanh(self, x: Any) -> Any:
        """GELU with the tanh approximation (GPT-2's `gelu_new`, PyTorch's approximate="tanh")."""

    @abstractmethod
    def attention(self, q: Any, k: Any, v: Any, kv_cache: Any, batch: Any, scale: float) -> Any:
        """Write k/v into the paged cache, then causal attention of q over each sequence's cache.

        q [tokens, heads, head_dim], k/v [tokens, kv_heads, head_dim]; grouped-query attention when
        heads > kv_heads. Returns [tokens, heads, head_dim].
        """

    @abstractmethod
    def gather_rows(self, x: Any, indices: Any) -> Any:
        """x[indices] along the token axis."""

    # --- a decoder layer's halves (concrete defaults from the ops above; backends fuse them) ----
    def attention_block(
        self,
        x: Any,
        residual: Any | None,
        block: AttentionBlock,
        positions: Any,
        cos: Any,
        sin: Any,
        batch: Any,
        kv_cache: Any,
    ) -> tuple[Any, Any]:
        """A decoder layer's attention half on hidden states x [tokens, hidden]: returns (the output
        projection [tokens, hidden], x + residual). Under tensor parallelism the output is this
        rank's partial sum. `cos`/`sin` [rows, rotary_dim / 2] are the rotary tables `positions`
        index. The default runs the ops one by one; a backend that fuses them must give the same
        results."""
        normed, residual = self.rms_norm(x, block.input_norm, block.eps, residual)
        qkv = self.linear(normed, block.qkv, block.qkv_bias)
        tokens, dim = qkv.shape[0], block.head_dim
        q_size, kv_size = block.num_heads * dim, block.num_kv_heads * dim
        q = qkv[:, :q_size].reshape(tokens, block.num_heads, dim)
        k = qkv[:, q_size : q_size + kv_size].reshape(tokens, block.num_kv_heads, dim)
        v = qkv[:, q_size + kv_size :].reshape(tokens, block.num_kv_heads, dim)
        if block.q_norm is not None:
            q = self.rms_norm(q.reshape(-1, dim), block.q_norm, block.eps)[0].reshape(tokens, -1, dim)
            k = self.rms_norm(k.reshape(-1, dim), block.k_norm, block.eps)[0].reshape(tokens, -1, dim)
        q = self.rotary_embedding(q, positions, cos, sin)
        k = self.rotary_embedding(k, positions, cos, sin)
        out = self.attention(q, k, v, kv_cache, batch, block.scale)
        return self.linear(out.reshape(tokens, q_size), block.o_proj, block.o_bias), residual

    def mlp_block(self, x: Any, residual: Any | None, block: MLPBlock) -> tuple[Any, Any]:
        """A decoder layer's SwiGLU half on x [tokens, hidden]: returns (the down projection
        [tokens, hidden], this rank's partial sum under tensor parallelism; x + residual)."""
        normed, residual = self.rms_norm(x, block.norm, block.eps, residual)
        up = self.silu_and_mul(self.linear(normed, block.gate_up, block.gate_up_bias))
        return self.linear(up, block.down, block.down_bias), residual

    def decoder_layers(
        self,
        x: Any,
        residual: Any | None,
        layers: Sequence[tuple[AttentionBlock, MLPBlock]],
        positions: Any,
        cos: Any,
        sin: Any,
        batch: Any,
        kv_caches: Sequence[Any],
    ) -> tuple[Any, Any]:
        """A run of whole decoder layers without tensor parallelism, each its `attention_block`
        (with its cache in `kv_caches`) then its `mlp_block`: returns (the last layer's output,
        the residual stream after it). The default calls those two layer by layer; a backend may
        run the whole run in one call (the cpu backend does) and must give the same results.
        `layers` and `kv_caches` are the same objects on every call of one model."""
        for (attention, mlp), kv_cache in zip(layers, kv_caches, strict=True):
            x, residual = self.attention_block(x, residual, attention, positions, cos, sin, batch, kv_cache)
            x, residual = self.mlp_block(x, residual, mlp)
        return x, residual

    def argmax_rows(self, logits: Any) -> np.ndarray:
        """Greedy tokens: the index of each row's largest logit (the first among equals), as a
        host int64 array. Accelerators override it to copy one id per row instead of the logits."""
        return np.asarray(self.to_numpy(logits)).argmax(axis=-1).astype(np.int64)

    # --- mixture of experts (concrete defaults; backends override them for speed) -------------
    def moe_route(
        self,
        router_logits: Any,
        top_k: int,
        correction_bias: Any | None = None,
        renormalize: bool = True,
        norm_min: float = 0.0,
    ) -> tuple[Any, Any]:
        """Softmax top-k routing: (weights [tokens, top_k] float32, expert ids [tokens, top_k] int64).

        Probabilities are softmax(router_logits) over the experts, in float32. The experts are the
        top_k of probabilities + `correction_bias` (ERNIE-4.5's `e_score_correction_bias`: it
        balances which experts are chosen), but their weights are the unbiased probabilities,
        renormalised to sum 1 over the chosen ones when `renormalize` (the sum clamped below at
        `norm_min`). The default runs on the host through `to_numpy`/`from_numpy`.
        """
        logits = np.asarray(self.to_numpy(router_logits), dtype=np.float32)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        scores = probs
        if correction_bias is not None:
            scores = probs + np.asarray(self.to_numpy(correction_bias), dtype=np.float32).reshape(1, -1)
        ids = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
        weights = np.take_along_axis(probs, ids, axis=-1)
        if renormalize:
            weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(norm_min))
        return self.from_numpy(weights.astype(np.float32)), self.from_numpy(ids.astype(np.int64))

    def moe_expert_weights(self, gate: list[np.ndarray], up: list[np.ndarray], down: list[np.ndarray]) -> Any:
        """Device weights of a layer's routed experts from per-expert [out, in] host matrices.

        The result is opaque to models and only passed back to `moe_experts`; the default is a
        list of (fused gate/up, down) `linear_weight`s.
        """
        return [
            (self.linear_weight(g, u), self.linear_weight(d)) for g, u, d in zip(gate, up, down, strict=True)
        ]

    def moe_experts(
        self, x: Any, experts: Any, topk_weights: Any, topk_ids: Any, first_expert: int = 0
    ) -> Any:
        """Routed SwiGLU experts: sum over k of weights[t, k] * expert_{ids[t, k]}(x[t]), [tokens, hidden].

        `experts` (from `moe_expert_weights`) are the experts numbered `first_expert`,
        `first_expert + 1`, ...; (token, k) pairs routed to other experts add nothing here (expert
        parallelism: each rank holds a slice of the experts, and the ranks' results are summed).
        Tokens are grouped by expert so each active expert runs one matmul pair over all its
        tokens. The default does the grouping and the final scatter-add on the host and the
        matmuls with `gather_rows`, `linear` and `silu_and_mul`.
        """
        ids = np.asarray(self.to_numpy(topk_ids), dtype=np.int64) - first_expert
        weights = np.asarray(self.to_numpy(topk_weights), dtype=np.float32).reshape(-1)
        top_k = ids.shape[1]
        flat = ids.reshape(-1)
        flat = np.where(
            (flat >= 0) & (flat < len(experts)), flat, len(experts)
        )  # others: one bin past the end
        order = np.argsort(flat, kind="stable")
        counts = np.bincount(flat, minlength=len(experts) + 1)[: len(experts)]
        result: np.ndarray | None = None
        start = 0
        for expert in np.flatnonzero(counts):
            end = start + int(counts[expert])
            picks = order[start:end]
            rows = picks // top_k
            gate_up, down = experts[expert]
            hidden = self.linear(
                self.silu_and_mul(self.linear(self.gather_rows(x, self.from_numpy(rows)), gate_up)), down
            )
            contribution = self.to_numpy(hidden) * weights[picks][:, None]
            if result is None:
                result = np.zeros((ids.shape[0], contribution.shape[1]), dtype=np.float32)
            np.add.at(result, rows, contribution)
            start = end
        if result is None:  # no token chose these experts
            result = np.zeros(self.to_numpy(x).shape, dtype=np.float32)
        return self.from_numpy(result)

    # --- guided decoding ---------------------------------------------------------------------
    def apply_token_bitmask(self, logits: Any, bitmask: np.ndarray, rows: np.ndarray) -> Any:
        """Forbid tokens in some rows of device logits [num_rows, vocab] (guided decoding).

        `bitmask` is a host int32 array [len(rows), ceil(vocab / 32)]: token t stays allowed in
        row `rows[i]` when bit `t % 32` of `bitmask[i, t // 32]` is 1, and its logit becomes -inf
        otherwise; rows not in `rows` are untouched. Returns the logits (the same array, changed
        in place, or a new one). The engine calls it before penalties and sampling. The default
        round-trips through the host (`to_numpy`, `from_numpy`); accelerators override it to
        unpack the bits on the device.
        """
        host = np.array(self.to_numpy(logits), dtype=np.float32)
        apply_token_bitmask_numpy(host, bitmask, rows)
        return self.from_numpy(host)

    # --- vision encoders (concrete defaults on the host; backends override them for speed) -------
    def encoder_attention(self, q: Any, k: Any, v: Any, cu_seqlens: np.ndarray, scale: float) -> Any:
        """Bidirectional attention within segments: q/k/v [tokens, heads, head_dim] -> same shape.

        Tokens `cu_seqlens[i]:cu_seqlens[i+1]` (one image, or one video frame) attend to each other
        only; no KV cache. Softmax in float32. The default runs on the host with numpy.
        """
        qs, ks, vs = (np.asarray(self.to_numpy(t), dtype=np.float32) for t in (q, k, v))
        out = np.empty_like(qs)
        for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
            qh, kh, vh = (t[start:end].transpose(1, 0, 2) for t in (qs, ks, vs))
            scores = (qh @ kh.transpose(0, 2, 1)) * np.float32(scale)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            out[start:end] = (scores @ vh).transpose(1, 0, 2)
        return self.from_numpy(out)

    def encoder_attention_qkv(
        self, qkv: Any, cos: Any, sin: Any, cu_seqlens: np.ndarray, heads: int, scale: float
    ) -> Any:
        """A vision tower's attention from its fused projection: qkv [tokens, 3 * heads * head_dim]
        (q, k, v side by side) -> [tokens, heads * head_dim]. q and k are rotated first (rotate-half,
        with per-token cos/sin rows [tokens, rotary_dim / 2], as `rotary_embedding` at positions
        0..tokens-1); then `encoder_attention`. The default runs those ops; a backend may read the
        projection in place and rotate inside the attention call (the cpu backend does), without
        the copies of q, k and v slices the ops need."""
        rows, width = qkv.shape
        if width % (3 * heads):
            raise ValueError(f"qkv's width {width} is not 3 x heads ({heads}) x head_dim")
        hidden = width // 3
        qk = qkv[:, : 2 * hidden].reshape(rows, 2 * heads, hidden // heads)
        qk = self.rotary_embedding(qk, self.from_numpy(np.arange(rows, dtype=np.int64)), cos, sin)
        v = qkv[:, 2 * hidden :].reshape(rows, heads, hidden // heads)
        out = self.encoder_attention(qk[:, :heads], qk[:, heads:], v, cu_seqlens, scale)
        return out.reshape(rows, hidden)

    def quick_gelu(self, x: Any) -> Any:
        """x * sigmoid(1.702 x) (CLIP's and ERNIE-4.5-VL's vision MLP activation)."""
        h = np.asarray(self.to_numpy(x), dtype=np.float32)
        return self.from_numpy(h / (np.float32(1.0) + np.exp(np.float32(-1.702) * h)))

    def gelu(self, x: Any) -> Any:
        """Exact GELU, x * Phi(x) with the error function (PyTorch's default `nn.GELU()`).

        erf comes from Abramowitz & Stegun 7.1.26 in float64 (absolute error < 1.5e-7, below
        float32's resolution of the result).
        """
        h = np.asarray(self.to_numpy(x), dtype=np.float64)
        z = np.abs(h) / np.sqrt(2.0)
        t = 1.0 / (1.0 + 0.3275911 * z)
        poly = t * (
            0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
        )
        erf = np.sign(h) * (1.0 - poly * np.exp(-z * z))
        return self.from_numpy((0.5 * h * (1.0 + erf)).astype(np.float32))

    def merge_rows(self, parts: list[tuple[Any, np.ndarray]], num_rows: int) -> Any:
        """A new [num_rows, ...] array whose rows `indices` come from `rows` for each (rows, indices)
        part; the parts' indices cover every row once. Used to put image embeddings among text
        embeddings and to join the text and vision experts' outputs."""
        first = np.asarray(self.to_numpy(parts[0][0]))
        out = np.empty((num_rows, *first.shape[1:]), dtype=first.dtype)
        for rows, indices in parts:
            out[indices] = self.to_numpy(rows)
        return self.from_numpy(out)

    # --- optional capabilities --------------------------------------------------------------
    def decode_graphs(
        self, model: Any, kv_caches: list[Any], block_size: int, max_num_seqs: int, max_model_len: int
    ) -> Any | None:
        """Captured decode steps (CUDA graphs) for the model runner, or None (the default): an
        object whose `run(layout)` returns the logits of a decode-only step, or None to run it
        eagerly. Called once after the KV cache is allocated, unless `enforce_eager`."""
        return None

    def nonfinite_rows(self, logits: Any) -> np.ndarray:
        """Host bool [rows]: rows of device logits [rows, vocab] that cannot be sampled from.

        A row is broken when it holds a NaN or +inf, or only -inf (a -inf entry alone is a
        masked token, which is fine); that is, when the row's maximum is not finite (NumPy's max
        propagates NaN). The engine checks every pass's logits and fails only the requests whose
        rows are broken. The default copies the logits to the host; accelerators that sample on
        the device should override it with an on-device max (one value per row crosses).
        """
        return ~np.isfinite(self.to_numpy(logits).max(axis=-1))

    def greedy_tokens(self, logits: Any) -> PendingTokens:
        """Greedy tokens and broken rows (`argmax_rows`, `nonfinite_rows`) of device logits
        [rows, vocab], for async scheduling: the tokens stay on the device for the next pass and
        reach the host without waiting for it. An accelerator starts the copies on its queue
        and returns at once; this default computes both now."""
        tokens = np.asarray(self.argmax_rows(logits), dtype=np.int64)
        nonfinite = np.asarray(self.nonfinite_rows(logits), dtype=bool)
        return PendingTokens(self.from_numpy(tokens), lambda: (tokens, nonfinite))

    def feed_tokens(
        self, input_ids: np.ndarray, rows: np.ndarray, pending: PendingTokens, sources: np.ndarray
    ) -> Any:
        """Device input ids of a pass whose rows `rows` take tokens a pass still in flight
        sampled: `input_ids` (host int64, -1 in those rows) with `input_ids[rows[i]]` set to
        `pending.device[sources[i]]`. An accelerator does this on its queue; this default reads
        the pending tokens."""
        ids = np.array(input_ids, dtype=np.int64)
        ids[rows] = np.asarray(self.to_numpy(pending.device), dtype=np.int64)[sources]
        return self.from_numpy(ids)

    def copy_kv_blocks(self, kv_caches: list[Any], pairs: np.ndarray, block_size: int) -> None:
        """For each row (source, destination) of `pairs` [n, 2] int64, copy every layer's keys and
        values of block `source` (its `block_size` slots) over block `destination`, in place.

        Needed for beam search, whose beams share KV blocks copy-on-write: a beam about to write
        into a block its siblings hold gets a copy first. Sources and destinations are disjoint.
        A backend without it cannot serve beam search (requests asking for it are refused).
        """
        raise NotImplementedError(f"the {self.name} backend cannot copy KV blocks")

    def sample_top_k_top_p(
        self,
        logits: Any,
        temperatures: np.ndarray,
        top_k: np.ndarray,
        top_p: np.ndarray,
        uniforms: np.ndarray,
    ) -> np.ndarray:
        """One token per row of device logits [rows, vocab], drawn on the device.

        Top-k (0 = off), then top-p on the top-k-renormalised mass (the smallest set of most
        likely tokens reaching `top_p`), then inverse CDF over the kept tokens in vocabulary
        order with `uniforms[row]`. Temperatures are > 0: the engine sends greedy rows, and rows
        that need penalties, bans, min-p or logprobs, to its host sampler instead. Called only
        when the backend declares `samples_on_device`.
        """
        raise NotImplementedError(f"the {self.name} backend does not sample on the device")
