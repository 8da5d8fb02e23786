"""Engine configuration: the model's shape (from its checkpoint) and the user's engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastdeploy import envs
from fastdeploy.engine_args import GENERATION_CONFIG_MODES, RUNNERS, EngineArgs
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.speculative_config import parse_speculative_config

#: bytes of one cached element of each KV cache type (`KVCacheSpec.dtype`; numpy may not know bfloat16)
KV_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
#: `kv_cache_dtype` values: "auto" caches in the compute dtype (`LLM(dtype=...)`)
KV_CACHE_DTYPES = ("auto", *KV_ITEM_BYTES)
#: `quantization` values: weight-only quantisation of a float checkpoint at load
#: (`model_executor/quantization.py` says what each becomes)
QUANTIZATION_NAMES = ("wint8", "wint4", "fp8")
#: `quantization_group_size` values (wint4 on the cuda backend)
QUANTIZATION_GROUP_SIZES = (64, 128)


def check_quantization_name(value: Any) -> None:
    """Raise InvalidArgumentError unless `value` is None or a known quantisation."""
    if value is not None and value not in QUANTIZATION_NAMES:
        raise InvalidArgumentError(
            f"quantization must be one of {', '.join(QUANTIZATION_NAMES)} (or None for the checkpoint's own "
            f"weights); got {value!r}"
        )


@dataclass
class ModelConfig:
    """A model's hyper-parameters, in Hugging Face `config.json` terms.

    Weight loaders translate other formats (GGUF metadata) into these names, so model classes
    read one vocabulary of fields. `raw` keeps the whole dict for architecture-specific fields.
    """

    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    eos_token_ids: list[int]
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_hf_dict(cls, config: dict[str, Any]) -> ModelConfig:
        """Build from a config.json dict; missing or malformed fields are named in the error."""
        if not isinstance(config, dict):
            raise InvalidArgumentError(f"config.json must be a JSON object, got {type(config).__name__}")
        architectures = config.get("architectures") or []
        if not isinstance(architectures, list) or not architectures:
            raise InvalidArgumentError(
                "config.json has no 'architectures' list; cannot tell which model to build"
            )

        def size(name: str, default: Any = None) -> int:
            """A positive int field (required unless a default is given)."""
            value = config.get(name)
            value = default if value is None else value
            if value is None:
                raise InvalidArgumentError(f"config.json lacks the required field {name!r}")
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or int(value) != value
                or value < 1
            ):
                raise InvalidArgumentError(f"config.json: {name} must be a positive integer, got {value!r}")
            return int(value)

        heads = size("num_attention_heads")
        hidden = size("hidden_size")
        eos = config.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        return cls(
            architecture=architectures[0],
            hidden_size=hidden,
            num_hidden_layers=size("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=size("num_key_value_heads", heads),
            head_dim=size("head_dim", hidden // heads),
            intermediate_size=size("intermediate_size"),
            vocab_size=size("vocab_size"),
            max_position_embeddings=size("max_position_embeddings", 2048),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            rope_scaling=config.get("rope_scaling"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            eos_token_ids=eos_ids,
            raw=dict(config),
        )


def check_data_parallel_size(value: Any) -> None:
    """data_parallel_size is an int >= 1 (replicas of the whole engine)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"data_parallel_size must be an int >= 1 (engine replicas), got {value!r}")


def port_number(name: str, value: Any) -> int | None:
    """A TCP port given as an int or a string of digits (FastDeploy passes ports as strings)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise InvalidArgumentError(f"{name} must be a TCP port number (1-65535), got {value!r}")
    return value


def parse_ips(ips: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """Host addresses from a comma list (FastDeploy's form) or a sequence; () when not given."""
    if ips is None:
        return ()
    if not isinstance(ips, (str, list, tuple)) or not all(isinstance(item, str) for item in ips):
        raise InvalidArgumentError(f"ips must be a comma list or a list of host addresses (str), got {ips!r}")
    items = ips.split(",") if isinstance(ips, str) else list(ips)
    hosts = tuple(str(item).strip() for item in items if str(item).strip())
    if isinstance(ips, str) and ips.strip() and not hosts:
        raise InvalidArgumentError(f"ips must be a comma list of host addresses, got {ips!r}")
    return hosts


def _positive_int(name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")


@dataclass
class EngineConfig(EngineArgs):
    """The engine options (`EngineArgs`: `LLM(...)`'s keywords, the CLI / server flags) validated
    at construction, the environment's defaults and FastDeploy's argument forms resolved."""

    def __post_init__(self) -> None:
        self._resolve()
        for name in (
            "max_model_len",
            "max_num_batched_tokens",
            "kv_cache_memory",
            "num_gpu_blocks_override",
            "cpu_threads",
        ):
            _positive_int(name, getattr(self, name))
        for name in ("max_num_seqs", "block_size"):
            _positive_int(name, getattr(self, name), allow_none=False)
        self._check_parallel()
        if self.block_size & (self.block_size - 1):
            raise InvalidArgumentError(f"block_size must be a power of two, got {self.block_size}")
        utilization = self.gpu_memory_utilization
        if utilization is not None and (
            isinstance(utilization, bool)
            or not isinstance(utilization, (int, float))
            or not 0 < utilization <= 1
        ):
            raise InvalidArgumentError(
                f"gpu_memory_utilization must be a number in (0, 1], got {utilization!r}"
            )
        if not isinstance(self.device, str) or not self.device:
            raise InvalidArgumentError(
                f"device must be a backend name such as 'auto' or 'cpu', got {self.device!r}"
            )
        if not isinstance(self.enforce_eager, bool):
            raise InvalidArgumentError(f"enforce_eager must be a bool, got {self.enforce_eager!r}")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise InvalidArgumentError(
                f"async_scheduling must be a bool or None (the backend's choice), got {self.async_scheduling!r}"
            )
        if not isinstance(self.enable_prefix_caching, bool):
            raise InvalidArgumentError(
                f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}"
            )
        check_quantization_name(self.quantization)
        if self.quantization_group_size not in QUANTIZATION_GROUP_SIZES:
            raise InvalidArgumentError(
                f"quantization_group_size must be one of {', '.join(map(str, QUANTIZATION_GROUP_SIZES))}; "
                f"got {self.quantization_group_size!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidArgumentError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {self.kv_cache_dtype!r}"
            )
        if self.generation_config not in GENERATION_CONFIG_MODES:
            raise InvalidArgumentError(
                f"generation_config must be one of {', '.join(GENERATION_CONFIG_MODES)}; "
                f"got {self.generation_config!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise InvalidArgumentError(f"seed must be an int in [0, 2**63), got {self.seed!r}")
        if self.mm_processor_kwargs is not None and not isinstance(self.mm_processor_kwargs, dict):
            raise InvalidArgumentError(
                f"mm_processor_kwargs must be a dict such as {{'image_max_pixels': 802816}}, got "
                f"{type(self.mm_processor_kwargs).__name__}"
            )
        if not isinstance(self.allowed_local_media_path, (bool, str)):
            raise InvalidArgumentError(
                "allowed_local_media_path must be a directory (str) or a bool, got "
                f"{type(self.allowed_local_media_path).__name__}"
            )
        if (
            isinstance(self.max_logprobs, bool)
            or not isinstance(self.max_logprobs, int)
            or self.max_logprobs < -1
        ):
            raise InvalidArgumentError(f"max_logprobs must be an int >= -1, got {self.max_logprobs!r}")
        self._check_speculative()
        self._check_async_scheduling()
        self._check_runner()

    def _resolve(self) -> None:
        """The forms `LLM(...)` and FastDeploy accept, in the one form the engine reads; unset
        values from the environment."""
        if self.device is None:
            self.device = envs.device() or "auto"
        if self.cpu_threads is None:
            self.cpu_threads = envs.cpu_threads()
        if self.dist_init_timeout is None:
            self.dist_init_timeout = envs.dist_init_timeout()
        self.ips = ",".join(parse_ips(self.ips)) or None
        self.engine_worker_queue_port = port_number("engine_worker_queue_port", self.engine_worker_queue_port)
        if self.allowed_local_media_path is None:  # any local file (offline use)
            self.allowed_local_media_path = True
        elif self.allowed_local_media_path == "":  # none
            self.allowed_local_media_path = False

    def async_scheduling_blocker(self) -> str | None:
        """Why each pass's tokens must reach the host before the next pass is built here (so
        steps cannot overlap), or None."""
        if self.speculative_config is not None:
            return (
                "async_scheduling=True cannot be combined with speculative_config: the drafts of "
                "the next pass are proposed from the tokens of the last one"
            )
        if self.runs_in_rank_processes:
            return (
                "async_scheduling=True is not supported when the model runs in rank processes "
                "(tensor or pipeline parallelism): the ranks send every pass's logits to the engine"
            )
        return None

    def _check_async_scheduling(self) -> None:
        """async_scheduling=True where steps cannot overlap is refused (None then means off)."""
        blocker = self.async_scheduling_blocker() if self.async_scheduling else None
        if blocker is not None:
            raise InvalidArgumentError(blocker)

    def _check_runner(self) -> None:
        """`runner` is known; the pooling runner (one process, no sampling) refuses what it lacks."""
        if self.runner not in RUNNERS:
            raise InvalidArgumentError(f"runner must be one of {', '.join(RUNNERS)}; got {self.runner!r}")
        if self.pooler_config is not None and not isinstance(self.pooler_config, dict):
            raise InvalidArgumentError(
                f"pooler_config must be a dict such as {{'pooling_type': 'LAST'}}, got "
                f"{type(self.pooler_config).__name__}"
            )
        if self.runner != "pooling":
            if self.pooler_config is not None:
                raise InvalidArgumentError("pooler_config applies to runner='pooling' only")
            return
        if self.runs_in_rank_processes:
            raise InvalidArgumentError(
                "runner='pooling' runs the model in the engine process: tensor_parallel_size and "
                "pipeline_parallel_size 1, no ips, distributed_executor_backend not 'mp'"
            )
        if self.speculative_config is not None:
            raise InvalidArgumentError(
                "runner='pooling' samples no tokens: speculative_config does not apply"
            )

    def _check_speculative(self) -> None:
        """Parse `speculative_config`; the parallel layouts it cannot run with are refused here."""
        self.speculative_config = parse_speculative_config(self.speculative_config)
        if self.speculative_config is None:
            return
        if self.pipeline_parallel_size > 1:
            raise InvalidArgumentError(
                "speculative_config is not supported with pipeline_parallel_size > 1 (a verify pass "
                "needs the logits of every draft position, which pipeline stages do not hand back)"
            )
        if self.speculative_config.method == "draft_model" and self.runs_in_rank_processes:
            raise InvalidArgumentError(
                "speculative_config method 'draft_model' runs the draft model in the engine process; "
                "it is not supported when the model runs in rank processes (tensor or pipeline "
                "parallelism); use method 'ngram'"
            )

    def _check_parallel(self) -> None:
        """Sizes of the parallel layout; whether the model can take them is checked once its
        config is read (`fastdeploy.parallel.topology.check_layout`)."""
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
        check_data_parallel_size(self.data_parallel_size)
        if self.distributed_executor_backend not in (None, "uni", "mp"):
            raise InvalidArgumentError(
                "distributed_executor_backend must be 'uni' (in the engine process) or 'mp' (rank "
                f"processes), got {self.distributed_executor_backend!r}"
            )
        world = self.tensor_parallel_size * self.pipeline_parallel_size
        if world > 1 and self.distributed_executor_backend == "uni":
            raise InvalidArgumentError(
                f"distributed_executor_backend='uni' runs one rank, but tensor_parallel_size x "
                f"pipeline_parallel_size = {world}; use 'mp'"
            )
        if isinstance(self.dist_init_timeout, bool) or not isinstance(self.dist_init_timeout, (int, float)):
            raise InvalidArgumentError(
                f"dist_init_timeout must be a number of seconds, got {self.dist_init_timeout!r}"
            )
        if self.dist_init_timeout <= 0:
            raise InvalidArgumentError(
                f"dist_init_timeout must be > 0 seconds, got {self.dist_init_timeout!r}"
            )

    @property
    def runs_in_rank_processes(self) -> bool:
        """Whether the model runs in rank processes rather than in the engine process."""
        world = self.tensor_parallel_size * self.pipeline_parallel_size
        return world > 1 or self.distributed_executor_backend == "mp" or bool(self.ips)
