"""The device backend contract: a platform part, an ops part and optional capabilities.

Models call only the ops, so one model file runs on every backend. The engine touches device
arrays only through a backend: it allocates the KV cache, hands the model a batch layout, and
gets logits back as host numpy arrays for sampling.

- `platform.Platform`: identity, availability and why not, device count, rank environment,
  communicator, memory;
- `ops.DeviceOps`: the primitives a model calls (abstract: every backend implements them);
- `capabilities.Capability`: optional features, declared in `Backend.capabilities` and queried
  with `Backend.supports`; each is a group of methods below with a portable default (`fused`,
  `portable`) that runs, and is logged once, where a backend does not declare it.

Backends written against the 0.1 contract (flags and overrides, no `capabilities`) keep working:
`legacy.legacy_capabilities` reads their declaration from them (deprecated until 0.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from fastdeploy.backends import fused, portable
from fastdeploy.backends.capabilities import (
    CAPABILITY_SPECS,
    Capability,
    implemented_methods,
    note_fallback,
)
from fastdeploy.backends.fused import AttentionBlock, MLPBlock
from fastdeploy.backends.legacy import legacy_capabilities
from fastdeploy.backends.lora import LoRAStack
from fastdeploy.backends.ops import DeviceOps
from fastdeploy.backends.platform import Platform
from fastdeploy.backends.portable import apply_token_bitmask_numpy
from fastdeploy.backends.types import (
    BackendOptions,
    BatchLayout,
    KVCacheSpec,
    PendingTokens,
)
from fastdeploy.config import KV_CACHE_DTYPES, KV_ITEM_BYTES

#: the names this module has always offered (importers of the 0.1 contract use them)
__all__ = [
    "KV_CACHE_DTYPES",
    "KV_ITEM_BYTES",
    "AttentionBlock",
    "Backend",
    "BackendOptions",
    "BatchLayout",
    "Capability",
    "KVCacheSpec",
    "MLPBlock",
    "PendingTokens",
    "apply_token_bitmask_numpy",
]


def _declares(backend_class: type) -> bool:
    """Whether `backend_class` or a base below `Backend` declares `capabilities` itself (rather
    than having it read from 0.1-style signs by the adapter)."""
    for klass in backend_class.__mro__:
        if klass is Backend:
            return False
        if "capabilities" in vars(klass) and not vars(klass).get("_capabilities_from_legacy", False):
            return True
    return False


class Backend(Platform, DeviceOps):
    """A device backend; subclasses are registered through `fastdeploy_device_backends`.

    A vendor implements this class (the abstract methods of `Platform` and `DeviceOps`), declares
    the optional `capabilities` it implements, returns it from a `fastdeploy_device_backends`
    hook under its device name, and checks it with the conformance suite
    (`fastdeploy.backends.conformance`); see docs/plugins.md.
    """

    #: the optional features this backend implements itself; every other one runs its portable
    #: default (or is refused where there is none). Query with `supports`, never by inspecting
    #: methods.
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    #: deprecated (until 0.3), read-only mirrors of `capabilities` for 0.1 callers: whether
    #: `Capability.DEVICE_SAMPLING` / `Capability.OVERLAPS_HOST` is declared. A 0.1 backend that
    #: sets them without declaring `capabilities` has them read into it.
    samples_on_device: ClassVar[bool] = False
    overlaps_host: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _declares(cls):
            declared = frozenset(cls.capabilities)
            # checked where declared (a subclass may put a portable default back on purpose)
            for capability in declared if "capabilities" in vars(cls) else ():
                if not implemented_methods(cls, Backend, capability):
                    raise TypeError(
                        f"{cls.__qualname__} declares Capability.{capability.name} but implements none of "
                        f"its methods ({', '.join(CAPABILITY_SPECS[capability].methods)})"
                    )
        else:
            declared = legacy_capabilities(cls, Backend)
            cls._capabilities_from_legacy = True
        cls.capabilities = declared
        cls.samples_on_device = Capability.DEVICE_SAMPLING in declared
        cls.overlaps_host = Capability.OVERLAPS_HOST in declared

    @classmethod
    def supports(cls, capability: Capability) -> bool:
        """Whether this backend implements `capability` itself (the one way to ask)."""
        return capability in cls.capabilities

    def __init__(self, options: BackendOptions) -> None:
        self.options = options

    def _fallback(self, capability: Capability) -> None:
        """Called by each portable default: logs once per class where it stands in for a
        capability the backend does not declare."""
        if capability not in self.capabilities:
            note_fallback(type(self), capability)

    # --- Capability.FUSED_DECODER_LAYERS: a decoder layer's halves (fused ops; portable default: `fused`) ---
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
        self._fallback(Capability.FUSED_DECODER_LAYERS)
        return fused.attention_block(self, x, residual, block, positions, cos, sin, batch, kv_cache)

    def mlp_block(self, x: Any, residual: Any | None, block: MLPBlock) -> tuple[Any, Any]:
        """A decoder layer's SwiGLU half on x [tokens, hidden]: returns (the down projection
        [tokens, hidden], this rank's partial sum under tensor parallelism; x + residual)."""
        self._fallback(Capability.FUSED_DECODER_LAYERS)
        return fused.mlp_block(self, x, residual, block)

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
        self._fallback(Capability.FUSED_DECODER_LAYERS)
        return fused.decoder_layers(self, x, residual, layers, positions, cos, sin, batch, kv_caches)

    # --- Capability.FUSED_MOE: mixture of experts (portable default: host grouping) --------------
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
        self._fallback(Capability.FUSED_MOE)
        return portable.moe_route(self, router_logits, top_k, correction_bias, renormalize, norm_min)

    def moe_expert_weights(self, gate: list[np.ndarray], up: list[np.ndarray], down: list[np.ndarray]) -> Any:
        """Device weights of a layer's routed experts from per-expert [out, in] host matrices.

        The result is opaque to models and only passed back to `moe_experts`; the default is a
        list of (fused gate/up, down) `linear_weight`s.
        """
        self._fallback(Capability.FUSED_MOE)
        return portable.moe_expert_weights(self, gate, up, down)

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
        self._fallback(Capability.FUSED_MOE)
        return portable.moe_experts(self, x, experts, topk_weights, topk_ids, first_expert)

    # --- Capability.DEVICE_ROW_REDUCTIONS: per-row reductions of device logits -------------------
    def argmax_rows(self, logits: Any) -> np.ndarray:
        """Greedy tokens: the index of each row's largest logit (the first among equals), as a
        host int64 array. Accelerators override it to copy one id per row instead of the logits."""
        self._fallback(Capability.DEVICE_ROW_REDUCTIONS)
        return portable.argmax_rows(self, logits)

    def nonfinite_rows(self, logits: Any) -> np.ndarray:
        """Host bool [rows]: rows of device logits [rows, vocab] that cannot be sampled from.

        A row is broken when it holds a NaN or +inf, or only -inf (a -inf entry alone is a
        masked token, which is fine); that is, when the row's maximum is not finite (NumPy's max
        propagates NaN). The engine checks every pass's logits and fails only the requests whose
        rows are broken. The default copies the logits to the host; accelerators that sample on
        the device should override it with an on-device max (one value per row crosses).
        """
        self._fallback(Capability.DEVICE_ROW_REDUCTIONS)
        return portable.nonfinite_rows(self, logits)

    # --- Capability.TOKEN_BITMASK: guided decoding -----------------------------------------------
    def apply_token_bitmask(self, logits: Any, bitmask: np.ndarray, rows: np.ndarray) -> Any:
        """Forbid tokens in some rows of device logits [num_rows, vocab] (guided decoding).

        `bitmask` is a host int32 array [len(rows), ceil(vocab / 32)]: token t stays allowed in
        row `rows[i]` when bit `t % 32` of `bitmask[i, t // 32]` is 1, and its logit becomes -inf
        otherwise; rows not in `rows` are untouched. Returns the logits (the same array, changed
        in place, or a new one). The engine calls it before penalties and sampling. The default
        round-trips through the host (`to_numpy`, `from_numpy`); accelerators override it to
        unpack the bits on the device.
        """
        self._fallback(Capability.TOKEN_BITMASK)
        return portable.apply_token_bitmask(self, logits, bitmask, rows)

    # --- Capability.ATTENTION_SINKS (no portable default) ----------------------------------------
    def attention_with_sinks(
        self, q: Any, k: Any, v: Any, kv_cache: Any, batch: Any, scale: float, sinks: Any, window: int = 0
    ) -> Any:
        """`attention` with attention sinks: `sinks` [heads] float32 (this backend's array) are
        per-head logits that join each query's softmax denominator and weigh no value:

            p_j = exp(s_j - m) / (sum_i exp(s_i - m) + exp(sink_h - m)),  m = max(max_i s_i, sink_h)

        so a head may attend to nothing. GPT-OSS needs it; a backend without it cannot run such
        models (they are refused when built). `window` > 0 (GPT-OSS's sliding layers, passed only
        by a backend that also declares `Capability.SLIDING_WINDOW`) limits each query to its
        last `window` positions, as `windowed_attention` does.
        """
        raise NotImplementedError(f"the {self.name} backend has no attention with sinks")

    # --- Capability.VISION_OPS: vision encoders --------------------------------------------------
    def encoder_attention(self, q: Any, k: Any, v: Any, cu_seqlens: np.ndarray, scale: float) -> Any:
        """Bidirectional attention within segments: q/k/v [tokens, heads, head_dim] -> same shape.

        Tokens `cu_seqlens[i]:cu_seqlens[i+1]` (one image, or one video frame) attend to each other
        only; no KV cache. Softmax in float32. The default runs on the host with numpy.
        """
        self._fallback(Capability.VISION_OPS)
        return portable.encoder_attention(self, q, k, v, cu_seqlens, scale)

    def encoder_attention_qkv(
        self, qkv: Any, cos: Any, sin: Any, cu_seqlens: np.ndarray, heads: int, scale: float
    ) -> Any:
        """A vision tower's attention from its fused projection: qkv [tokens, 3 * heads * head_dim]
        (q, k, v side by side) -> [tokens, heads * head_dim]. q and k are rotated first (rotate-half,
        with per-token cos/sin rows [tokens, rotary_dim / 2], as `rotary_embedding` at positions
        0..tokens-1); then `encoder_attention`. The default runs those ops; a backend may read the
        projection in place and rotate inside the attention call (the cpu backend does), without
        the copies of q, k and v slices the ops need."""
        self._fallback(Capability.VISION_OPS)
        return portable.encoder_attention_qkv(self, qkv, cos, sin, cu_seqlens, heads, scale)

    def quick_gelu(self, x: Any) -> Any:
        """x * sigmoid(1.702 x) (CLIP's and ERNIE-4.5-VL's vision MLP activation)."""
        self._fallback(Capability.VISION_OPS)
        return portable.quick_gelu(self, x)

    def gelu(self, x: Any) -> Any:
        """Exact GELU, x * Phi(x) with the error function (PyTorch's default `nn.GELU()`).

        erf comes from Abramowitz & Stegun 7.1.26 in float64 (absolute error < 1.5e-7, below
        float32's resolution of the result).
        """
        self._fallback(Capability.VISION_OPS)
        return portable.gelu(self, x)

    def merge_rows(self, parts: list[tuple[Any, np.ndarray]], num_rows: int) -> Any:
        """A new [num_rows, ...] array whose rows `indices` come from `rows` for each (rows, indices)
        part; the parts' indices cover every row once. Used to put image embeddings among text
        embeddings and to join the text and vision experts' outputs."""
        self._fallback(Capability.VISION_OPS)
        return portable.merge_rows(self, parts, num_rows)

    # --- Capability.OVERLAPS_HOST: async scheduling ----------------------------------------------
    def greedy_tokens(self, logits: Any) -> PendingTokens:
        """Greedy tokens and broken rows (`argmax_rows`, `nonfinite_rows`) of device logits
        [rows, vocab], for async scheduling: the tokens stay on the device for the next pass and
        reach the host without waiting for it. An accelerator starts the copies on its queue
        and returns at once; this default computes both now."""
        self._fallback(Capability.OVERLAPS_HOST)
        return portable.greedy_tokens(self, logits)

    def feed_tokens(
        self, input_ids: np.ndarray, rows: np.ndarray, pending: PendingTokens, sources: np.ndarray
    ) -> Any:
        """Device input ids of a pass whose rows `rows` take tokens a pass still in flight
        sampled: `input_ids` (host int64, -1 in those rows) with `input_ids[rows[i]]` set to
        `pending.device[sources[i]]`. An accelerator does this on its queue; this default reads
        the pending tokens."""
        self._fallback(Capability.OVERLAPS_HOST)
        return portable.feed_tokens(self, input_ids, rows, pending, sources)

    # --- Capability.GRAPH_CAPTURE (no portable default) ----------------------------------------
    def decode_graphs(
        self, model: Any, kv_caches: list[Any], block_size: int, max_num_seqs: int, max_model_len: int
    ) -> Any | None:
        """Captured decode steps (CUDA graphs) for the model runner, or None (the default): an
        object whose `run(layout, input_ids)` returns the logits of a decode-only step, or None to
        run it eagerly. Called once after the KV cache is allocated, unless `enforce_eager`.

        An object that also samples (the cuda backend's `DecodeGraphs`) has
        `run(layout, input_ids, sampling)` return (logits, `PendingTokens`) for `SamplingRows`,
        and `sample_eager(logits, sampling)` for eager passes; the runner then lets passes sample
        themselves (`engine/pass_sampling.py`: one device-to-host copy per step)."""
        return None

    # --- Capability.KV_BLOCK_COPY (no portable default) ----------------------------------------
    def copy_kv_blocks(self, kv_caches: list[Any], pairs: np.ndarray, block_size: int) -> None:
        """For each row (source, destination) of `pairs` [n, 2] int64, copy every layer's keys and
        values of block `source` (its `block_size` slots) over block `destination`, in place.

        Needed for beam search, whose beams share KV blocks copy-on-write: a beam about to write
        into a block its siblings hold gets a copy first. Sources and destinations are disjoint.
        A backend without it cannot serve beam search (requests asking for it are refused).
        """
        raise NotImplementedError(f"the {self.name} backend cannot copy KV blocks")

    # --- Capability.LORA (no portable default) ---------------------------------------------------
    def lora_stack(
        self, slots: int, rank: int, in_features: int, out_features: int, parts: Sequence[int] = ()
    ) -> LoRAStack:
        """Zeroed device stacks for one projection's adapters: a [slots, in, rank], b [slots,
        rank, out] in the compute dtype (`backends/lora.py`). `parts`, for a fused projection,
        are its parts' output widths: part p owns rank columns p * rank / len(parts) onwards of A
        and the matching block of B (B is block-diagonal), which a backend may store and multiply
        by blocks."""
        raise NotImplementedError(f"the {self.name} backend does not run LoRA adapters")

    def set_lora_slot(self, stack: LoRAStack, slot: int, a: np.ndarray, b: np.ndarray) -> None:
        """Put one adapter in `slot` of `stack`: host float32 a [in, rank] and b [rank, out] (the
        adapter's scale already in b; zeros where it does not target the projection)."""
        raise NotImplementedError(f"the {self.name} backend does not run LoRA adapters")

    def lora_rows(self, token_slots: np.ndarray) -> Any:
        """The backend's form of one pass's adapter rows, from host int64 [tokens] slots (-1: the
        base model); passed to every `add_lora` of the pass."""
        raise NotImplementedError(f"the {self.name} backend does not run LoRA adapters")

    def add_lora(self, y: Any, x: Any, stack: LoRAStack, rows: Any) -> Any:
        """y [tokens, out] plus, for each row with an adapter, (x[row] @ a[slot]) @ b[slot], for x
        [tokens, in]; rows of one adapter are computed together (one shrink and one expand per
        adapter in the pass). Returns y (changed in place, or a new array)."""
        raise NotImplementedError(f"the {self.name} backend does not run LoRA adapters")

    # --- Capability.KV_BLOCK_TRANSFER (no portable default) -------------------------------------
    def read_kv_blocks(self, kv_caches: list[Any], blocks: np.ndarray, block_size: int) -> list[np.ndarray]:
        """Host copies of KV blocks `blocks` (int64 ids), in the transfer layout
        (`fastdeploy.kv_layout.BLOCK_MAJOR`): per layer keys and values [len(blocks), block_size,
        kv_heads, head_dim] in the cache's element type (bfloat16 as its uint16 bits), then, for
        an int8 cache, their float32 scales [len(blocks), block_size, kv_heads].

        Needed by a prefill instance (`--splitwise-role prefill`), which sends them to a decode
        instance. Called on the engine thread after the pass that computed them.
        """
        raise NotImplementedError(f"the {self.name} backend cannot read KV blocks out")

    def write_kv_blocks(
        self, kv_caches: list[Any], blocks: np.ndarray, arrays: list[np.ndarray], block_size: int
    ) -> None:
        """Write `arrays` (as `read_kv_blocks` returns them) over KV blocks `blocks`, in place.
        Needed by a decode instance (`--splitwise-role decode`)."""
        raise NotImplementedError(f"the {self.name} backend cannot write KV blocks in")

    # --- Capability.SLIDING_WINDOW: sliding-window attention (no portable default) ---------------
    def windowed_attention(
        self, q: Any, k: Any, v: Any, kv_cache: Any, batch: Any, scale: float, window: int
    ) -> Any:
        """`attention` where each query token at position p sees only positions p - window + 1 .. p
        (transformers' sliding-window mask), for the sliding layers of Gemma 3, Mistral, Phi-3 and
        Mixtral past their window. Table entries of blocks wholly before the window may alias
        other blocks (the block manager released them): what they hold must not change the result.
        `AttentionBlock.window` > 0 routes a fused layer here. A backend without it runs such
        models only with max_model_len no longer than the window.
        """
        raise NotImplementedError(f"the {self.name} backend has no sliding-window attention")

    # --- Capability.ATTENTION_SOFTCAP: attention logit soft-capping (no portable default) --------
    def softcapped_attention(
        self,
        q: Any,
        k: Any,
        v: Any,
        kv_cache: Any,
        batch: Any,
        scale: float,
        softcap: float,
        window: int = 0,
    ) -> Any:
        """`attention` whose scores s = scale * q.k become softcap * tanh(s / softcap) before the
        causal mask and the softmax (Gemma 2's `attn_logit_softcapping`: no score reaches softcap).
        `window` > 0 (Gemma 2's sliding layers past their window, passed only by a backend that also
        declares `Capability.SLIDING_WINDOW`) limits each query to its last `window` positions, as
        `windowed_attention` does. `AttentionBlock.softcap` > 0 routes a fused layer here. A backend
        without it cannot run such models (they are refused when built).
        """
        raise NotImplementedError(f"the {self.name} backend has no attention logit soft-capping")

    def softcap(self, x: Any, cap: float) -> Any:
        """cap * tanh(x / cap), elementwise: Gemma 2's `final_logit_softcapping` of its logits. The
        default round-trips through the host (`to_numpy`, `from_numpy`); the cpu backend's arrays
        are host arrays already."""
        host = self.to_numpy(x).astype(np.float32, copy=False)
        return self.from_numpy(np.float32(cap) * np.tanh(host / np.float32(cap)))

    # --- Capability.LATENT_ATTENTION (no portable default) ---------------------------------------
    def latent_attention(
        self,
        q_nope: Any,
        q_rope: Any,
        latent: Any,
        k_rope: Any,
        kv_cache: Any,
        batch: Any,
        absorb_k: Any,
        absorb_v: Any,
        scale: float,
    ) -> Any:
        """Multi-head latent attention (DeepSeek-V2/V3) over a cache of `KVCacheSpec.kind` "latent".

        Each token's cache slot gets its latent [tokens, lora] (the normed compressed KV) followed
        by its rotated rotary key k_rope [tokens, rope], one vector of lora + rope. Head h's key at
        a cached position is (latent @ absorb_k[h].T, k_rope) and its value latent @ absorb_v[h].T,
        with absorb_k [heads, nope, lora] and absorb_v [heads, v_dim, lora] (the rows of the
        checkpoint's `kv_b_proj`). Queries are q_nope [tokens, heads, nope] and the rotated q_rope
        [tokens, heads, rope]; causal softmax(q.k * scale) over each sequence's cache, as
        `attention`. Returns [tokens, heads, v_dim].

        How is the backend's choice: expanding the cached latents to per-head keys and values
        (cheap for prefill, where many queries share them), or absorbing absorb_k into the
        queries and absorb_v into the output, which reads the latents directly (decode: one query
        per sequence, and no per-head keys are ever formed). Both give the same results.
        """
        raise NotImplementedError(f"the {self.name} backend has no multi-head latent attention")

    # --- Capability.DEVICE_SAMPLING (no portable default) ----------------------------------------
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
