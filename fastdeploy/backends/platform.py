"""The platform part of the device contract: what a device is, whether it runs here, its memory.

Identity and configuration only: no tensor ops (those are `ops.DeviceOps`) and no engine
features (those are `capabilities.Capability`). The classmethods are cheap and never initialise
the device: `fastdeploy env`, `device="auto"` and the rank launcher call them before any backend
is built.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from fastdeploy.backends.types import BackendOptions

#: what `Platform.weight_layout` may answer (fastdeploy/model_executor/quantization.py makes them):
#: "ggml": GGML blocks (`GGMLTensor`: Q8_0 for wint8, Q4_1 for wint4, the head in Q8_0), a matrix
#: whose input width is not a multiple of 32 (the block) kept float;
#: "weight_only": `WeightOnlyTensor`s (wint8 per output channel, wint4 in groups, block FP8) of
#: every width;
#: "weight_only_32": `WeightOnlyTensor`s as "weight_only" where the input width is a multiple of
#: 32, float elsewhere as under "ggml" (the cpu backend's W8A8 kernel reads only those widths)
WEIGHT_LAYOUTS = ("ggml", "weight_only", "weight_only_32")


class Platform:
    """Identity, availability, device count, rank environment, communicator and memory."""

    # --- identity -------------------------------------------------------------------------
    #: the device name users pass as `device=`
    name: ClassVar[str]
    #: `device="auto"` picks the available backend with the highest priority
    auto_priority: ClassVar[int] = 0
    #: the `fastdeploy_communicators` entry whose collectives ranks of this backend use
    #: (tensor / pipeline parallelism); `FD_COMMUNICATOR` overrides it
    communicator: ClassVar[str] = "paddle"
    #: the dtype `dtype="auto"` (the default) means on this backend
    default_dtype: ClassVar[str] = "float32"
    #: tokens one step may compute when `max_num_batched_tokens` is not set (at least
    #: max_model_len): more tokens per step amortise a step's fixed cost (kernel launches) on
    #: accelerators, fewer keep a host backend's steps short
    default_max_num_batched_tokens: ClassVar[int] = 2048
    #: the host form `quantization=` gives linear weights here, the same for every method: "ggml"
    #: (GGML Q8_0 / Q4_1 blocks, `GGMLTensor`) or "weight_only" (`WeightOnlyTensor`: FastDeploy's
    #: wint8 / wint4, block FP8); the default of `weight_layout`, which may choose per method
    weight_packing: ClassVar[str] = "ggml"

    options: BackendOptions

    @classmethod
    def resolve_default_dtype(cls) -> str:
        """What `dtype="auto"` becomes here (e.g. float16 on a GPU without bfloat16)."""
        return cls.default_dtype

    # --- availability ---------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when this backend can run here, else what is missing (shown to users)."""
        return None

    @classmethod
    def runtime_details(cls) -> str | None:
        """How an available backend will run here (kernels, instruction set), for `fastdeploy env`."""
        return None

    def describe(self) -> str:
        """One line for logs: the device and its settings."""
        return self.name

    # --- ranks ----------------------------------------------------------------------------
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

    # --- what the user may ask for ----------------------------------------------------------
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
        those blocks and multiplies by them directly. Where `weight_layout(quantization)` is
        "weight_only" it gets `WeightOnlyTensor` parts instead (FastDeploy's wint8 / wint4 layouts,
        block FP8). See fastdeploy/model_executor/quantization.py.
        """
        return ()

    @classmethod
    def weight_layout(cls, quantization: str) -> str:
        """The form `quantization` (one of `supported_quantizations()`) gives linear weights here,
        one of `WEIGHT_LAYOUTS`; the loader asks this, never `weight_packing` directly.

        A backend whose kernels want different forms for different methods (the cpu backend:
        per-channel wint8 for its int8-activation kernels, GGML blocks otherwise) overrides it; the
        default is `weight_packing` for every method. A classmethod, so the builder can check a
        model's shapes against it before any backend is built.
        """
        return cls.weight_packing

    def quantization_refusal(self, quantization: str) -> str | None:
        """Why `quantization` cannot run here although this kind of backend runs it (the device
        lacks the instructions: FP8 before compute capability 8.9), or None. Joined to the
        refusal that lists `supported_quantizations()`."""
        return None

    def loaded_weights_summary(self) -> str | None:
        """One line on the weights this backend holds (bytes by storage format), logged after
        load; None: nothing to say."""
        return None

    # --- memory ---------------------------------------------------------------------------
    @abstractmethod
    def free_memory_bytes(self) -> int:
        """Memory available for the KV cache now (after weights are loaded)."""

    def total_memory_bytes(self) -> int | None:
        """All memory of the device this backend computes on (None: it cannot say), for logs and
        the profiling run's budget."""
        return None

    def kv_cache_budget_bytes(self, utilization: float, profile_forward: Callable[[], Any]) -> int | None:
        """Bytes the KV cache may take, measured with a profiling run; None: use free memory.

        Accelerators override this: they run `profile_forward` (one forward pass over the largest
        batch the engine will schedule) to learn the peak activation memory, then grant the cache
        `utilization` x total device memory minus the weights and that peak, as FastDeploy does
        with `gpu_memory_utilization`. Host backends return None and the planner takes
        `utilization` x `free_memory_bytes()`.
        """
        return None
