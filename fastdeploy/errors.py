"""Exceptions fastdeploy raises, each carrying a message a user can act on."""

from __future__ import annotations


class FastDeployError(Exception):
    """Base class of fastdeploy's own errors."""


class InvalidArgumentError(FastDeployError, ValueError):
    """An argument has the wrong type or is out of range; the message names it."""


class PromptTooLongError(InvalidArgumentError):
    """A prompt that cannot fit in `max_model_len` tokens (the server's `context_length_exceeded`)."""


class ModelNotFoundError(FastDeployError, FileNotFoundError):
    """`model=` names neither a known model nor a readable path."""


class ModelDownloadError(FastDeployError, RuntimeError):
    """A model hub refused or could not finish a download (access, disk space, network, a missing
    hub package); the message names the model id and what to do."""


class UnsupportedModelError(FastDeployError, ValueError):
    """No registered plugin handles this model's architecture or file format."""


class BackendUnavailableError(FastDeployError, RuntimeError):
    """A registered device backend cannot run on this machine; the message says what is missing."""


class PluginError(FastDeployError, RuntimeError):
    """Plugins conflict (two register the same name) or a requested plugin is not registered."""


class WeightLoadError(FastDeployError, ValueError):
    """A checkpoint lacks tensors the model needs, or has tensors it does not know."""


class DistributedInitError(FastDeployError, RuntimeError):
    """Ranks of a multi-process model cannot start or reach each other; the message says which and where."""


class KVCacheAllocationError(FastDeployError, MemoryError):
    """The device backend could not allocate the KV cache the engine planned; says how much."""


class EngineStoppedError(FastDeployError, RuntimeError):
    """The engine is shutting down (or has stopped, or its `LLM` was shut down) and takes no new requests."""


class EngineDeadError(FastDeployError, RuntimeError):
    """The engine cannot run any request any more (its device failed); every request in flight fails.

    The engine raises it when a forward pass fails for every request and a one-token probe pass
    fails too. A device backend may raise it from any op to say so at once (a lost device, a
    sticky accelerator error), skipping the per-request retries. The server answers /health with
    503 and exits with status 1.
    """


class WorkerFailedError(EngineDeadError):
    """A rank process of a multi-process model failed or died; the engine cannot go on.

    The message names the rank, how it ended and the last lines of its log.
    """
