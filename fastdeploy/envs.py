"""Environment variables that configure fastdeploy, read in one place.

Each getter reads the environment when called, so tests and launchers can change a variable
before building an `LLM` without re-importing the package.
"""

from __future__ import annotations

import os

from fastdeploy.errors import InvalidArgumentError


def log_dir() -> str:
    """Directory of `fastdeploy.log` (FastDeploy's `FD_LOG_DIR`, default `./log`)."""
    return os.environ.get("FD_LOG_DIR", "log")


def log_level() -> str:
    """Log level for fastdeploy's loggers (`FD_LOG_LEVEL`, default INFO)."""
    return os.environ.get("FD_LOG_LEVEL", "INFO").upper()


def enabled_plugins() -> list[str] | None:
    """Names of the third-party plugins to load (`FD_PLUGINS`, comma list); None means all."""
    value = os.environ.get("FD_PLUGINS")
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def device() -> str | None:
    """Device backend requested through `FD_DEVICE`, or None."""
    value = os.environ.get("FD_DEVICE", "").strip()
    return value or None


def cpu_threads() -> int | None:
    """Thread count for the cpu backend's kernels (`FD_CPU_THREADS`), or None for the cores the process may run on."""
    value = os.environ.get("FD_CPU_THREADS", "").strip()
    return int(value) if value else None


#: how long the cpu kernels' idle threads spin before sleeping, unless FD_CPU_SPIN_US says otherwise
DEFAULT_CPU_SPIN_US = 100.0


def cpu_spin_us() -> float:
    """Microseconds an idle thread of the cpu backend's kernels spins before it sleeps (`FD_CPU_SPIN_US`).

    Spinning bridges the gaps between the ~150 parallel loops of a decode step; sleeping after it
    leaves the cores to other processes. 0 sleeps at once (like `OMP_WAIT_POLICY=PASSIVE`).
    """
    value = os.environ.get("FD_CPU_SPIN_US", "").strip()
    if not value:
        return DEFAULT_CPU_SPIN_US
    try:
        spin = float(value)
    except ValueError:
        spin = -1.0
    if not 0 <= spin < 1e9:
        raise InvalidArgumentError(f"FD_CPU_SPIN_US must be a number of microseconds >= 0; got {value!r}")
    return spin


_SWITCH_VALUES = {
    "": True,
    "1": True,
    "true": True,
    "on": True,
    "yes": True,
    "0": False,
    "false": False,
    "off": False,
    "no": False,
}


def cpu_adaptive_threads() -> bool:
    """Whether the cpu kernels' default thread count follows the load (`FD_CPU_ADAPTIVE_THREADS`, default on).

    With the default count (no `FD_CPU_THREADS` / `cpu_threads`), the kernels' loops run on the count
    measured fastest lately: all cores on a quiet machine, one thread beside a CPU hog on two cores.
    An explicit thread count is always used as given.
    """
    value = os.environ.get("FD_CPU_ADAPTIVE_THREADS", "").strip().lower()
    if value not in _SWITCH_VALUES:
        raise InvalidArgumentError(f"FD_CPU_ADAPTIVE_THREADS must be 1 or 0 (on or off); got {value!r}")
    return _SWITCH_VALUES[value]


def cpu_activations() -> str:
    """What the cpu backend's quantised matmuls multiply activations in (`FD_CPU_ACTIVATIONS`).

    float32 (default): exact, the weights are dequantised in registers. int8: opt-in faster
    numerics, activations quantised per 32-value block to int8 and multiplied with integer dot
    products (AVX-512 VNNI or AVX2), as llama.cpp does, in every product of a GGUF block type,
    decode's one-row products included; a row's result does not depend on the rows beside it, so
    decode and prefill of a token agree. With quantization="wint8", int8 weights with a scale per
    output channel times activations quantised per 128 inputs (gemm_w8a8.c).
    """
    return os.environ.get("FD_CPU_ACTIVATIONS", "float32").strip().lower() or "float32"


def cpu_int8_dots() -> str:
    """The widest dot instruction the cpu backend's int8-activation products may use
    (`FD_CPU_INT8_DOTS`): auto (default: the widest this CPU has), avx512-vnni, avx-vnni or maddubs.

    A cap, for measuring what a CPU without the wider ones gets (maddubs: plain AVX2, e.g.
    Haswell..Skylake or Zen 1-3); every dot computes the same exact integers, so results do not change.
    """
    return os.environ.get("FD_CPU_INT8_DOTS", "auto").strip().lower() or "auto"


def cpu_vision_matmul() -> str:
    """What the cpu backend multiplies vision encoders' linear layers and attention products in
    (`FD_CPU_VISION_MATMUL`).

    float32 (default): exact. bfloat16: opt-in faster numerics, weights rounded to bfloat16 once at
    load and activations (queries, keys, values, probabilities) per product, products summed in
    float32 (AVX512_BF16's `vdpbf16ps` where the CPU has it, about twice the float32 rate).
    """
    return os.environ.get("FD_CPU_VISION_MATMUL", "float32").strip().lower() or "float32"


def cpu_kernels() -> str:
    """Kernels of the cpu backend (`FD_CPU_KERNELS`): auto, avx512, avx2 or numpy.

    auto: the native kernels on GGUF-quantised weights with the widest instruction set the CPU
    has, numpy where they are not built; numpy: dequantise every weight to float32 and use BLAS.
    """
    return os.environ.get("FD_CPU_KERNELS", "auto").strip().lower() or "auto"


def cuda_kernels() -> str:
    """Kernels of the cuda backend and its CPU twins (`FD_CUDA_KERNELS`, formerly
    `FD_PADDLE_KERNELS`): auto, triton or reference.

    auto: Triton on a GPU when triton is installed, the reference kernels otherwise (always on a
    CPU place, where Triton runs only under `TRITON_INTERPRET=1`).
    """
    value = os.environ.get("FD_CUDA_KERNELS") or os.environ.get("FD_PADDLE_KERNELS") or "auto"
    return value.strip().lower() or "auto"


def cuda_runtime() -> str | None:
    """Tensor framework of the cuda backend (`FD_CUDA_RUNTIME`): paddle or torch; None: paddle
    when paddlepaddle-gpu with CUDA is installed, else torch."""
    value = os.environ.get("FD_CUDA_RUNTIME", "").strip().lower()
    return value or None


def dist_init_timeout() -> float:
    """Seconds a rank process may take to reach the engine and the other ranks (`FD_DIST_INIT_TIMEOUT`,
    default 120): past it, starting fails with the address that could not be reached."""
    value = os.environ.get("FD_DIST_INIT_TIMEOUT", "").strip()
    return float(value) if value else 120.0


def dist_fork_server() -> bool:
    """Whether the ranks of a host backend on one host are forked by a fork server that imports
    their code once (`FD_DIST_FORK_SERVER`, default on; 0: each rank a fresh interpreter)."""
    value = os.environ.get("FD_DIST_FORK_SERVER", "").strip().lower()
    if value not in _SWITCH_VALUES:
        raise InvalidArgumentError(f"FD_DIST_FORK_SERVER must be 1 or 0 (on or off); got {value!r}")
    return _SWITCH_VALUES[value]


#: the hubs `FD_MODEL_SOURCE` may name (FastDeploy's spelling)
MODEL_SOURCES = ("HUGGINGFACE", "MODELSCOPE", "AISTUDIO")


def model_source() -> str:
    """Hub a model id (`org/name`) is downloaded from (`FD_MODEL_SOURCE`): HUGGINGFACE (default),
    MODELSCOPE or AISTUDIO."""
    value = os.environ.get("FD_MODEL_SOURCE", "").strip().upper() or "HUGGINGFACE"
    if value not in MODEL_SOURCES:
        raise InvalidArgumentError(
            f"FD_MODEL_SOURCE must be one of {', '.join(MODEL_SOURCES)}; got {value!r}"
        )
    return value


# huggingface_hub reads the HF_* variables once, when it is imported; these read them per call, so
# a variable set after `import fastdeploy` (or transformers) still applies.


def hf_endpoint() -> str | None:
    """The Hugging Face Hub's address (`HF_ENDPOINT`, e.g. a mirror); None: huggingface.co."""
    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or None


def hf_hub_offline() -> bool:
    """Whether hub models come from the local cache only (`HF_HUB_OFFLINE`, or `TRANSFORMERS_OFFLINE`)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def hf_hub_cache() -> str:
    """The Hugging Face cache directory: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    `$XDG_CACHE_HOME/huggingface/hub` (`~/.cache/huggingface/hub`)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return os.path.expanduser(explicit)
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return os.path.join(os.path.expanduser(home), "hub")


def weight_cache_dir() -> str | None:
    """Where the cpu backend keeps GGUF weights repacked for its kernels between starts
    (`FD_WEIGHT_CACHE`): a directory, default `$XDG_CACHE_HOME/fastdeploy/packed-weights`
    (`~/.cache/...`); `0` (or `off`) repacks at every start and writes nothing."""
    value = os.environ.get("FD_WEIGHT_CACHE", "").strip()
    if value.lower() in ("0", "off", "false", "no"):
        return None
    if value:
        return os.path.expanduser(value)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "fastdeploy", "packed-weights")


#: the weight cache's size limit unless FD_WEIGHT_CACHE_MAX_GB says otherwise: a 7-8B Q4_K_M GGUF
#: leaves 5-7 GB of entries (its blocks repacked plus its embedding in float32), so this keeps the
#: last three or so models started, while a disk of a few hundred GB is never filled by it
DEFAULT_WEIGHT_CACHE_MAX_GB = 20.0


def weight_cache_max_bytes() -> int:
    """The size the weight cache's entries may take together (`FD_WEIGHT_CACHE_MAX_GB`, in GB of
    10^9 bytes, default 20); the least recently used entries are evicted to stay within it, and 0
    turns the cache off."""
    value = os.environ.get("FD_WEIGHT_CACHE_MAX_GB", "").strip()
    if not value:
        return int(DEFAULT_WEIGHT_CACHE_MAX_GB * 1e9)
    try:
        limit = float(value)
    except ValueError:
        limit = -1.0
    if not 0 <= limit < 1e9:
        raise InvalidArgumentError(
            f"FD_WEIGHT_CACHE_MAX_GB must be a size in GB >= 0 (0 turns the weight cache off); got {value!r}"
        )
    return int(limit * 1e9)
